//! The background loader (I7-I11): a pool of threads that copies chunks from the
//! backing into RAM while foreground I/O is already served.
//!
//! One [`Loader`] can serve many objects (a file system has one per mount). Targets are kept
//! in a queue; a worker asks the front target for its next chunk (demanded chunks first,
//! then the sequential cursor, then retries that are due), so objects load one after
//! another in order, which keeps backing reads sequential. A target that has nothing left
//! leaves the queue and re-registers itself when new work appears (growth, invalidation,
//! demand).
//!
//! Lock order: object layout lock -> loader queue -> object load queue. The loader never
//! holds its queue lock while loading, and under it calls only `LoadTarget::next_job`,
//! which takes no layout lock (asserted in debug builds: `layout_lock::forbidden`). So an
//! object may call into the loader while it holds its layout lock shared, as a zero-copy
//! view does when its read is the first of a chunk read ahead (`on_ahead_hit`).
//!
//! Crash semantics: the loader only reads the backing; a crash during a load loses nothing.

use crate::units::ChunkIndex;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Default number of loader threads (each has one bulk read outstanding). Four reads in
/// flight loaded a cold 2 GiB file 1.4x to 1.6x faster than two on this project's test
/// machine (2 vCPUs, virtio disk; interleaved runs, 1.7/2.2 s against 2.7/3.1 s, with
/// `cp` into tmpfs at 2.9/2.5 s); the threads sleep at nice 10 once the load is done.
pub const LOADER_THREADS_DEFAULT: usize = 4;
pub const LOADER_THREADS_MAX: usize = 64;
/// Retry back-off for chunks that failed to load (I9): base, doubling, capped.
pub const LOAD_RETRY_BASE: Duration = Duration::from_millis(100);
pub const LOAD_RETRY_MAX: Duration = Duration::from_secs(30);
pub const LOAD_RETRY_ATTEMPTS_MAX: u32 = 10;

/// Background loader options (I8, I9).
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub threads: usize,
    /// Optional cap on the load rate.
    pub rate_bytes_per_s: Option<u64>,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub retry_attempts_max: u32,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            threads: LOADER_THREADS_DEFAULT,
            rate_bytes_per_s: None,
            retry_base: LOAD_RETRY_BASE,
            retry_max: LOAD_RETRY_MAX,
            retry_attempts_max: LOAD_RETRY_ATTEMPTS_MAX,
        }
    }
}

/// Why a chunk is being loaded: it decides whether the load may evict (cache mode) and
/// how it is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadKind {
    /// A read missed it (I10), or cache-mode admission let it in.
    Demand,
    /// Read-ahead (M2, M5).
    Ahead,
    /// The background pass in chunk order (I7); never evicts.
    Pass,
    /// A failed load again (I9).
    Retry,
}

/// What a target wants the loader to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextJob {
    Load(ChunkIndex, LoadKind),
    /// Nothing now; a retry becomes due at this instant.
    RetryAt(Instant),
    /// Nothing left to load.
    Idle,
    /// Zero RAM that left Loaded whose views have ended (never waits for a view: a load
    /// must not stop because some client is slow to take the bytes of one).
    Reclaim,
}

/// Outcome of one chunk load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadResult {
    Loaded {
        bytes: u64,
    },
    /// Already Loaded, past the end, or the object is closed.
    Skipped,
    /// The RAM budget is exhausted; the chunk stays Unloaded (I11).
    OverBudget,
    /// The backing read failed; the chunk stays Unloaded and is retried (I9).
    Failed,
}

pub(crate) trait LoadTarget: Send + Sync {
    fn target_id(&self) -> u64;
    fn next_job(&self, now: Instant) -> NextJob;
    fn load(&self, c: ChunkIndex, kind: LoadKind) -> LoadResult;
    fn reclaim(&self);
    fn chunk_bytes(&self) -> u64;
}

/// The targets with work, in the order they are served, each with its id; `ids` holds
/// exactly the ids of `targets` (a target is queued once).
struct Queue {
    targets: VecDeque<(u64, Weak<dyn LoadTarget>)>,
    ids: HashSet<u64>,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    cfg: LoaderConfig,
    rate_next_free: Mutex<Instant>,
    shutdown: AtomicBool,
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Threads exit on their own; joining here could join the current thread when the
        // last object is dropped on a loader thread.
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.cv.notify_all();
    }
}

/// A pool of loader threads, shareable by many objects. Dropping the last clone stops it.
#[derive(Clone)]
pub struct Loader {
    h: Arc<Handle>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("threads", &self.h.shared.cfg.threads)
            .finish()
    }
}

impl Loader {
    pub fn new(cfg: LoaderConfig) -> std::io::Result<Self> {
        let threads = cfg.threads.clamp(1, LOADER_THREADS_MAX);
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                targets: VecDeque::new(),
                ids: HashSet::new(),
            }),
            cv: Condvar::new(),
            cfg,
            rate_next_free: Mutex::new(Instant::now()),
            shutdown: AtomicBool::new(false),
        });
        for i in 0..threads {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("dhrd-load-{i}"))
                .spawn(move || worker(&s))?;
        }
        Ok(Self {
            h: Arc::new(Handle { shared }),
        })
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.h.shared.cfg
    }

    /// Adds a target at the back of the queue (no-op if queued already).
    pub(crate) fn register(&self, t: Weak<dyn LoadTarget>, id: u64) {
        let mut q = self.h.shared.q.lock();
        if q.ids.insert(id) {
            q.targets.push_back((id, t));
        }
        drop(q);
        // One worker; it wakes the next when it finds work (see `next_job`), so a target
        // with one chunk (most files) costs one wake-up, not one per thread.
        self.h.shared.cv.notify_one();
    }

    /// Moves a target to the front (a foreground request is waiting on its data).
    pub(crate) fn prioritize(&self, t: Weak<dyn LoadTarget>, id: u64) {
        let mut q = self.h.shared.q.lock();
        if q.ids.contains(&id) {
            if let Some(pos) = q.targets.iter().position(|(queued, _)| *queued == id) {
                if pos != 0 {
                    if let Some(w) = q.targets.remove(pos) {
                        q.targets.push_front(w);
                    }
                }
            }
        } else {
            q.ids.insert(id);
            q.targets.push_front((id, t));
        }
        drop(q);
        self.h.shared.cv.notify_one();
    }
}

fn next_job(s: &Shared) -> Option<(Arc<dyn LoadTarget>, NextJob)> {
    let mut q = s.q.lock();
    loop {
        if s.shutdown.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let mut wake_at: Option<Instant> = None;
        let mut i = 0;
        while i < q.targets.len() {
            let Some((id, t)) = q.targets.get(i).map(|(id, w)| (*id, w.upgrade())) else {
                break;
            };
            let Some(t) = t else {
                // Dropped while queued: its id leaves with it, or `ids` grows forever.
                q.ids.remove(&id);
                q.targets.remove(i);
                continue;
            };
            debug_assert_eq!(t.target_id(), id, "a target is queued under its own id");
            // Under the queue lock a target only looks at its load queue: a layout lock
            // taken here could wait for a view whose holder waits for this queue.
            match crate::layout_lock::forbidden(|| t.next_job(now)) {
                job @ (NextJob::Load(..) | NextJob::Reclaim) => {
                    // There may be more: pass the baton to one more worker, which goes
                    // back to sleep if there is not (no waiter makes this a no-op).
                    s.cv.notify_one();
                    return Some((t, job));
                }
                NextJob::RetryAt(at) => {
                    wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                    i += 1;
                }
                NextJob::Idle => {
                    q.ids.remove(&id);
                    q.targets.remove(i);
                }
            }
        }
        match wake_at {
            Some(at) => {
                s.cv.wait_until(&mut q, at);
            }
            None => s.cv.wait(&mut q),
        }
    }
}

fn rate_limit(s: &Shared, bytes: u64) {
    let Some(rate) = s.cfg.rate_bytes_per_s.filter(|r| *r > 0) else {
        return;
    };
    let start = {
        let mut next = s.rate_next_free.lock();
        let now = Instant::now();
        let start = (*next).max(now);
        *next = start + Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / rate);
        start
    };
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
    }
}

/// Nice value of loader threads: background loading yields the CPU to foreground
/// requests (on a 2-core machine two busy loader threads otherwise delay the very first
/// read, and more so the larger the object, since the loader has more chunks to walk).
const LOADER_NICE: libc::c_int = 10;

fn worker(s: &Shared) {
    // SAFETY: setpriority on this thread's own id; failure only leaves the default nice.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, LOADER_NICE);
    }
    while let Some((t, job)) = next_job(s) {
        match job {
            NextJob::Load(c, kind) => {
                rate_limit(s, t.chunk_bytes());
                let _ = t.load(c, kind);
            }
            NextJob::Reclaim => t.reclaim(),
            NextJob::RetryAt(_) | NextJob::Idle => {}
        }
    }
}

/// Test hook: pauses the loader on chosen chunks while they are in state Loading (the
/// chunk lock is held), so tests can drive the paper's cases deterministically.
#[derive(Default)]
pub struct LoadGate {
    m: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    paused: BTreeSet<u64>,
    reached: BTreeSet<u64>,
}

impl LoadGate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The loader will stop on chunk `c` once it has marked it Loading.
    pub fn pause(&self, c: ChunkIndex) {
        self.m.lock().paused.insert(c.0);
    }

    pub fn release(&self, c: ChunkIndex) {
        self.m.lock().paused.remove(&c.0);
        self.cv.notify_all();
    }

    /// Waits until the loader is stopped on chunk `c` (or has passed it).
    pub fn wait_reached(&self, c: ChunkIndex, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.m.lock();
        while !g.reached.contains(&c.0) {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                return false;
            }
        }
        true
    }

    pub(crate) fn at_loading(&self, c: ChunkIndex) {
        let mut g = self.m.lock();
        g.reached.insert(c.0);
        self.cv.notify_all();
        while g.paused.contains(&c.0) {
            self.cv.wait(&mut g);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    /// A target with one chunk to load, or none.
    struct Target {
        id: u64,
        work: bool,
    }

    impl LoadTarget for Target {
        fn target_id(&self) -> u64 {
            self.id
        }
        fn next_job(&self, _now: Instant) -> NextJob {
            match self.work {
                true => NextJob::Load(ChunkIndex(0), LoadKind::Pass),
                false => NextJob::Idle,
            }
        }
        fn load(&self, _c: ChunkIndex, _kind: LoadKind) -> LoadResult {
            LoadResult::Skipped
        }
        fn reclaim(&self) {}
        fn chunk_bytes(&self) -> u64 {
            4096
        }
    }

    /// A loader without threads, so the test drives `next_job` itself.
    fn shared() -> Shared {
        Shared {
            q: Mutex::new(Queue {
                targets: VecDeque::new(),
                ids: HashSet::new(),
            }),
            cv: Condvar::new(),
            cfg: LoaderConfig::default(),
            rate_next_free: Mutex::new(Instant::now()),
            shutdown: AtomicBool::new(false),
        }
    }

    fn queue(s: &Shared, t: &Arc<dyn LoadTarget>) {
        let mut q = s.q.lock();
        assert!(q.ids.insert(t.target_id()));
        q.targets.push_back((t.target_id(), Arc::downgrade(t)));
    }

    #[test]
    fn a_target_dropped_while_queued_leaves_nothing_queued() {
        let s = shared();
        let dead: Arc<dyn LoadTarget> = Arc::new(Target { id: 1, work: true });
        let live: Arc<dyn LoadTarget> = Arc::new(Target { id: 2, work: true });
        queue(&s, &dead);
        queue(&s, &live);
        drop(dead);
        let (t, job) = next_job(&s).expect("a job");
        assert_eq!(
            (t.target_id(), job),
            (2, NextJob::Load(ChunkIndex(0), LoadKind::Pass))
        );
        let q = s.q.lock();
        assert_eq!(
            q.ids,
            HashSet::from([2]),
            "the dropped target's id is still queued"
        );
        assert_eq!(q.targets.len(), 1);
    }
}
