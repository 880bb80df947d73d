//! The [`Resident`] handle: starting the warm-up threads, the walk handing in files,
//! the counters and waiting for completion, and the drop that stops it all.
//!
//! Invariants:
//! - The warm-up is complete only when no file is queued, being opened, read, or being
//!   pinned and recorded: after `wait_complete` every file has its final entry.
//! - The walk runs ahead of the warm-up by at most [`WALK_QUEUE_MAX`] files.
//! - Dropping it releases every file's reservation and pin.
//!
//! Crash semantics: none of its own. After the process dies its pins vanish with its
//! mappings, but the pages stay cached until the kernel needs the memory, so a new
//! instance finds them warm and pins them again without reading the device.

use super::config::{FileRef, Opener, ResidentConfig, RESIDENT_THREADS_MAX, WALK_QUEUE_MAX};
use super::mapcount::MapCount;
use super::state::{check_complete, is_complete, release_done, Entry, Inner, Job, Queues};
use super::stats::ResidentStats;
use super::warmup::worker;
use dhrd_io::RamBudget;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The warm-up and pinning of plain files; see the module header. Dropping it stops the
/// threads and releases every pin.
pub struct Resident {
    pub(super) inner: Arc<Inner>,
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
                read_failures: HashMap::new(),
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
            read_errors: AtomicU64::new(0),
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
}

impl Resident {
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
            read_errors: l(&inner.read_errors),
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
