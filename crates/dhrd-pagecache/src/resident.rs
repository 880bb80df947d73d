//! Page-cache residency: the RAM tier when it is the kernel's page cache of the backing
//! files themselves (the FUSE mount's default data path), not memory of our own.
//!
//! A [`Resident`] warms files into the page cache in the background, files that
//! applications open first ("demand"), then the files a walk of the tree hands in, and pins
//! what it warmed within a RAM budget: each pinned file is mapped read-only and `mlock`ed,
//! so the kernel cannot evict its pages. Files, or the part of a file, past the budget are
//! neither read nor pinned and are served from the device (SPEC I11, reported). Large
//! files are cut into segments that several threads read at once.
//!
//! Why the page cache and why these mechanisms (measured, docs/fuse.md): reads through the
//! kernel from the backing file's page cache need no daemon and keep one copy of the data;
//! plain `pread` of 1 MiB into a scratch buffer by 4 threads warmed 4 GiB in 1.6 s against
//! 2.2-3.1 s for `vmtouch -t`; `mlock` of a mapping of cached pages pins them without
//! reading again. A mapping per pinned file costs one entry of the process's map count:
//! as root the limit is raised when the pins reach it (`mapcount.rs`, which says why);
//! past it, files stay warm but evictable (reported).
//!
//! Invariants:
//! - Every byte counted as pinned is reserved in the [`RamBudget`]; a file's reservation
//!   is released when it is forgotten (unlinked), shrinks or the `Resident` is dropped.
//! - A file is warmed at most once unless it changes size (`refresh`); its entry stays
//!   until `forget`, so the walk reaching a file an application already opened reads
//!   nothing again, and a demand of a file the walk queued but has not started moves that
//!   job to the demand queue (the same file, warmed once).
//! - The warm-up is complete only when no file is queued, being opened, read, or being
//!   pinned and recorded: after `wait_complete` every file has its final entry.
//! - An empty file is recorded at once, without a worker; it is warmed when it grows.
//! - A file is never warmed or pinned after it lost its last name: a demand (or refresh)
//!   that races the unlink and its `forget` looks at the link count after its entry is in
//!   (or leaves that to its caller, `demand_unchecked`) and forgets the file itself if the
//!   count is 0.
//! - A file that changed size (`refresh`) gives back its reservation and pin at once and
//!   is warmed and pinned again after `refresh_delay` ([`REFRESH_DELAY`]), unless it is
//!   forgotten first; its entry is `Busy` meanwhile. A file that changes size while it is
//!   being warmed (refreshed while `Busy`, or found shorter than it was sized when its
//!   warm-up ends) is not pinned or recorded at the old size: its reservation goes back
//!   and it is warmed again, the same way. Nothing stops a truncate between that check
//!   and the `mlock`; an mlock that then fails because the mapping reaches past EOF is
//!   told from a memlock limit by the file's size, and only the limit stops pinning.
//! - `files_warmed` counts files whose current entry is a finished warm-up: a refresh
//!   takes a file out of it until it is warmed again, so it never exceeds `files_seen`.
//! - This module only ever reads files; warming never changes what a reader sees, since the
//!   page cache is the one copy every reader and writer goes through (D3 by construction).
//!   Writes racing a warm-up are the page cache's business: a warm-up read sees old or new
//!   bytes and throws them away.
//!
//! Crash semantics: none of its own. After the process dies its pins vanish with its
//! mappings, but the pages stay cached until the kernel needs the memory, so a new
//! instance finds them warm and pins them again without reading the device.

use dhrd_io::RamBudget;
use dhrd_io::PAGE_BYTES;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Warm-up threads by default (measured: 4 threads read 4 GiB of files in 1.6 s, one
/// thread in 2.0-2.8 s, on a 2-vCPU VM with a virtio disk).
pub const RESIDENT_THREADS_DEFAULT: usize = 4;
/// Most warm-up threads.
pub const RESIDENT_THREADS_MAX: usize = 64;
/// Bytes one warm-up read asks for.
pub const WARM_READ_BYTES: usize = 1 << 20;
/// A file is cut into segments of this size for the warm-up threads, so one large file is
/// read by all of them at once.
pub const WARM_SEGMENT_BYTES: u64 = 64 << 20;
/// Files the tree walk may have queued before `submit_walked` blocks (the walk runs ahead
/// of the warm-up by at most this many files, which bounds its memory).
pub const WALK_QUEUE_MAX: usize = 1024;
/// Demanded files queued at once. Each holds a descriptor until its turn, so a storm of
/// opens (a file server creating thousands of files a second) cannot exhaust the
/// process's descriptors; a demand past the bound is dropped and counted, and the file is
/// demanded again at its next open.
pub const DEMAND_QUEUE_MAX: usize = 1024;
/// Mappings left to the rest of the process when the pin limit is derived from
/// `vm.max_map_count`.
pub const MAP_COUNT_RESERVE: usize = 16 * 1024;
/// `vm.max_map_count` assumed when /proc cannot be read (the kernel's default).
pub const MAX_MAP_COUNT_DEFAULT: usize = 65_530;
/// Nice value of the warm-up threads: background work yields to foreground requests.
pub const RESIDENT_NICE: i32 = 10;
/// How long a file that changed size waits before it is warmed and pinned again. A file
/// written, appended to or deleted within this time is pinned once, or never: on two CPUs
/// an `mlock` per write-and-close of a small file cost the fileserver workload a third of
/// its rate. Its pages are in the page cache meanwhile (the writes went through it), only
/// not locked.
pub const REFRESH_DELAY: Duration = Duration::from_secs(5);

/// How a [`Resident`] runs.
#[derive(Debug, Clone)]
pub struct ResidentConfig {
    pub threads: usize,
    /// `mlock` what is warmed (within the budget); without it files are only read in.
    pub pin: bool,
    /// Cap on the warm-up's read rate (bytes/s).
    pub rate_bytes_per_s: Option<u64>,
    /// Most files pinned at once (one mapping each): see [`PinLimit`].
    pub pin_limit: PinLimit,
    /// Most demanded files queued, and most refreshed files waiting (see
    /// [`DEMAND_QUEUE_MAX`]).
    pub demand_queue_max: usize,
    /// See [`REFRESH_DELAY`].
    pub refresh_delay: Duration,
    /// Where pins and descriptors of files that went are dropped (the last unmapping of a
    /// deleted file may free its inode synchronously); None: on the calling thread, after
    /// the queue lock is released.
    pub reaper: Option<crate::reaper::Reaper>,
}

impl Default for ResidentConfig {
    fn default() -> Self {
        Self {
            threads: RESIDENT_THREADS_DEFAULT,
            pin: true,
            rate_bytes_per_s: None,
            pin_limit: PinLimit::default(),
            demand_queue_max: DEMAND_QUEUE_MAX,
            refresh_delay: REFRESH_DELAY,
            reaper: None,
        }
    }
}

/// A file the tree walk found: an opaque key (the backing inode number) and how the
/// [`Opener`] finds it again.
#[derive(Debug, Clone)]
pub struct FileRef {
    pub key: u64,
    pub path: PathBuf,
}

/// Opens walked files for reading when their turn comes (the walk does not keep a
/// descriptor per queued file). Must check the file is still the one walked (`key`).
pub trait Opener: Send + Sync + 'static {
    fn open(&self, f: &FileRef) -> io::Result<File>;
}

/// What the module knows of one file.
enum Entry {
    /// Queued or being read.
    Busy,
    /// Warmed: `reserved` bytes of the budget are held for it (its warmed prefix).
    Done { reserved: u64, pin: Option<Pin> },
}

impl Entry {
    /// Done with nothing reserved or pinned: an empty file, or none of it within the budget.
    const NOTHING_HELD: Entry = Entry::Done {
        reserved: 0,
        pin: None,
    };
}

/// One file being warmed: its segments are handed to any thread; the thread that finishes
/// the last one pins it.
struct Warming {
    key: u64,
    file: Arc<File>,
    /// Bytes to read and pin (page-aligned prefix within the budget).
    len: u64,
    /// Next segment offset to hand out.
    next: u64,
    /// Segments handed out and not finished yet.
    running: u32,
    failed: bool,
}

enum Job {
    /// An application opened it: warm it first.
    Demand { key: u64, file: File },
    /// The walk found it.
    Walked { f: FileRef },
}

struct Queues {
    demand: VecDeque<Job>,
    walked: VecDeque<Job>,
    /// Files that changed size, each warmed again (as demanded) once `due`; in due order,
    /// since every entry waits the same delay. Their entries are `Busy`.
    deferred: VecDeque<(Instant, Job)>,
    /// An idle worker sleeps until the first deferred file is due; the others sleep
    /// until woken, so a due file wakes one thread, not all.
    timer: bool,
    /// Files cut into segments, in progress.
    warming: Vec<Warming>,
    /// Jobs taken off a queue whose file is being opened and sized (not in `warming` yet).
    starting: usize,
    /// Files refreshed while `Busy` (a descriptor each, to warm them again): their warm-up
    /// in progress is of a size that no longer holds.
    changed: HashMap<u64, File>,
    /// Files out of `warming` whose pin and record are being made outside the lock. The
    /// warm-up is not complete before they are recorded, or a `forget` right after
    /// `wait_complete` would find the file still busy and its budget not yet returned.
    finishing: usize,
    entries: HashMap<u64, Entry>,
    pins: usize,
    walk_done: bool,
    completed_at: Option<Instant>,
    shutdown: bool,
}

struct Inner {
    cfg: ResidentConfig,
    budget: Arc<RamBudget>,
    opener: Arc<dyn Opener>,
    maps: MapCount,
    q: Mutex<Queues>,
    /// Idle workers wait here for work. A queued job wakes one of them (several woken
    /// for one job cost more than an empty file's whole warm-up on two CPUs); a file cut
    /// into several segments wakes the others to share it: one thread alone loaded a
    /// single 6 GiB file in 7.3-8.3 s, four sharing it in 3.0-4.2 s.
    work: Condvar,
    /// The walk waits here for room in its queue, `wait_complete` for completion.
    state: Condvar,
    started: Instant,
    rate_next_free: Mutex<Instant>,
    files_seen: AtomicU64,
    bytes_seen: AtomicU64,
    files_warmed: AtomicU64,
    bytes_warmed: AtomicU64,
    files_pinned: AtomicU64,
    bytes_pinned: AtomicU64,
    files_unpinned: AtomicU64,
    bytes_unpinned: AtomicU64,
    files_over_budget: AtomicU64,
    bytes_over_budget: AtomicU64,
    files_failed: AtomicU64,
    files_demanded: AtomicU64,
    demands_dropped: AtomicU64,
    pin_error: Mutex<Option<String>>,
    pin_stopped: AtomicBool,
}

/// The warm-up and pinning of plain files; see the module header. Dropping it stops the
/// threads and releases every pin.
pub struct Resident {
    inner: Arc<Inner>,
}

fn page_floor(b: u64) -> u64 {
    b - b % PAGE_BYTES
}

fn page_ceil(b: u64) -> u64 {
    b.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

impl Resident {
    pub fn new(
        cfg: ResidentConfig,
        budget: Arc<RamBudget>,
        opener: Arc<dyn Opener>,
    ) -> io::Result<Self> {
        let maps = MapCount::new(cfg.pin_limit.clone());
        let threads = cfg.threads.clamp(1, RESIDENT_THREADS_MAX);
        let inner = Arc::new(Inner {
            cfg,
            budget,
            opener,
            maps,
            q: Mutex::new(Queues {
                demand: VecDeque::new(),
                walked: VecDeque::new(),
                deferred: VecDeque::new(),
                timer: false,
                warming: Vec::new(),
                changed: HashMap::new(),
                starting: 0,
                finishing: 0,
                entries: HashMap::new(),
                pins: 0,
                walk_done: false,
                completed_at: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            state: Condvar::new(),
            started: Instant::now(),
            rate_next_free: Mutex::new(Instant::now()),
            files_seen: AtomicU64::new(0),
            bytes_seen: AtomicU64::new(0),
            files_warmed: AtomicU64::new(0),
            bytes_warmed: AtomicU64::new(0),
            files_pinned: AtomicU64::new(0),
            bytes_pinned: AtomicU64::new(0),
            files_unpinned: AtomicU64::new(0),
            bytes_unpinned: AtomicU64::new(0),
            files_over_budget: AtomicU64::new(0),
            bytes_over_budget: AtomicU64::new(0),
            files_failed: AtomicU64::new(0),
            files_demanded: AtomicU64::new(0),
            demands_dropped: AtomicU64::new(0),
            pin_error: Mutex::new(None),
            pin_stopped: AtomicBool::new(false),
        });
        for i in 0..threads {
            let w = inner.clone();
            std::thread::Builder::new()
                .name(format!("dhrd-warm-{i}"))
                .spawn(move || worker(&w))?;
        }
        Ok(Self { inner })
    }

    /// The budget pins are charged to.
    pub fn budget(&self) -> &Arc<RamBudget> {
        &self.inner.budget
    }

    /// A file the walk found; blocks while `WALK_QUEUE_MAX` walked files wait. A file
    /// known already (demanded, or walked through another link) is skipped.
    pub fn submit_walked(&self, f: FileRef, size: u64) {
        let inner = &self.inner;
        let mut q = inner.q.lock();
        while q.walked.len() >= WALK_QUEUE_MAX && !q.shutdown {
            inner.state.wait(&mut q);
        }
        if q.shutdown || q.entries.contains_key(&f.key) {
            return;
        }
        q.entries.insert(f.key, Entry::Busy);
        inner.files_seen.fetch_add(1, Ordering::Relaxed);
        inner.bytes_seen.fetch_add(size, Ordering::Relaxed);
        q.walked.push_back(Job::Walked { f });
        q.completed_at = None;
        drop(q);
        inner.work.notify_one();
    }

    /// The walk has handed in every file.
    pub fn walk_done(&self) {
        let mut q = self.inner.q.lock();
        q.walk_done = true;
        check_complete(&self.inner, &mut q);
    }

    /// An application opened the file behind `file` (key `key`): warm it ahead of the
    /// walk, unless it is known already. `file` is a descriptor the caller keeps; a
    /// duplicate is queued.
    pub fn demand(&self, key: u64, file: &File) {
        self.demand_inner(key, file, None);
    }

    /// `demand` of a file whose size the caller knows (one it just created: 0), which
    /// spares the stat.
    pub fn demand_sized(&self, key: u64, file: &File, size: u64) {
        self.demand_inner(key, file, Some(size));
    }

    /// `demand_sized` for a caller that looks at the file's link count itself once this
    /// returns (and calls `forget` if it is 0), as `demand` does after its entry is in:
    /// one look then covers the caller's own record of the file too.
    pub fn demand_unchecked(&self, key: u64, file: &File, size: u64) {
        self.demand_entry(key, file, Some(size));
    }

    fn demand_inner(&self, key: u64, file: &File, size: Option<u64>) {
        if self.demand_entry(key, file, size) {
            // The file may have lost its last name before the entry went in, and its
            // `forget` then found nothing to drop: look now that the entry is in. An
            // unlink after this point finds the entry (its `forget` comes after the
            // unlink).
            if crate::sys::link_count(file.as_fd()).is_ok_and(|n| n == 0) {
                self.forget(key);
            }
        }
    }

    /// Records and queues a demanded file; whether a job holding a descriptor of it was
    /// queued (the link count is then to be looked at, see `demand_inner`).
    fn demand_entry(&self, key: u64, file: &File, size: Option<u64>) -> bool {
        let inner = &self.inner;
        let mut q = inner.q.lock();
        if !q.shutdown && matches!(q.entries.get(&key), Some(Entry::Busy)) {
            // Queued by the walk and not started yet: it goes ahead of the walk now.
            self.promote_walked(q, key, file);
            return false;
        }
        if q.shutdown || q.entries.contains_key(&key) {
            return false;
        }
        if q.demand.len() >= inner.cfg.demand_queue_max {
            // Not recorded as known: the next open of the file demands it again.
            inner.demands_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let Some(size) = size.or_else(|| file_size(file).ok()) else {
            return false;
        };
        // Nothing to read or pin in an empty file (one just created, typically): it is
        // recorded as done here rather than handed to the workers, whose wake-ups would
        // cost more than the create; `refresh` takes it up when it grows.
        let job = if size == 0 {
            None
        } else {
            let Ok(dup) = file.try_clone() else {
                return false;
            };
            Some(dup)
        };
        inner.files_seen.fetch_add(1, Ordering::Relaxed);
        inner.bytes_seen.fetch_add(size, Ordering::Relaxed);
        inner.files_demanded.fetch_add(1, Ordering::Relaxed);
        let Some(dup) = job else {
            // Holds nothing (no budget, pin or descriptor), so an unlink racing it costs
            // no more than an entry; not worth a stat on every create.
            q.entries.insert(key, Entry::NOTHING_HELD);
            return false;
        };
        q.entries.insert(key, Entry::Busy);
        q.demand.push_back(Job::Demand { key, file: dup });
        q.completed_at = None;
        drop(q);
        inner.work.notify_one();
        true
    }

    /// Moves the walk's queued job of `key` to the demand queue (with a duplicate of
    /// `file`), if it is still queued there and the demand queue has room.
    fn promote_walked(&self, mut q: parking_lot::MutexGuard<'_, Queues>, key: u64, file: &File) {
        let inner = &self.inner;
        if q.demand.len() >= inner.cfg.demand_queue_max {
            return;
        }
        let Some(pos) = q
            .walked
            .iter()
            .position(|j| matches!(j, Job::Walked { f } if f.key == key))
        else {
            return;
        };
        let Ok(dup) = file.try_clone() else {
            return;
        };
        let walked = q.walked.remove(pos);
        q.demand.push_back(Job::Demand { key, file: dup });
        inner.files_demanded.fetch_add(1, Ordering::Relaxed);
        drop(q);
        drop(walked);
        // Room for the walk, and a worker for the demand.
        inner.state.notify_all();
        inner.work.notify_one();
    }

    /// The file may have changed size (a writer closed it, a truncate): warm and pin what
    /// grew within the budget, give back what shrank. A file not known yet is demanded.
    pub fn refresh(&self, key: u64, file: &File) {
        if let Ok(size) = file_size(file) {
            self.refresh_sized(key, file, size);
        }
    }

    /// `refresh` of a file whose size the caller has just read.
    pub fn refresh_sized(&self, key: u64, file: &File, size: u64) {
        let inner = &self.inner;
        let mut q = inner.q.lock();
        let Some(Entry::Done { reserved, .. }) = q.entries.get(&key) else {
            let busy = matches!(q.entries.get(&key), Some(Entry::Busy));
            if busy {
                // Being warmed at a size that no longer holds: its warm-up starts over
                // when it ends (`finish_file`).
                if let Ok(dup) = file.try_clone() {
                    let old = q.changed.insert(key, dup);
                    drop(q);
                    inner.dispose(old);
                }
                return;
            }
            drop(q);
            self.demand_inner(key, file, Some(size));
            return;
        };
        let want = page_ceil(size);
        if want == *reserved {
            return;
        }
        // Start over for this file: give back its reservation and pin now, and warm it
        // again after REFRESH_DELAY, as demanded. Pages still cached are read again from
        // RAM, not from the device.
        let mut old_pin = None;
        if let Some(Entry::Done { reserved, pin }) = q.entries.remove(&key) {
            old_pin = release_done(inner, &mut q, reserved, pin);
            // Counted again when warmed again.
            inner.files_warmed.fetch_sub(1, Ordering::Relaxed);
        }
        if q.shutdown || q.deferred.len() >= inner.cfg.demand_queue_max {
            // Left unknown: the file's next open demands it.
            inner.demands_dropped.fetch_add(1, Ordering::Relaxed);
            drop(q);
            inner.dispose(old_pin);
            return;
        }
        let Ok(dup) = file.try_clone() else {
            drop(q);
            inner.dispose(old_pin);
            return;
        };
        q.entries.insert(key, Entry::Busy);
        let due = Instant::now() + inner.cfg.refresh_delay;
        q.deferred.push_back((due, Job::Demand { key, file: dup }));
        q.completed_at = None;
        let timer = q.timer;
        drop(q);
        inner.dispose(old_pin);
        if !timer {
            // An idle thread becomes the timer; with one already waiting for an earlier
            // file, or every thread busy, nobody needs waking.
            inner.work.notify_one();
        }
    }

    /// The file is gone (its last link was removed): unpin it and give back its budget.
    pub fn forget(&self, key: u64) {
        self.forget_with::<()>(key, None);
    }

    /// `forget`, and `extra` (what the caller held of the file: its descriptor, say)
    /// dropped with what the forget lets go, by the reaper in one handoff: each handoff
    /// wakes a reaper thread, which on two CPUs cost a deleted file more than its unlink.
    /// Nothing is handed over when there is nothing to drop.
    pub fn forget_with<T: Send + 'static>(&self, key: u64, extra: Option<T>) {
        let inner = &self.inner;
        let mut q = inner.q.lock();
        // The pin and queued jobs of a deleted file may hold its last reference: dropped
        // once the lock is free (see `Inner::dispose`).
        let mut gone: Vec<Job> = Vec::new();
        let mut gone_deferred: Vec<(Instant, Job)> = Vec::new();
        let mut pin = None;
        match q.entries.remove(&key) {
            Some(Entry::Done { reserved, pin: p }) => {
                pin = release_done(inner, &mut q, reserved, p)
            }
            Some(Entry::Busy) => {
                // Being warmed: let the warm-up finish and drop the result (see
                // `finish_file`, which finds no entry).
                let ours = |j: &Job| match j {
                    Job::Demand { key: k, .. } => *k == key,
                    Job::Walked { f, .. } => f.key == key,
                };
                take_matching(&mut q.demand, &mut gone, ours);
                take_matching(&mut q.walked, &mut gone, ours);
                take_matching(&mut q.deferred, &mut gone_deferred, |(_, j)| ours(j));
            }
            None => {}
        }
        let changed = q.changed.remove(&key);
        drop(q);
        let nothing = pin.is_none()
            && changed.is_none()
            && gone.is_empty()
            && gone_deferred.is_empty()
            && extra.is_none();
        inner.dispose((!nothing).then_some((pin, changed, gone, gone_deferred, extra)));
    }

    /// Whether the file is known (queued, warming, or warmed): a file never handed in has
    /// nothing to forget, so a caller can skip the system calls a `forget` needs first.
    pub fn is_known(&self, key: u64) -> bool {
        self.inner.q.lock().entries.contains_key(&key)
    }

    pub fn stats(&self) -> ResidentStats {
        let inner = &self.inner;
        let q = inner.q.lock();
        let complete = is_complete(&q);
        let completed_at = q.completed_at;
        drop(q);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ResidentStats {
            files_seen: l(&inner.files_seen),
            bytes_seen: l(&inner.bytes_seen),
            files_warmed: l(&inner.files_warmed),
            bytes_warmed: l(&inner.bytes_warmed),
            files_pinned: l(&inner.files_pinned),
            bytes_pinned: l(&inner.bytes_pinned),
            files_unpinned: l(&inner.files_unpinned),
            bytes_unpinned: l(&inner.bytes_unpinned),
            bytes_over_budget: l(&inner.bytes_over_budget),
            files_over_budget: l(&inner.files_over_budget),
            files_failed: l(&inner.files_failed),
            files_demanded: l(&inner.files_demanded),
            demands_dropped: l(&inner.demands_dropped),
            complete,
            elapsed_s: inner.started.elapsed().as_secs_f64(),
            complete_after_s: completed_at.map(|t| (t - inner.started).as_secs_f64()),
            pin_error: inner.pin_error.lock().clone(),
            pins_max: inner.maps.max() as u64,
            map_count: inner.maps.note(),
        }
    }

    /// Waits until the warm-up is complete or `timeout` passes; returns whether complete.
    pub fn wait_complete(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut q = self.inner.q.lock();
        while !is_complete(&q) {
            if self.inner.state.wait_until(&mut q, end).timed_out() {
                return is_complete(&q);
            }
        }
        true
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let mut q = self.inner.q.lock();
        q.shutdown = true;
        q.demand.clear();
        q.walked.clear();
        q.deferred.clear();
        q.changed.clear();
        let entries: Vec<Entry> = q.entries.drain().map(|(_, e)| e).collect();
        let mut pins = Vec::new();
        for e in entries {
            if let Entry::Done { reserved, pin } = e {
                pins.extend(release_done(&self.inner, &mut q, reserved, pin));
            }
        }
        drop(q);
        drop(pins);
        self.inner.work.notify_all();
        self.inner.state.notify_all();
    }
}

/// The size of an open file without asking for its timestamps (`sys::file_size`).
fn file_size(file: &File) -> io::Result<u64> {
    use std::os::fd::AsFd;
    crate::sys::file_size(file.as_fd())
}

/// Moves the entries of `q` that `pred` picks to `out`, keeping the others in order.
fn take_matching<T>(q: &mut VecDeque<T>, out: &mut Vec<T>, pred: impl Fn(&T) -> bool) {
    // Most forgotten files have no job in a given queue: look before rebuilding it (a
    // queue holds up to `demand_queue_max` jobs, and unlinks come at the request rate).
    if !q.iter().any(&pred) {
        return;
    }
    let mut kept = VecDeque::with_capacity(q.len());
    for j in q.drain(..) {
        if pred(&j) {
            out.push(j);
        } else {
            kept.push_back(j);
        }
    }
    *q = kept;
}

impl Inner {
    /// Drops `v` (a pin, queued descriptors) on the configured reaper, or here: never
    /// under the queue lock. Nothing to drop wakes no reaper thread (a refresh of a file
    /// warmed empty, the most common one, has no pin to give back).
    fn dispose<T: Send + 'static>(&self, v: Option<T>) {
        let Some(v) = v else {
            return;
        };
        match &self.cfg.reaper {
            Some(r) => r.drop_later(v),
            None => drop(v),
        }
    }
}

/// Gives back a warmed file's budget and counts its pin gone; returns the pin for the
/// caller to drop once it holds no lock (`Inner::dispose`): unmapping the last mapping of
/// a deleted file may free the inode synchronously.
#[must_use]
fn release_done(inner: &Inner, q: &mut Queues, reserved: u64, pin: Option<Pin>) -> Option<Pin> {
    inner.budget.release(reserved);
    if let Some(p) = &pin {
        q.pins -= 1;
        inner.files_pinned.fetch_sub(1, Ordering::Relaxed);
        inner
            .bytes_pinned
            .fetch_sub(p.len as u64, Ordering::Relaxed);
    }
    pin
}

fn is_complete(q: &Queues) -> bool {
    q.walk_done
        && q.demand.is_empty()
        && q.walked.is_empty()
        && q.deferred.is_empty()
        && q.warming.is_empty()
        && q.starting == 0
        && q.finishing == 0
}

fn check_complete(inner: &Inner, q: &mut Queues) {
    if is_complete(q) && q.completed_at.is_none() {
        q.completed_at = Some(Instant::now());
        inner.state.notify_all();
    }
}

/// A unit of work a thread took: a segment of a file being warmed.
struct Segment {
    key: u64,
    file: Arc<File>,
    offset: u64,
    len: u64,
}

fn worker(inner: &Arc<Inner>) {
    set_nice(RESIDENT_NICE);
    let mut buf = vec![0u8; WARM_READ_BYTES];
    loop {
        let seg = {
            let mut q = inner.q.lock();
            loop {
                if q.shutdown {
                    return;
                }
                if let Some(s) = next_segment(&mut q) {
                    break s;
                }
                // Start the next file: demanded ones first. Opening and sizing happen
                // outside the lock.
                let now = Instant::now();
                let due = q.deferred.front().is_some_and(|(t, _)| *t <= now);
                let job = if due {
                    q.deferred.pop_front().map(|(_, j)| j)
                } else {
                    q.demand.pop_front().or_else(|| q.walked.pop_front())
                };
                match job {
                    Some(job) => {
                        q.starting += 1;
                        inner.state.notify_all(); // room for the walk
                        drop(q);
                        start_file(inner, job);
                        q = inner.q.lock();
                        q.starting -= 1;
                    }
                    None => {
                        check_complete(inner, &mut q);
                        match q.deferred.front().map(|(t, _)| *t) {
                            Some(t) if !q.timer => {
                                q.timer = true;
                                inner.work.wait_until(&mut q, t);
                                q.timer = false;
                            }
                            _ => inner.work.wait(&mut q),
                        }
                    }
                }
            }
        };
        let ok = warm_range(inner, &seg.file, seg.offset, seg.len, &mut buf);
        let mut q = inner.q.lock();
        let Some(w) = q
            .warming
            .iter_mut()
            .find(|w| w.key == seg.key && Arc::ptr_eq(&w.file, &seg.file))
        else {
            continue;
        };
        w.running -= 1;
        if !ok {
            w.failed = true;
        }
        if w.running == 0 && w.next >= w.len {
            let pos = q
                .warming
                .iter()
                .position(|w| w.key == seg.key && Arc::ptr_eq(&w.file, &seg.file));
            if let Some(pos) = pos {
                let w = q.warming.swap_remove(pos);
                q.finishing += 1;
                drop(q);
                finish_file(inner, w);
                let mut q = inner.q.lock();
                q.finishing -= 1;
                check_complete(inner, &mut q);
            }
        }
    }
}

/// Hands out the next segment of a file being warmed, if any.
fn next_segment(q: &mut Queues) -> Option<Segment> {
    for w in q.warming.iter_mut() {
        if w.next < w.len {
            let len = (w.len - w.next).min(WARM_SEGMENT_BYTES);
            let s = Segment {
                key: w.key,
                file: w.file.clone(),
                offset: w.next,
                len,
            };
            w.next += len;
            w.running += 1;
            return Some(s);
        }
    }
    None
}

/// Opens (walked files), sizes and reserves a file, then queues its segments.
fn start_file(inner: &Inner, job: Job) {
    let (key, file) = match job {
        Job::Demand { key, file } => (key, Ok(file)),
        Job::Walked { f } => (f.key, inner.opener.open(&f)),
    };
    let size = match file.and_then(|f| f.metadata().map(|m| (f, m.len()))) {
        Ok(x) => x,
        Err(_) => {
            inner.files_failed.fetch_add(1, Ordering::Relaxed);
            let mut q = inner.q.lock();
            q.entries.remove(&key);
            let changed = q.changed.remove(&key);
            drop(q);
            inner.dispose(changed);
            return;
        }
    };
    let (file, size) = size;
    // The whole file if the budget allows, else the page-aligned prefix it allows (I11).
    let want = page_ceil(size);
    let mut got = want;
    while got > 0 && !inner.budget.try_reserve(got) {
        let left = inner
            .budget
            .limit_bytes()
            .saturating_sub(inner.budget.used_bytes());
        got = page_floor(left.min(got.saturating_sub(PAGE_BYTES)));
    }
    if got < want {
        inner.files_over_budget.fetch_add(1, Ordering::Relaxed);
        inner
            .bytes_over_budget
            .fetch_add(want - got, Ordering::Relaxed);
    }
    let mut q = inner.q.lock();
    if !matches!(q.entries.get(&key), Some(Entry::Busy)) || q.shutdown {
        // Forgotten meanwhile.
        drop(q);
        inner.budget.release(got);
        return;
    }
    if got == 0 {
        // Nothing held, so nothing stale: a later refresh finds it done.
        q.entries.insert(key, Entry::NOTHING_HELD);
        let changed = q.changed.remove(&key);
        drop(q);
        inner.dispose(changed);
        return;
    }
    q.warming.push(Warming {
        key,
        file: Arc::new(file),
        len: got,
        next: 0,
        running: 0,
        failed: false,
    });
    drop(q);
    if got > WARM_SEGMENT_BYTES {
        // More than this thread's first segment: idle threads share the file.
        inner.work.notify_all();
    }
}

/// Reads `len` bytes from `offset` into the page cache (and throws them away).
fn warm_range(inner: &Inner, file: &File, offset: u64, len: u64, buf: &mut [u8]) -> bool {
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = ((end - at) as usize).min(buf.len());
        throttle(inner, n as u64);
        match file.read_at(&mut buf[..n], at) {
            Ok(0) => break, // shrank meanwhile
            Ok(got) => {
                at += got as u64;
                inner.bytes_warmed.fetch_add(got as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
        if inner.q.lock().shutdown {
            return false;
        }
    }
    true
}

/// Whether `file` is now shorter than `len` bytes of pages (it shrank since it was sized).
fn shrank(file: &File, len: u64) -> bool {
    file_size(file).is_ok_and(|size| page_ceil(size) < len)
}

/// Pins a fully warmed file (within the mapping limit) and records it; a file whose size
/// changed meanwhile is warmed again instead (see the module header).
fn finish_file(inner: &Inner, w: Warming) {
    let shorter = shrank(&w.file, w.len);
    let mut q = inner.q.lock();
    if !matches!(q.entries.get(&w.key), Some(Entry::Busy)) || q.shutdown {
        drop(q);
        inner.budget.release(w.len);
        return;
    }
    if w.failed {
        q.entries.remove(&w.key);
        let changed = q.changed.remove(&w.key);
        drop(q);
        inner.dispose(changed);
        inner.budget.release(w.len);
        inner.files_failed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let changed = q.changed.remove(&w.key);
    if changed.is_some() || shorter {
        let file = changed.or_else(|| w.file.try_clone().ok());
        let left = warm_again(inner, &mut q, w.key, file);
        drop(q);
        inner.dispose(left);
        inner.budget.release(w.len);
        return;
    }
    inner.files_warmed.fetch_add(1, Ordering::Relaxed);
    if inner.cfg.pin && q.pins >= inner.maps.max() {
        // The sysctl is written outside the queue lock.
        let pins = q.pins;
        drop(q);
        let pins_possible = (inner.budget.limit_bytes() / PAGE_BYTES) as usize;
        inner.maps.make_room(pins, pins_possible);
        q = inner.q.lock();
        if !matches!(q.entries.get(&w.key), Some(Entry::Busy)) || q.shutdown {
            inner.files_warmed.fetch_sub(1, Ordering::Relaxed);
            drop(q);
            inner.budget.release(w.len);
            return;
        }
    }
    let may_pin =
        inner.cfg.pin && q.pins < inner.maps.max() && !inner.pin_stopped.load(Ordering::Relaxed);
    if may_pin {
        q.pins += 1; // claimed before the unlock so concurrent pins respect the limit
    }
    drop(q);
    let pin = match may_pin.then(|| pin_warmed(inner, &w)) {
        Some(PinOutcome::WarmAgain) => return,
        Some(PinOutcome::Pinned(p)) => Some(p),
        Some(PinOutcome::Unpinned) | None => None,
    };
    record_warmed(inner, w, pin, may_pin);
}

/// What pinning a warmed file came to.
enum PinOutcome {
    Pinned(Pin),
    /// Not pinned (why is said once, and pinning stops where it can never work).
    Unpinned,
    /// The file shrank since it was sized: queued to be warmed again at its new size, its
    /// reservation and claimed pin given back.
    WarmAgain,
}

/// Pins warmed file `w`, for which a pin was claimed.
fn pin_warmed(inner: &Inner, w: &Warming) -> PinOutcome {
    match Pin::new(&w.file, w.len) {
        Ok(p) => PinOutcome::Pinned(p),
        Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && shrank(&w.file, w.len) => {
            // Truncated since the check in `finish_file`: the mapping reached past EOF,
            // which says nothing of the memlock limit. Warmed again at its new size.
            let mut q = inner.q.lock();
            q.pins -= 1;
            inner.files_warmed.fetch_sub(1, Ordering::Relaxed);
            let mut left = None;
            if matches!(q.entries.get(&w.key), Some(Entry::Busy)) && !q.shutdown {
                let changed = q.changed.remove(&w.key);
                let file = changed.or_else(|| w.file.try_clone().ok());
                left = warm_again(inner, &mut q, w.key, file);
            }
            drop(q);
            inner.dispose(left);
            inner.budget.release(w.len);
            PinOutcome::WarmAgain
        }
        Err(e) => {
            // Without CAP_IPC_LOCK and a large RLIMIT_MEMLOCK nothing will pin: say why
            // once and stop trying.
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::ENOMEM | libc::EAGAIN)
            ) {
                inner.pin_stopped.store(true, Ordering::Relaxed);
            }
            let mut pe = inner.pin_error.lock();
            if pe.is_none() {
                *pe = Some(format!("mlock: {e} ({})", memlock_limit()));
            }
            PinOutcome::Unpinned
        }
    }
}

/// Records warmed file `w` as done with `pin` (`may_pin`: a pin was claimed for it), unless
/// it was forgotten meanwhile: then its pin and reservation are given back.
fn record_warmed(inner: &Inner, w: Warming, pin: Option<Pin>, may_pin: bool) {
    let mut q = inner.q.lock();
    if may_pin && pin.is_none() {
        q.pins -= 1;
    }
    match &pin {
        Some(p) => {
            inner.files_pinned.fetch_add(1, Ordering::Relaxed);
            inner
                .bytes_pinned
                .fetch_add(p.len as u64, Ordering::Relaxed);
        }
        None if inner.cfg.pin => {
            inner.files_unpinned.fetch_add(1, Ordering::Relaxed);
            inner.bytes_unpinned.fetch_add(w.len, Ordering::Relaxed);
        }
        None => {}
    }
    if matches!(q.entries.get(&w.key), Some(Entry::Busy)) && !q.shutdown {
        q.entries.insert(
            w.key,
            Entry::Done {
                reserved: w.len,
                pin,
            },
        );
    } else {
        // Forgotten while pinning.
        if let Some(p) = pin {
            q.pins -= 1;
            inner.files_pinned.fetch_sub(1, Ordering::Relaxed);
            inner
                .bytes_pinned
                .fetch_sub(p.len as u64, Ordering::Relaxed);
        }
        drop(q);
        inner.budget.release(w.len);
    }
}

/// Queues busy file `key` to be warmed again after the refresh delay, as `refresh` does
/// (its entry stays `Busy`); without a descriptor, or with the queue full, it is left
/// unknown and its next open demands it. Returns what the caller drops once the lock is
/// free (`Inner::dispose`).
#[must_use]
fn warm_again(inner: &Inner, q: &mut Queues, key: u64, file: Option<File>) -> Option<File> {
    match file {
        Some(file) if q.deferred.len() < inner.cfg.demand_queue_max => {
            let due = Instant::now() + inner.cfg.refresh_delay;
            q.deferred.push_back((due, Job::Demand { key, file }));
            q.completed_at = None;
            if !q.timer {
                inner.work.notify_one();
            }
            None
        }
        file => {
            q.entries.remove(&key);
            inner.demands_dropped.fetch_add(1, Ordering::Relaxed);
            file
        }
    }
}

/// Waits as long as the configured rate requires before reading `bytes`.
fn throttle(inner: &Inner, bytes: u64) {
    let Some(rate) = inner.cfg.rate_bytes_per_s.filter(|r| *r > 0) else {
        return;
    };
    let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
    let wait_until = {
        let mut next = inner.rate_next_free.lock();
        let now = Instant::now();
        let start = (*next).max(now);
        *next = start + cost;
        start
    };
    let now = Instant::now();
    if wait_until > now {
        std::thread::sleep(wait_until - now);
    }
}

fn set_nice(nice: i32) {
    // SAFETY: setpriority on this thread's own id; failure only leaves the default nice.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
}

/// Bytes of `file` the page cache holds (for tests and status of single files).
pub fn cached_bytes(file: &File) -> io::Result<u64> {
    let (st, _) = crate::sys::cachestat(file.as_fd(), 0, 0)?;
    Ok(st.cached_bytes())
}

mod mapcount;
mod pin;
mod stats;
use mapcount::MapCount;
pub use mapcount::{MapCountNote, PinLimit, MAX_MAP_COUNT_RAISE_MAX, MAX_MAP_COUNT_SYSCTL};
use pin::{memlock_limit, Pin};
pub use stats::ResidentStats;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests;
