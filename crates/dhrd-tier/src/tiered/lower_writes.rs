//! Counts of the writes to the lower tier, per chunk, so that bytes read from the lower
//! tier without a lock go into a slot only if no write to the lower tier overlapped the
//! read.
//!
//! Three places read a chunk's bytes from the lower tier to put them into a slot without
//! holding anything that keeps the lower tier still: a promotion (the read that missed),
//! a write that takes a new slot (the edges of the parts it covers partly), and the
//! write-back completing a slot (the parts it lacks). Meanwhile a write may reach the lower
//! tier: one that found no slot (every slot dirty, or write-through), a write-through
//! write that dropped the chunk's clean slot, or the write-back copying the chunk. If the
//! slot were named after such a write, it would serve bytes older than an acknowledged
//! write, and after a crash too.
//!
//! So every write to the lower tier is counted: it [`begins`](LowerWrites::begin) before it
//! looks for the chunk's slot, and it ends (the guard drops) once its bytes are synced
//! there. A reader of the lower tier takes the count first, when no such write is in flight
//! ([`LowerWrites::seen`], or [`LowerWrites::wait_seen`] to wait for one to end), and names
//! or completes the slot, under the state lock, only if no such write began since
//! ([`LowerWrites::unchanged`]). A write that began after that check looks for the slot
//! after it, so it finds the slot named and writes there instead.
//!
//! Chunks share counters (stripes), so the memory does not grow with the lower tier; a
//! write to another chunk of the same stripe costs a reader only a refusal or a wait, never
//! a wrong answer.
//!
//! Invariants: per stripe `ended <= begun`, both only grow; `ended` is read before `begun`,
//! so equal readings mean that every write begun by then had ended. A write is not counted
//! in flight while it waits for a slot's lock (it begins again after), and while in flight
//! it holds at most the lock of a slot named for its chunk; a reader waits only while
//! holding the lock of a slot that no chunk names, or no lock. So waiting cannot deadlock.
//!
//! Crash semantics: none; the counts live in memory only.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes per slot of the SSD: few chunks of the lower tier that are in flight at once
/// share one.
pub(super) const STRIPES_PER_SLOT: u64 = 4;
/// Stripes at least and at most (16 bytes each).
pub(super) const STRIPES_MIN: u64 = 64;
pub(super) const STRIPES_MAX: u64 = 1 << 16;

#[derive(Default)]
struct Stripe {
    begun: AtomicU64,
    ended: AtomicU64,
}

/// See the module documentation.
pub(super) struct LowerWrites {
    stripes: Box<[Stripe]>,
    /// Readers waiting in `wait_seen`: a write that ends wakes them.
    waiting: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// A chunk's count as a reader took it, with no write to the lower tier in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    stripe: usize,
    begun: u64,
}

/// A write to the lower tier in flight; it ends when dropped.
pub(super) struct Writing<'a> {
    counts: &'a LowerWrites,
    stripe: usize,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.counts.stripes[self.stripe]
            .ended
            .fetch_add(1, Ordering::SeqCst);
        if self.counts.waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.counts.lock.lock();
            self.counts.cv.notify_all();
        }
    }
}

impl LowerWrites {
    /// Counters for a tier of `slots` slots.
    pub(super) fn for_slots(slots: u64) -> Self {
        let n = (slots * STRIPES_PER_SLOT)
            .clamp(STRIPES_MIN, STRIPES_MAX)
            .next_power_of_two();
        Self {
            stripes: (0..n).map(|_| Stripe::default()).collect(),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn stripe(&self, chunk: u64) -> usize {
        (chunk % self.stripes.len() as u64) as usize
    }

    /// A write of `chunk` that may reach the lower tier begins: before it looks for the
    /// chunk's slot. It ends when the returned guard drops, after its bytes are synced.
    pub(super) fn begin(&self, chunk: u64) -> Writing<'_> {
        let stripe = self.stripe(chunk);
        self.stripes[stripe].begun.fetch_add(1, Ordering::SeqCst);
        Writing {
            counts: self,
            stripe,
        }
    }

    /// The count of `chunk`, if no write of it to the lower tier is in flight.
    pub(super) fn seen(&self, chunk: u64) -> Option<Seen> {
        let stripe = self.stripe(chunk);
        let s = &self.stripes[stripe];
        // `ended` first: equal readings then mean every write begun by the second had
        // ended by the first.
        let ended = s.ended.load(Ordering::SeqCst);
        let begun = s.begun.load(Ordering::SeqCst);
        (ended == begun).then_some(Seen { stripe, begun })
    }

    /// The count of `chunk` once no write of it to the lower tier is in flight: waits for
    /// those in flight to end (each ends after one write and sync of the lower tier).
    pub(super) fn wait_seen(&self, chunk: u64) -> Seen {
        if let Some(s) = self.seen(chunk) {
            return s;
        }
        let mut g = self.lock.lock();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let seen = loop {
            // Checked under the lock that an ending write takes to wake us: no lost wake-up.
            if let Some(s) = self.seen(chunk) {
                break s;
            }
            self.cv.wait(&mut g);
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        seen
    }

    /// True when no write to the lower tier of the chunk `seen` was taken for began since.
    pub(super) fn unchanged(&self, seen: Seen) -> bool {
        self.stripes[seen.stripe].begun.load(Ordering::SeqCst) == seen.begun
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_in_flight_or_begun_since_is_seen() {
        let w = LowerWrites::for_slots(1);
        let s = w.seen(3).unwrap_or_else(|| panic!("nothing is in flight"));
        assert!(w.unchanged(s));
        {
            let _g = w.begin(3);
            assert_eq!(w.seen(3), None);
            // Another chunk of the same stripe counts too; one of another stripe does not.
            assert_eq!(w.seen(3 + STRIPES_MIN), None);
            assert!(w.seen(4).is_some());
            assert!(!w.unchanged(s));
        }
        let t = w.seen(3).unwrap_or_else(|| panic!("the write ended"));
        assert!(!w.unchanged(s) && w.unchanged(t));
    }

    #[test]
    fn a_waiting_reader_is_woken_when_the_write_ends() {
        let w = LowerWrites::for_slots(1);
        let g = w.begin(7);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| w.wait_seen(7));
            // Whether the waiter is asleep yet or not, ending the write lets it return.
            drop(g);
            let seen = waiter
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            assert!(w.unchanged(seen));
        });
    }
}
