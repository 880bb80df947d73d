//! Files made or closed after writing that wait for their pin: how long they wait, in what order,
//! and how many a second are handed on (the warm-up's residency policy for changed files,
//! used by the attach daemon's watch; the FUSE mount refreshes a file at its release).
//!
//! Why wait and why a rate: a file written and deleted within `CHANGED_DELAY` costs no
//! system call at all; under churn most pins of written files are made for files deleted
//! seconds later, and each pin and unpin costs the daemon CPU on the application's CPUs
//! (measured in docs/attach.md, "Pins of written files at a bounded rate"). A file
//! waiting has its pages in the page cache (its writes put them there), only not locked.
//!
//! Invariants: files are handed on oldest first, none before it is due, at most
//! `CHANGED_HANDOFF_BURST` at once and `CHANGED_HANDOFFS_PER_S` a second unless the caller
//! forces one (its set is full, `CHANGED_MAX`); a file removed while it waits uses no
//! hand-off, nor does one its caller finds gone when it is handed on (`refund`); the queue of places holds at most one place per waiting file after each
//! compaction, which runs once stale places outnumber the waiting files (plus 1,024).
//! Crash semantics: none (memory only; a file never handed on stays cached, unpinned).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// How long a file made or closed after writing waits before the warm-up hears of it: a
/// file written and deleted within this time (a temporary file, a mail spool's message,
/// the fileserver's files) is never pinned, and costs the daemon at most a failed open.
/// The warm-up adds its own delay before it pins a changed file again
/// ([`REFRESH_DELAY`](super::REFRESH_DELAY)), so nothing is pinned sooner either way.
pub const CHANGED_DELAY: Duration = Duration::from_secs(2);
/// Files closed after writing that wait at most; past it, the oldest is handed on early
/// (whatever the rate below allows). About 100 bytes each in the attach daemon (a file
/// handle, its key twice), so 26 MiB at most; it reaches that only while more files are
/// written than `CHANGED_HANDOFFS_PER_S` and live longer than the wait.
pub const CHANGED_MAX: usize = 262_144;
/// Changed files handed to the warm-up per second, at most, after a burst of
/// `CHANGED_HANDOFF_BURST`: the pins of written files cost the daemon CPU on the
/// application's CPUs, and under churn most of it is for nothing. Each hand-off is a pin
/// made (open, read what is not cached, map, lock) and, for a file that later changes or
/// goes, unmade: measured 50-60 us of daemon CPU per file on the fileserver workload with
/// 128,000 files, where 7,400 files a second were pinned and most deleted within seconds
/// (0.45 s of CPU a second, the workload at 0.70-0.79x a plain directory; without the
/// pins, 1.0x). At this rate the pins cost about 6% of one CPU; a file waits its turn in
/// the order it was first written, its pages in the page cache meanwhile (only not
/// locked), and one deleted while it waits costs nothing. The files that reach a pin are
/// the ones that lived longest.
pub const CHANGED_HANDOFFS_PER_S: u32 = 1_000;
/// Hand-offs that may go at once after a quiet period (see `CHANGED_HANDOFFS_PER_S`).
pub const CHANGED_HANDOFF_BURST: u32 = 1_000;

/// Files closed after writing, by key, each with what its caller needs to hand it on
/// (`T`: a file handle in the attach daemon), waiting to be handed to the warm-up; and the
/// hand-offs the rate allows now (a token bucket, `CHANGED_HANDOFFS_PER_S`).
pub struct Changed<T> {
    due: VecDeque<(Instant, u64)>,
    files: HashMap<u64, T>,
    tokens: f64,
    refilled: Instant,
}

impl<T> Default for Changed<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Changed<T> {
    pub fn new() -> Self {
        Self {
            due: Default::default(),
            files: HashMap::new(),
            tokens: f64::from(CHANGED_HANDOFF_BURST),
            refilled: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + secs * f64::from(CHANGED_HANDOFFS_PER_S))
            .min(f64::from(CHANGED_HANDOFF_BURST));
        self.refilled = now;
    }

    /// A file closed after writing waits until `due`, or keeps its place if it waits
    /// already.
    pub fn add(&mut self, key: u64, file: T, due: Instant) {
        if self.files.insert(key, file).is_none() {
            self.due.push_back((due, key));
        }
    }

    /// Files waiting now.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// A file that went (or gave up a name) no longer waits. Its place in `due` stays
    /// until it reaches the front, where it is passed over; the queue is compacted when
    /// such places outnumber the waiting files, which bounds it while the rate holds files
    /// back.
    pub fn remove(&mut self, key: u64) {
        if self.files.remove(&key).is_some() && self.due.len() > 2 * self.files.len() + 1024 {
            // One place per waiting file, its oldest: a file deleted by one name and
            // written again under another has a second place (handed on at the first).
            let files = &self.files;
            let mut seen = HashSet::with_capacity(files.len());
            self.due
                .retain(|(_, k)| files.contains_key(k) && seen.insert(*k));
            debug_assert!(self.due.len() <= self.files.len(), "one place per file");
        }
    }

    /// The next file to hand on at `now`: the oldest waiting, if it is due and the rate
    /// allows a hand-off (which it then uses up), or whatever the rate with `anyway`.
    pub fn take(&mut self, now: Instant, anyway: bool) -> Option<T> {
        self.refill(now);
        // Places of files that went meanwhile pass at once, free.
        while self
            .due
            .front()
            .is_some_and(|(_, k)| !self.files.contains_key(k))
        {
            self.due.pop_front();
        }
        let (due, key) = *self.due.front()?;
        if !anyway && (due > now || self.tokens < 1.0) {
            return None;
        }
        self.due.pop_front();
        if !anyway {
            self.tokens -= 1.0;
        }
        self.files.remove(&key)
    }

    /// The file `take` handed on (not forced) was gone: its hand-off is given back. A
    /// caller that hears of a file's creation but not of its deletion (the attach daemon
    /// follows only the files it hands on) finds short-lived files gone this way, and
    /// they must not use up the rate the files that live need.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(f64::from(CHANGED_HANDOFF_BURST));
    }

    /// When the next waiting file may be handed on: when it is due, and not before the
    /// rate allows another hand-off.
    pub fn next_at(&self) -> Option<Instant> {
        let (due, _) = self.due.front()?;
        let short = (1.0 - self.tokens).max(0.0);
        let rate = Duration::from_secs_f64(short / f64::from(CHANGED_HANDOFFS_PER_S));
        Some((*due).max(self.refilled + rate))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use super::*;

    /// `n` files (keys and payloads 0..n) that came due at `t0`, with a full bucket
    /// refilled at `t0`.
    fn waiting(n: u32, t0: Instant) -> Changed<u32> {
        let mut c = Changed::new();
        c.refilled = t0;
        for i in 0..n {
            c.add(u64::from(i), i, t0);
        }
        c
    }

    fn take_all(c: &mut Changed<u32>, now: Instant) -> usize {
        std::iter::from_fn(|| c.take(now, false)).count()
    }

    #[test]
    fn changed_files_are_handed_on_at_the_rate_in_the_order_they_came() {
        let t0 = Instant::now();
        let mut c = waiting(3 * CHANGED_HANDOFF_BURST, t0);
        assert_eq!(c.take(t0, false), Some(0), "oldest first");
        assert_eq!(take_all(&mut c, t0), CHANGED_HANDOFF_BURST as usize - 1);
        // Half a second later, half a second's worth (give or take the float's rounding).
        let later = take_all(&mut c, t0 + Duration::from_millis(500));
        let half = CHANGED_HANDOFFS_PER_S as usize / 2;
        assert!((half - 1..=half).contains(&later), "{later}");
        let next = c.next_at().unwrap();
        assert!(next > t0 + Duration::from_millis(500), "waits for the rate");
        // Whatever the rate, `anyway` hands on the oldest (the set is full).
        assert!(c.take(t0 + Duration::from_millis(500), true).is_some());
    }

    #[test]
    fn a_file_is_not_handed_on_before_it_is_due() {
        let t0 = Instant::now();
        let mut c = waiting(0, t0);
        c.add(7, 7, t0 + CHANGED_DELAY);
        assert_eq!(c.take(t0, false), None);
        assert_eq!(c.next_at(), Some(t0 + CHANGED_DELAY));
        assert_eq!(c.take(t0 + CHANGED_DELAY, false), Some(7));
    }

    #[test]
    fn files_that_went_while_they_waited_cost_no_hand_off_and_their_places_are_bounded() {
        let t0 = Instant::now();
        let n = 20_000;
        let mut c = waiting(n, t0);
        for i in 0..n - 10 {
            c.remove(u64::from(i));
            assert!(c.due.len() <= 2 * c.files.len() + 1024 + 1);
        }
        // The ten left are handed on, none of the places of the others used the rate.
        assert_eq!(take_all(&mut c, t0), 10);
        assert!(c.due.is_empty() && c.files.is_empty());
        assert_eq!(c.tokens, f64::from(CHANGED_HANDOFF_BURST) - 10.0);
    }

    #[test]
    fn files_found_gone_when_handed_on_give_their_hand_off_back() {
        let t0 = Instant::now();
        let mut c = waiting(3 * CHANGED_HANDOFF_BURST, t0);
        // Every odd file is found gone and refunded: the burst then covers twice as many.
        let mut taken = 0;
        while let Some(i) = c.take(t0, false) {
            taken += 1;
            if i % 2 == 1 {
                c.refund();
            }
        }
        assert_eq!(taken, 2 * CHANGED_HANDOFF_BURST as usize - 1);
        // Refunds never fill the bucket past its burst.
        for _ in 0..2 * CHANGED_HANDOFF_BURST {
            c.refund();
        }
        assert_eq!(c.tokens, f64::from(CHANGED_HANDOFF_BURST));
    }
}
