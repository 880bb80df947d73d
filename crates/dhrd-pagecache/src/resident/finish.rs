//! The end of a file's warm-up: pinning it (within the mapping limit and the memlock
//! limit) and recording it as done, or warming it again when its size changed meanwhile.
//!
//! Invariants:
//! - A file that changes size while it is being warmed (refreshed while `Busy`, or found
//!   shorter than it was sized when its warm-up ends) is not pinned or recorded at the old
//!   size: its reservation goes back and it is warmed again after the refresh delay.
//!   Nothing stops a truncate between that check and the `mlock`; an mlock that then
//!   fails because the mapping reaches past EOF is told from a memlock limit by the
//!   file's size, and only the limit stops pinning.
//! - A file whose read failed is read again after a growing delay, at most
//!   `READ_RETRIES_MAX` times (`read_failures` counts them), and then forgotten: its entry
//!   goes, so a later open or write hands it in again.
//! - `files_warmed` counts files whose current entry is a finished warm-up, so it never
//!   exceeds `files_seen`.
//! - A pin is claimed (`Queues::pins`) before the queue lock is let go, so concurrent
//!   pins respect the limit; a file forgotten while it was pinned gives back its pin and
//!   reservation.
//!
//! Crash semantics: none of its own; the pins vanish with the process's mappings, the
//! pages stay cached.

use super::config::{READ_RETRIES_MAX, READ_RETRY_BACKOFF};
use super::pin::{memlock_limit, Pin};
use super::state::{defer, file_size, page_ceil, Entry, Inner, Job, Queues, Warming};
use dhrd_io::PAGE_BYTES;
use parking_lot::MutexGuard;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Whether `file` is now shorter than `len` bytes of pages (it shrank since it was sized).
pub(super) fn shrank(file: &File, len: u64) -> bool {
    file_size(file).is_ok_and(|size| page_ceil(size) < len)
}

/// Pins a fully warmed file (within the mapping limit) and records it; a file whose size
/// changed meanwhile is warmed again instead (see the module header).
pub(super) fn finish_file(inner: &Inner, w: Warming) {
    let shorter = shrank(&w.file, w.len);
    let mut q = inner.q.lock();
    if !matches!(q.entries.get(&w.key), Some(Entry::Busy)) || q.shutdown {
        drop(q);
        inner.budget.release(w.len);
        return;
    }
    if w.failed {
        read_failed(inner, q, &w);
        inner.budget.release(w.len);
        return;
    }
    if !q.read_failures.is_empty() {
        q.read_failures.remove(&w.key); // read at last
    }
    let changed = q.changed.remove(&w.key);
    if changed.is_some() || shorter {
        let file = changed.or_else(|| w.file.try_clone().ok());
        let left = warm_again(inner, &mut q, w.key, file, inner.cfg.refresh_delay);
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

/// A read of busy file `w` failed: it is read again after a delay, up to
/// `READ_RETRIES_MAX` times, and then left to the device (forgotten, so that its next
/// open or write hands it in again).
fn read_failed(inner: &Inner, mut q: MutexGuard<'_, Queues>, w: &Warming) {
    inner.read_errors.fetch_add(1, Ordering::Relaxed);
    let tries = q.read_failures.entry(w.key).or_insert(0);
    *tries += 1;
    let tries = *tries;
    // A descriptor of the file as it is now, if it changed meanwhile.
    let changed = q.changed.remove(&w.key);
    if tries <= READ_RETRIES_MAX {
        let delay = inner.cfg.refresh_delay * READ_RETRY_BACKOFF.pow(tries - 1);
        let file = changed.or_else(|| w.file.try_clone().ok());
        let left = warm_again(inner, &mut q, w.key, file, delay);
        if !matches!(q.entries.get(&w.key), Some(Entry::Busy)) {
            // Not queued (no descriptor, or the queue full): left unknown, as a dropped
            // demand is, and so is its count.
            q.read_failures.remove(&w.key);
        }
        drop(q);
        inner.dispose(left);
        return;
    }
    q.read_failures.remove(&w.key);
    q.entries.remove(&w.key);
    drop(q);
    inner.dispose(changed);
    inner.files_failed.fetch_add(1, Ordering::Relaxed);
}

/// What pinning a warmed file came to.
pub(super) enum PinOutcome {
    Pinned(Pin),
    /// Not pinned (why is said once, and pinning stops where it can never work).
    Unpinned,
    /// The file shrank since it was sized: queued to be warmed again at its new size, its
    /// reservation and claimed pin given back.
    WarmAgain,
}

/// Pins warmed file `w`, for which a pin was claimed.
pub(super) fn pin_warmed(inner: &Inner, w: &Warming) -> PinOutcome {
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
                left = warm_again(inner, &mut q, w.key, file, inner.cfg.refresh_delay);
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
pub(super) fn record_warmed(inner: &Inner, w: Warming, pin: Option<Pin>, may_pin: bool) {
    let mut q = inner.q.lock();
    if may_pin && pin.is_none() {
        q.pins -= 1;
    }
    match &pin {
        Some(p) => {
            inner.files_pinned.fetch_add(1, Ordering::Relaxed);
            inner
                .bytes_pinned
                .fetch_add(p.len() as u64, Ordering::Relaxed);
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
                .fetch_sub(p.len() as u64, Ordering::Relaxed);
        }
        drop(q);
        inner.budget.release(w.len);
    }
}

/// Queues busy file `key` to be warmed again after `delay`, as `refresh` does (its entry
/// stays `Busy`); without a descriptor, or with the queue full, it is left unknown and its
/// next open demands it. Returns what the caller drops once the lock is free
/// (`Inner::dispose`).
#[must_use]
pub(super) fn warm_again(
    inner: &Inner,
    q: &mut Queues,
    key: u64,
    file: Option<File>,
    delay: Duration,
) -> Option<File> {
    match file {
        Some(file) if q.deferred.len() < inner.cfg.demand_queue_max => {
            defer(inner, q, Instant::now() + delay, Job::Demand { key, file });
            None
        }
        file => {
            q.entries.remove(&key);
            inner.demands_dropped.fetch_add(1, Ordering::Relaxed);
            file
        }
    }
}
