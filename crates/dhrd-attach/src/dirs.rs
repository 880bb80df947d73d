//! The directories of a subdirectory attach (`watch::Scope::Tree`) as the watch keeps
//! them: those marked, whether each hears the creation of its entries now, and those made
//! in the tree that wait for their adoption. Bookkeeping only: the watch makes the system
//! calls this decides on, so the policy is tested without a kernel.
//!
//! Why a directory stops hearing creations for a while (`CREATE_MUTE`): every file created
//! in a marked directory queues a `FAN_CREATE` event in the creating call, and the daemon
//! reads each on the other CPU, though all it does with one is to note the file for a pin
//! `CHANGED_DELAY` later. Where files are made in a burst (create, stat and unlink of many
//! small files, a spool), the watch takes `FAN_CREATE` off the directory's mark at the
//! first creation it reads, puts it back `CREATE_MUTE` later and then reads the directory
//! (a rescan) for the files made meanwhile: one event and one read of the directory per
//! period instead of an event per file. The mark is back before the rescan reads, so a
//! file made at that moment is heard or read, or both (noting a file twice keeps its first
//! place).
//!
//! What a rescan costs is a read of every entry (a name-to-handle call each, and the
//! files it does not know noted again), more than an event costs per entry; and what a
//! mute saves is the creations of the next `CREATE_MUTE`. So a directory is muted only
//! while the creations heard in it since its last rescan, per second of that time (one
//! second at least), reach `CREATES_PER_S_PER_ENTRY` times the entries that rescan read.
//! A directory never rescanned is muted at its first creation: its first rescan has no
//! bound, once per directory. (Measured with the fileserver workload over 32,000 files in
//! directories of 20, where each directory hears some tens of creations a second: muted
//! whenever its creations outnumbered an eighth of its entries, the daemon used 1.9-2.05 s
//! of CPU in 10 s against 1.37-1.58 s with no muting, for 8,500 rescans; at a second of
//! creations per two entries, 1.75-2.05 s.)
//!
//! Invariants: a muted directory is marked and has one place in the unmute queue (a place
//! whose directory was unmarked or unmuted meanwhile is skipped); a made directory waits at
//! most once (`made_keys` mirrors the queue); at most `MADE_MAX` wait. Crash semantics:
//! none (memory only; the marks vanish with the process).

use crate::handle::Handle;
use dhrd_pagecache::resident::CHANGED_DELAY;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// How long a directory goes without hearing the creation of its entries after the first
/// one it heard in a burst. Short against `CHANGED_DELAY`: a file made in it waits this
/// long more for its pin at most.
pub const CREATE_MUTE: Duration = Duration::from_secs(1);
/// Creations a second per entry of its last rescan that keep a directory muted (see the
/// module header): a rescan must be paid for by the events of the period it ends.
pub const CREATES_PER_S_PER_ENTRY: u64 = 2;
/// Directories made in the tree that wait for their adoption at most; past it the oldest
/// is adopted early. About 100 bytes each (a handle, its key and due time).
pub const MADE_MAX: usize = 65_536;

/// A marked directory.
#[derive(Debug)]
struct Marked {
    handle: Handle,
    /// Creations heard since the last rescan (or the mark).
    creates_heard: u64,
    /// When the last rescan read the directory (or it was marked).
    since: Instant,
    /// Entries the last rescan read (0: never rescanned).
    entries_read: u64,
    /// `FAN_CREATE` is off its mark until its place in the unmute queue comes.
    muted: bool,
}

#[derive(Debug, Default)]
pub struct Dirs {
    marked: HashMap<u64, Marked>,
    unmute: VecDeque<(Instant, u64)>,
    made: VecDeque<(Instant, Handle)>,
    made_keys: HashSet<u64>,
}

impl Dirs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Directory `h` is marked (again: what it was keeps).
    pub fn mark(&mut self, h: Handle, now: Instant) {
        self.marked.entry(h.key()).or_insert(Marked {
            handle: h,
            creates_heard: 0,
            since: now,
            entries_read: 0,
            muted: false,
        });
    }

    /// Directory `key` left the tree or is gone.
    pub fn unmark(&mut self, key: u64) {
        self.marked.remove(&key);
    }

    pub fn is_marked(&self, key: u64) -> bool {
        self.marked.contains_key(&key)
    }

    pub fn marked_count(&self) -> usize {
        self.marked.len()
    }

    pub fn handles(&self) -> Vec<Handle> {
        self.marked.values().map(|m| m.handle.clone()).collect()
    }

    /// A creation heard in directory `key` at `now`: whether to take `FAN_CREATE` off its
    /// mark (the caller does, then calls `muted`). Never for an unmarked or muted directory.
    pub fn heard_create(&mut self, key: u64, now: Instant) -> Option<Handle> {
        let m = self.marked.get_mut(&key)?;
        if m.muted {
            return None;
        }
        m.creates_heard += 1;
        let secs = now
            .saturating_duration_since(m.since)
            .max(CREATE_MUTE)
            .as_secs_f64();
        let per_s = m.creates_heard as f64 / secs;
        (per_s >= (m.entries_read * CREATES_PER_S_PER_ENTRY) as f64).then(|| m.handle.clone())
    }

    /// Directory `key`'s mark no longer asks for creations; they are heard again
    /// `CREATE_MUTE` after `now`.
    pub fn muted(&mut self, key: u64, now: Instant) {
        if let Some(m) = self.marked.get_mut(&key) {
            debug_assert!(!m.muted, "a directory muted twice");
            m.muted = true;
            self.unmute.push_back((now + CREATE_MUTE, key));
        }
    }

    /// The next muted directory whose time is up, now counted as hearing creations (the
    /// caller puts `FAN_CREATE` back on its mark and rescans it).
    pub fn take_unmuted(&mut self, now: Instant) -> Option<Handle> {
        while let Some(&(due, key)) = self.unmute.front() {
            if due > now {
                return None;
            }
            self.unmute.pop_front();
            if let Some(m) = self.marked.get_mut(&key).filter(|m| m.muted) {
                m.muted = false;
                return Some(m.handle.clone());
            }
        }
        None
    }

    /// Directory `key` was rescanned at `now` and held `entries`.
    pub fn rescanned(&mut self, key: u64, entries: u64, now: Instant) {
        if let Some(m) = self.marked.get_mut(&key) {
            m.creates_heard = 0;
            m.entries_read = entries;
            m.since = now;
        }
    }

    /// Directory `h` was made in the tree: it waits `CHANGED_DELAY` for its adoption.
    /// Whether the waiting set is past `MADE_MAX` (the caller adopts the oldest at once).
    pub fn made(&mut self, h: Handle, now: Instant) -> bool {
        if self.made_keys.insert(h.key()) {
            self.made.push_back((now + CHANGED_DELAY, h));
        }
        self.made.len() > MADE_MAX
    }

    pub fn is_waiting(&self, key: u64) -> bool {
        self.made_keys.contains(&key)
    }

    /// Directory `key` is marked or waits for its adoption.
    pub fn knows(&self, key: u64) -> bool {
        self.is_marked(key) || self.is_waiting(key)
    }

    pub fn made_waiting(&self) -> usize {
        self.made.len()
    }

    /// The oldest made directory if it is due (or `anyway`), taken out of the waiting set.
    pub fn take_made(&mut self, now: Instant, anyway: bool) -> Option<Handle> {
        match self.made.front() {
            Some((due, _)) if *due <= now || anyway => {
                let (_, h) = self.made.pop_front()?;
                self.made_keys.remove(&h.key());
                Some(h)
            }
            _ => None,
        }
    }

    /// When the next made directory or muted one comes due.
    pub fn next_due(&self) -> Option<Instant> {
        let made = self.made.front().map(|(t, _)| *t);
        let unmute = self.unmute.front().map(|(t, _)| *t);
        [made, unmute].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Handle {
        Handle {
            handle_type: 1,
            bytes: vec![n; 8],
        }
    }

    #[test]
    fn a_directory_never_rescanned_is_muted_at_its_first_creation_and_heard_again_later() {
        let mut d = Dirs::new();
        let t0 = Instant::now();
        d.mark(h(1), t0);
        let k = h(1).key();
        assert_eq!(d.heard_create(k, t0), Some(h(1)));
        d.muted(k, t0);
        // Muted: a creation that was queued before the mark changed asks nothing more.
        assert_eq!(d.heard_create(k, t0), None);
        assert_eq!(d.take_unmuted(t0 + CREATE_MUTE / 2), None);
        assert_eq!(d.next_due(), Some(t0 + CREATE_MUTE));
        assert_eq!(d.take_unmuted(t0 + CREATE_MUTE), Some(h(1)));
        assert_eq!(d.take_unmuted(t0 + CREATE_MUTE), None);
        assert_eq!(d.next_due(), None);
    }

    #[test]
    fn a_directory_is_muted_only_while_its_creations_a_second_pay_for_the_rescan() {
        let mut d = Dirs::new();
        let t0 = Instant::now();
        d.mark(h(1), t0);
        let k = h(1).key();
        d.rescanned(k, 50, t0);
        // 100 creations within the first second pay for a read of the 50 entries.
        let half = t0 + CREATE_MUTE / 2;
        for _ in 0..99 {
            assert_eq!(d.heard_create(k, half), None);
        }
        assert_eq!(d.heard_create(k, half), Some(h(1)));
        d.muted(k, half);
        assert!(d.take_unmuted(half + CREATE_MUTE).is_some());
        // The same 100 spread over ten seconds do not.
        let t1 = half + CREATE_MUTE;
        d.rescanned(k, 50, t1);
        for i in 0..100u32 {
            assert_eq!(
                d.heard_create(k, t1 + CREATE_MUTE * 10 * i / 100 + CREATE_MUTE),
                None
            );
        }
        // A small directory: four creations in a second.
        d.rescanned(k, 2, t1);
        for _ in 0..3 {
            assert_eq!(d.heard_create(k, t1), None);
        }
        assert_eq!(d.heard_create(k, t1), Some(h(1)));
    }

    #[test]
    fn an_unmarked_directory_is_neither_muted_nor_unmuted() {
        let mut d = Dirs::new();
        let t0 = Instant::now();
        assert_eq!(d.heard_create(h(1).key(), t0), None);
        d.mark(h(1), t0);
        let k = h(1).key();
        assert!(d.heard_create(k, t0).is_some());
        d.muted(k, t0);
        d.unmark(k);
        assert_eq!(d.take_unmuted(t0 + CREATE_MUTE), None);
        // Marked again (moved back in): a fresh directory, not a muted one.
        d.mark(h(1), t0);
        assert_eq!(d.take_unmuted(t0 + CREATE_MUTE), None);
        assert!(d.heard_create(k, t0).is_some());
    }

    #[test]
    fn made_directories_wait_once_each_in_due_order() {
        let mut d = Dirs::new();
        let t0 = Instant::now();
        assert!(!d.made(h(1), t0));
        assert!(!d.made(h(2), t0 + Duration::from_millis(1)));
        assert!(!d.made(h(1), t0 + Duration::from_millis(2)));
        assert_eq!(d.made_waiting(), 2);
        assert!(d.is_waiting(h(1).key()));
        assert_eq!(d.take_made(t0, false), None);
        assert_eq!(d.take_made(t0, true), Some(h(1)));
        assert!(!d.is_waiting(h(1).key()));
        assert_eq!(
            d.next_due(),
            Some(t0 + Duration::from_millis(1) + CHANGED_DELAY)
        );
        assert_eq!(d.take_made(t0 + CHANGED_DELAY * 2, false), Some(h(2)));
        assert_eq!(d.made_waiting(), 0);
    }

    #[test]
    fn past_the_bound_the_caller_is_told_to_adopt_the_oldest() {
        let mut d = Dirs::new();
        let t0 = Instant::now();
        for i in 0..MADE_MAX as u32 {
            let h = Handle {
                handle_type: 1,
                bytes: i.to_ne_bytes().to_vec(),
            };
            assert!(!d.made(h, t0));
        }
        assert!(d.made(h(255), t0));
    }
}
