//! What callers tell a [`Resident`] about single files: an application opened one
//! (`demand`), one changed size (`refresh`), one lost its last name (`forget`).
//!
//! Invariants:
//! - A file is warmed at most once unless it changes size (`refresh`); its entry stays
//!   until `forget`, so the walk reaching a file an application already opened reads
//!   nothing again, and a demand of a file the walk queued but has not started moves that
//!   job to the demand queue (the same file, warmed once).
//! - An empty file is recorded at once, without a worker; it is warmed when it grows.
//! - A file is never warmed or pinned after it lost its last name: a demand (or refresh)
//!   that races the unlink and its `forget` looks at the link count after its entry is in
//!   (or leaves that to its caller, `demand_unchecked`) and forgets the file itself if the
//!   count is 0.
//! - A file that changed size (`refresh`) gives back its reservation and pin at once and
//!   is warmed and pinned again after `refresh_delay` ([`REFRESH_DELAY`]), unless it is
//!   forgotten first; its entry is `Busy` meanwhile. A refresh of a file being warmed
//!   leaves it to `finish_file` to warm it again.
//!
//! Crash semantics: none; this only changes what is in memory.
//!
//! [`REFRESH_DELAY`]: super::config::REFRESH_DELAY

use super::handle::Resident;
use super::state::{defer, file_size, page_ceil, release_done, Entry, Job, Queues};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Resident {
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
        defer(inner, &mut q, due, Job::Demand { key, file: dup });
        drop(q);
        inner.dispose(old_pin);
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
        q.read_failures.remove(&key);
        drop(q);
        let nothing = pin.is_none()
            && changed.is_none()
            && gone.is_empty()
            && gone_deferred.is_empty()
            && extra.is_none();
        inner.dispose((!nothing).then_some((pin, changed, gone, gone_deferred, extra)));
    }
}

/// Moves the entries of `q` that `pred` picks to `out`, keeping the others in order.
pub(super) fn take_matching<T>(q: &mut VecDeque<T>, out: &mut Vec<T>, pred: impl Fn(&T) -> bool) {
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
