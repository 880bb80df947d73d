//! The warm-up's shared state: what it knows of each file (`Entry`), its queues, its
//! counters, and the few steps every path takes under the queue lock.
//!
//! Invariants:
//! - Every byte counted as pinned is reserved in the [`RamBudget`]; a file's reservation
//!   is released (`release_done`) when it is forgotten (unlinked), shrinks or the
//!   `Resident` is dropped.
//! - The warm-up is complete only when no file is queued, being opened, read, or being
//!   pinned and recorded (`is_complete`).
//! - Pins and descriptors are dropped (`Inner::dispose`) never under the queue lock: the
//!   last unmapping of a deleted file may free its inode synchronously.
//!
//! Crash semantics: none; the state lives in memory only, and the pins vanish with the
//! process while the pages stay cached.

use super::config::{FileRef, Opener, ResidentConfig};
use super::mapcount::MapCount;
use super::pin::Pin;
use dhrd_io::RamBudget;
use dhrd_io::PAGE_BYTES;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What the module knows of one file.
pub(super) enum Entry {
    /// Queued or being read.
    Busy,
    /// Warmed: `reserved` bytes of the budget are held for it (its warmed prefix).
    Done { reserved: u64, pin: Option<Pin> },
}

impl Entry {
    /// Done with nothing reserved or pinned: an empty file, or none of it within the budget.
    pub(super) const NOTHING_HELD: Entry = Entry::Done {
        reserved: 0,
        pin: None,
    };
}

/// One file being warmed: its segments are handed to any thread; the thread that finishes
/// the last one pins it.
pub(super) struct Warming {
    pub(super) key: u64,
    pub(super) file: Arc<File>,
    /// Bytes to read and pin (page-aligned prefix within the budget).
    pub(super) len: u64,
    /// Next segment offset to hand out.
    pub(super) next: u64,
    /// Segments handed out and not finished yet.
    pub(super) running: u32,
    pub(super) failed: bool,
}

pub(super) enum Job {
    /// An application opened it: warm it first.
    Demand { key: u64, file: File },
    /// The walk found it.
    Walked { f: FileRef },
}

pub(super) struct Queues {
    pub(super) demand: VecDeque<Job>,
    pub(super) walked: VecDeque<Job>,
    /// Files that changed size, or whose read failed, each warmed again (as demanded) once
    /// `due`; in due order (`defer`). Their entries are `Busy`.
    pub(super) deferred: VecDeque<(Instant, Job)>,
    /// Files whose warm-up read failed, and how many times, while they wait for a retry
    /// (`READ_RETRIES_MAX`); removed when one is warmed, given up or forgotten.
    pub(super) read_failures: HashMap<u64, u32>,
    /// An idle worker sleeps until the first deferred file is due; the others sleep
    /// until woken, so a due file wakes one thread, not all.
    pub(super) timer: bool,
    /// Files cut into segments, in progress.
    pub(super) warming: Vec<Warming>,
    /// Jobs taken off a queue whose file is being opened and sized (not in `warming` yet).
    pub(super) starting: usize,
    /// Files refreshed while `Busy` (a descriptor each, to warm them again): their warm-up
    /// in progress is of a size that no longer holds.
    pub(super) changed: HashMap<u64, File>,
    /// Files out of `warming` whose pin and record are being made outside the lock. The
    /// warm-up is not complete before they are recorded, or a `forget` right after
    /// `wait_complete` would find the file still busy and its budget not yet returned.
    pub(super) finishing: usize,
    pub(super) entries: HashMap<u64, Entry>,
    pub(super) pins: usize,
    pub(super) walk_done: bool,
    pub(super) completed_at: Option<Instant>,
    pub(super) shutdown: bool,
}

pub(super) struct Inner {
    pub(super) cfg: ResidentConfig,
    pub(super) budget: Arc<RamBudget>,
    pub(super) opener: Arc<dyn Opener>,
    pub(super) maps: MapCount,
    pub(super) q: Mutex<Queues>,
    /// Idle workers wait here for work. A queued job wakes one of them (several woken
    /// for one job cost more than an empty file's whole warm-up on two CPUs); a file cut
    /// into several segments wakes the others to share it: one thread alone loaded a
    /// single 6 GiB file in 7.3-8.3 s, four sharing it in 3.0-4.2 s.
    pub(super) work: Condvar,
    /// The walk waits here for room in its queue, `wait_complete` for completion.
    pub(super) state: Condvar,
    pub(super) started: Instant,
    pub(super) rate_next_free: Mutex<Instant>,
    pub(super) files_seen: AtomicU64,
    pub(super) bytes_seen: AtomicU64,
    pub(super) files_warmed: AtomicU64,
    pub(super) bytes_warmed: AtomicU64,
    pub(super) files_pinned: AtomicU64,
    pub(super) bytes_pinned: AtomicU64,
    pub(super) files_unpinned: AtomicU64,
    pub(super) bytes_unpinned: AtomicU64,
    pub(super) files_over_budget: AtomicU64,
    pub(super) bytes_over_budget: AtomicU64,
    pub(super) files_failed: AtomicU64,
    pub(super) read_errors: AtomicU64,
    pub(super) files_demanded: AtomicU64,
    pub(super) demands_dropped: AtomicU64,
    pub(super) pin_error: Mutex<Option<String>>,
    pub(super) pin_stopped: AtomicBool,
}

pub(super) fn page_floor(b: u64) -> u64 {
    b - b % PAGE_BYTES
}

pub(super) fn page_ceil(b: u64) -> u64 {
    b.div_ceil(PAGE_BYTES) * PAGE_BYTES
}
/// The size of an open file without asking for its timestamps (`sys::file_size`).
pub(super) fn file_size(file: &File) -> io::Result<u64> {
    use std::os::fd::AsFd;
    crate::sys::file_size(file.as_fd())
}
impl Inner {
    /// Drops `v` (a pin, queued descriptors) on the configured reaper, or here: never
    /// under the queue lock. Nothing to drop wakes no reaper thread (a refresh of a file
    /// warmed empty, the most common one, has no pin to give back).
    pub(super) fn dispose<T: Send + 'static>(&self, v: Option<T>) {
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
pub(super) fn release_done(
    inner: &Inner,
    q: &mut Queues,
    reserved: u64,
    pin: Option<Pin>,
) -> Option<Pin> {
    inner.budget.release(reserved);
    if let Some(p) = &pin {
        q.pins -= 1;
        inner.files_pinned.fetch_sub(1, Ordering::Relaxed);
        inner
            .bytes_pinned
            .fetch_sub(p.len() as u64, Ordering::Relaxed);
    }
    pin
}

/// Queues `job` to start once `due`, keeping `deferred` in due order, and wakes a thread to
/// wait for it where none waits for an earlier one.
pub(super) fn defer(inner: &Inner, q: &mut Queues, due: Instant, job: Job) {
    let at = q.deferred.partition_point(|(t, _)| *t <= due);
    q.deferred.insert(at, (due, job));
    // The due order the workers rely on: each looks at the first entry only.
    debug_assert!(at == 0 || q.deferred[at - 1].0 <= due);
    debug_assert!(q.deferred.get(at + 1).is_none_or(|(t, _)| due <= *t));
    q.completed_at = None;
    if !q.timer {
        // An idle thread becomes the timer; with every thread busy, nobody needs waking.
        inner.work.notify_one();
    } else if at == 0 {
        // Due before what the timer waits for: which waiting thread is the timer is not
        // known, so all wake and one of them times the new first.
        inner.work.notify_all();
    }
}

pub(super) fn is_complete(q: &Queues) -> bool {
    q.walk_done
        && q.demand.is_empty()
        && q.walked.is_empty()
        && q.deferred.is_empty()
        && q.warming.is_empty()
        && q.starting == 0
        && q.finishing == 0
}

pub(super) fn check_complete(inner: &Inner, q: &mut Queues) {
    if is_complete(q) && q.completed_at.is_none() {
        q.completed_at = Some(Instant::now());
        inner.state.notify_all();
    }
}
