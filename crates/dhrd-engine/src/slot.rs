//! One chunk's state word and its range lock.
//!
//! The state word packs the chunk state (requirements I1-I11) with a generation that is bumped
//! whenever the chunk leaves Loaded, so a lock-free reader can check that the chunk stayed
//! Loaded throughout its copy (seqlock style).
//!
//! The range lock decides who may touch the chunk:
//! - writers register the byte range they write; writers of disjoint ranges share the
//!   chunk (small sequential writes to one chunk then share one backing sync instead of
//!   paying one each), overlapping writers queue, so RAM receives overlapping writes in the
//!   order the backing did;
//! - a writer of a chunk wholly past the end ("fresh") takes the chunk exclusively, since
//!   it will turn the chunk Loaded without reading it;
//! - the loader waits until no writer holds the chunk (I3: the loaded copy includes every
//!   write that reached the backing), and from the moment it waits, new writers wait too,
//!   so a stream of writes cannot starve it; while it loads, writers wait (I1);
//! - state transitions happen under the lock's mutex, or under the exclusive layout lock
//!   (a size change, when no request or load can look); Loading is entered and left only
//!   through `begin_load` / `end_load` (asserted in `set_state`).
//!
//! Crash semantics: none; this is volatile coordination only.

use crate::cache::ACCESS_COUNT_MAX;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// State of one chunk (requirements I1-I11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    Unloaded,
    Loading,
    Loaded,
}

const STATE_MASK: u32 = 0b11;
const GEN_ONE: u32 = 0b100;

pub(crate) fn state_of(word: u32) -> ChunkState {
    match word & STATE_MASK {
        1 => ChunkState::Loading,
        2 => ChunkState::Loaded,
        _ => ChunkState::Unloaded,
    }
}

#[derive(Default)]
pub(crate) struct Holders {
    loading: bool,
    loader_waiting: u32,
    exclusive: bool,
    /// Byte ranges `[start, end)` of the writers inside the chunk.
    writers: Vec<(u64, u64)>,
    /// The chunk left Loaded (or a load failed) and its RAM was not zeroed yet: a load
    /// must write every byte of it, and "Unloaded RAM is zero" does not hold for it.
    pub(crate) ram_stale: bool,
}

/// Bits of a slot's `meta`: the access count of cache mode (two bits) and the mark of a
/// chunk read ahead and not yet read.
const META_COUNT_MASK: u8 = 0b011;
const META_AHEAD: u8 = 0b100;

pub(crate) struct Slot {
    /// `generation << 2 | state`.
    pub(crate) word: AtomicU32,
    /// Cache bookkeeping, advisory: racing updates may lose a count, never a state.
    meta: AtomicU8,
    holders: Mutex<Holders>,
    cv: Condvar,
}

/// How a writer holds a chunk; released on drop.
pub(crate) struct WriteHold<'a> {
    slot: &'a Slot,
    range: (u64, u64),
    exclusive: bool,
}

impl Drop for WriteHold<'_> {
    fn drop(&mut self) {
        let mut g = self.slot.holders.lock();
        if self.exclusive {
            debug_assert!(g.exclusive, "an exclusive hold released twice");
            g.exclusive = false;
        } else {
            let i = g.writers.iter().position(|r| *r == self.range);
            debug_assert!(i.is_some(), "a writer's range was not registered");
            if let Some(i) = i {
                g.writers.swap_remove(i);
            }
        }
        drop(g);
        self.slot.cv.notify_all();
    }
}

/// What a writer found when it got the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    Loaded,
    /// Unloaded, inside the data.
    Unloaded,
    /// Unloaded and wholly past the end; held exclusively.
    Fresh,
}

/// The loader's claim on a chunk, from `begin_load`.
pub(crate) enum LoadClaim<'a> {
    /// The chunk is Loading and ours; finish with `end_load`.
    Claimed(MutexGuard<'a, Holders>),
    /// Not Unloaded any more (a writer made it fresh-Loaded, or another loader was first).
    NotNeeded,
}

impl Slot {
    pub(crate) fn new() -> Self {
        Self {
            word: AtomicU32::new(0),
            meta: AtomicU8::new(0),
            holders: Mutex::new(Holders::default()),
            cv: Condvar::new(),
        }
    }

    /// A read used the chunk. Returns true for the first read of a chunk read ahead.
    /// On the lock-free read path: a plain load when the count is saturated.
    #[inline]
    pub(crate) fn touch(&self) -> bool {
        let m = self.meta.load(Ordering::Relaxed);
        if m & META_COUNT_MASK >= ACCESS_COUNT_MAX && m & META_AHEAD == 0 {
            return false;
        }
        let prev = self
            .meta
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                let n = (m & META_COUNT_MASK)
                    .saturating_add(1)
                    .min(ACCESS_COUNT_MAX);
                Some((m & !META_COUNT_MASK & !META_AHEAD) | n)
            })
            .unwrap_or(m);
        prev & META_AHEAD != 0
    }

    pub(crate) fn access_count(&self) -> u8 {
        self.meta.load(Ordering::Relaxed) & META_COUNT_MASK
    }

    pub(crate) fn set_access_count(&self, n: u8) {
        let n = n.min(ACCESS_COUNT_MAX);
        let _ = self
            .meta
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m & !META_COUNT_MASK) | n)
            });
    }

    /// Resets the bookkeeping of a chunk entering RAM; `ahead` marks a read-ahead load.
    pub(crate) fn reset_meta(&self, ahead: bool) {
        self.meta
            .store(if ahead { META_AHEAD } else { 0 }, Ordering::Relaxed);
    }

    /// Clears the bookkeeping of a chunk leaving RAM; true if it was read ahead and never
    /// read.
    pub(crate) fn clear_meta(&self) -> bool {
        self.meta.swap(0, Ordering::Relaxed) & META_AHEAD != 0
    }

    #[inline]
    pub(crate) fn state(&self) -> ChunkState {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// Sets the state of a chunk that is not being loaded (Unloaded <-> Loaded); leaving
    /// Loaded bumps the generation so in-flight readers retry. Callers hold the range
    /// lock's mutex or have the object to themselves.
    pub(crate) fn set_state(&self, s: ChunkState) {
        // Loading is entered only by `begin_load` and left only by `end_load`, which keep
        // the `loading` flag in step with it.
        debug_assert!(
            s != ChunkState::Loading && self.state() != ChunkState::Loading,
            "chunk state {:?} -> {s:?} outside a load claim",
            self.state()
        );
        self.store_state(s);
    }

    fn store_state(&self, s: ChunkState) {
        let w = self.word.load(Ordering::Relaxed);
        let gen = if state_of(w) == ChunkState::Loaded && s != ChunkState::Loaded {
            (w & !STATE_MASK).wrapping_add(GEN_ONE)
        } else {
            w & !STATE_MASK
        };
        let bits = match s {
            ChunkState::Unloaded => 0,
            ChunkState::Loading => 1,
            ChunkState::Loaded => 2,
        };
        self.word.store(gen | bits, Ordering::Release);
    }

    /// Waits until `[start, end)` may be written and registers it. `past_end` says whether
    /// the chunk lies wholly past the object's end (checked once the chunk is free).
    /// Returns whether the wait included a load (I1).
    pub(crate) fn acquire_write(
        &self,
        start: u64,
        end: u64,
        past_end: impl Fn() -> bool,
    ) -> (WriteHold<'_>, Found, bool) {
        debug_assert!(start < end, "an empty write range [{start}, {end})");
        let mut g = self.holders.lock();
        let mut waited_on_load = false;
        loop {
            let overlap = g.writers.iter().any(|&(a, b)| a < end && start < b);
            if !(g.loading || g.loader_waiting > 0 || g.exclusive || overlap) {
                let found = match self.state() {
                    ChunkState::Loaded => Found::Loaded,
                    ChunkState::Loading => unreachable!("Loading without the loading flag"),
                    ChunkState::Unloaded if past_end() => {
                        // Writers inside a chunk past the end are impossible: the end
                        // only shrinks with the object to itself (exclusive layout lock).
                        debug_assert!(g.writers.is_empty(), "writers inside a chunk past the end");
                        if g.writers.is_empty() {
                            Found::Fresh
                        } else {
                            // Release builds wait it out rather than corrupt the chunk.
                            self.cv.wait(&mut g);
                            continue;
                        }
                    }
                    ChunkState::Unloaded => Found::Unloaded,
                };
                let exclusive = found == Found::Fresh;
                if exclusive {
                    g.exclusive = true;
                } else {
                    g.writers.push((start, end));
                }
                return (
                    WriteHold {
                        slot: self,
                        range: (start, end),
                        exclusive,
                    },
                    found,
                    waited_on_load,
                );
            }
            waited_on_load |= g.loading;
            self.cv.wait(&mut g);
        }
    }

    /// Runs `f` with the chunk's current state while no state change can happen.
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(ChunkState) -> R) -> R {
        let _g = self.holders.lock();
        f(self.state())
    }

    /// Like `with_state`, with the chunk's `ram_stale` flag.
    pub(crate) fn with_state_stale<R>(&self, f: impl FnOnce(ChunkState, &mut bool) -> R) -> R {
        let mut g = self.holders.lock();
        f(self.state(), &mut g.ram_stale)
    }

    /// Waits until no writer holds the chunk (new writers wait behind us), then claims it
    /// for loading if it is still Unloaded and `admit` agrees (the RAM budget).
    pub(crate) fn begin_load(&self, admit: impl FnOnce() -> bool) -> Result<LoadClaim<'_>, ()> {
        let mut g = self.holders.lock();
        g.loader_waiting += 1;
        while g.loading || g.exclusive || !g.writers.is_empty() {
            self.cv.wait(&mut g);
        }
        g.loader_waiting -= 1;
        if self.state() != ChunkState::Unloaded {
            drop(g);
            self.cv.notify_all();
            return Ok(LoadClaim::NotNeeded);
        }
        if !admit() {
            drop(g);
            self.cv.notify_all();
            return Err(());
        }
        debug_assert!(
            g.writers.is_empty() && !g.exclusive,
            "a load claim beside a writer"
        );
        g.loading = true;
        self.store_state(ChunkState::Loading);
        Ok(LoadClaim::Claimed(g))
    }

    /// Ends a load begun with `begin_load`: the chunk becomes `to` (Loaded or Unloaded).
    pub(crate) fn end_load(&self, mut g: MutexGuard<'_, Holders>, to: ChunkState) {
        debug_assert!(g.loading, "end_load without a claim");
        debug_assert_eq!(
            self.state(),
            ChunkState::Loading,
            "a claimed chunk is Loading"
        );
        debug_assert_ne!(to, ChunkState::Loading, "a load ends Loaded or Unloaded");
        self.store_state(to);
        g.loading = false;
        drop(g);
        self.cv.notify_all();
    }

    /// Releases the mutex during the bulk read while the chunk stays claimed.
    pub(crate) fn unlocked_while<R>(g: &mut MutexGuard<'_, Holders>, f: impl FnOnce() -> R) -> R {
        MutexGuard::unlocked(g, f)
    }
}

/// Slots per page of the chunk table (1 GiB of data at the default 1 MiB chunk).
const SLOTS_PER_PAGE: usize = 1024;

/// The chunk table: pages of slots allocated when a writer or the loader first touches one
/// of their chunks, so opening an object costs the same whatever its size (I7).
/// Readers of a chunk in a page never touched see Unloaded without allocating. A page holds
/// only the slots the table covers when it is allocated (a one-chunk file gets one slot,
/// not a full page of about 56 KB) and is lengthened when the table grows.
pub(crate) struct SlotTable {
    pages: Vec<std::sync::OnceLock<Box<[Slot]>>>,
    chunks: usize,
}

impl SlotTable {
    pub(crate) fn new(chunks: usize) -> Self {
        let mut t = Self {
            pages: Vec::new(),
            chunks: 0,
        };
        t.resize(chunks);
        t
    }

    /// Grows (never shrinks) to cover `chunks` chunks. Needs exclusive access.
    pub(crate) fn resize(&mut self, chunks: usize) {
        let pages = chunks.div_ceil(SLOTS_PER_PAGE);
        if pages > self.pages.len() {
            self.pages.resize_with(pages, std::sync::OnceLock::new);
        }
        self.chunks = self.chunks.max(chunks);
        for p in 0..self.pages.len() {
            let want = self.page_len(p);
            if let Some(slots) = self.pages.get_mut(p).and_then(|pg| pg.get_mut()) {
                if slots.len() < want {
                    // Exclusive access: no slot is borrowed, so moving them is safe.
                    let mut v = std::mem::take(slots).into_vec();
                    v.resize_with(want, Slot::new);
                    *slots = v.into_boxed_slice();
                }
            }
        }
    }

    /// Slots page `p` holds at the table's current length.
    fn page_len(&self, p: usize) -> usize {
        self.chunks
            .saturating_sub(p * SLOTS_PER_PAGE)
            .min(SLOTS_PER_PAGE)
    }

    pub(crate) fn len(&self) -> usize {
        self.chunks
    }

    /// The slot of chunk `i`, allocating its page on first use.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&Slot> {
        if i >= self.chunks {
            return None;
        }
        let p = i / SLOTS_PER_PAGE;
        let page = self.pages.get(p)?;
        let slots = page.get_or_init(|| (0..self.page_len(p)).map(|_| Slot::new()).collect());
        slots.get(i % SLOTS_PER_PAGE)
    }

    /// The state word of chunk `i` without allocating (0, Unloaded, for untouched pages).
    #[inline]
    pub(crate) fn word(&self, i: usize) -> u32 {
        self.pages
            .get(i / SLOTS_PER_PAGE)
            .and_then(|p| p.get())
            .and_then(|s| s.get(i % SLOTS_PER_PAGE))
            .map_or(0, |s| s.word.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pages_are_lazy_and_cross_boundaries() {
        let mut t = SlotTable::new(3 * SLOTS_PER_PAGE + 5);
        assert_eq!(t.len(), 3 * SLOTS_PER_PAGE + 5);
        assert!(
            t.pages.iter().all(|p| p.get().is_none()),
            "open allocated slots"
        );
        // Readers see Unloaded without allocating.
        assert_eq!(
            state_of(t.word(2 * SLOTS_PER_PAGE + 7)),
            ChunkState::Unloaded
        );
        assert!(t.pages.iter().all(|p| p.get().is_none()));
        let last = 3 * SLOTS_PER_PAGE + 4;
        for i in [last, SLOTS_PER_PAGE - 1] {
            if let Some(s) = t.get(i) {
                s.set_state(ChunkState::Loaded);
            }
        }
        assert_eq!(state_of(t.word(last)), ChunkState::Loaded);
        assert_eq!(state_of(t.word(SLOTS_PER_PAGE - 1)), ChunkState::Loaded);
        assert_eq!(state_of(t.word(SLOTS_PER_PAGE)), ChunkState::Unloaded);
        assert_eq!(t.pages.iter().filter(|p| p.get().is_some()).count(), 2);
        assert!(t.get(last + 1).is_none());
        t.resize(4 * SLOTS_PER_PAGE + 1);
        assert_eq!(
            state_of(t.word(last)),
            ChunkState::Loaded,
            "growth lost a state"
        );
        assert!(t.get(4 * SLOTS_PER_PAGE).is_some());
    }

    #[test]
    fn a_short_page_grows_with_the_table_and_keeps_its_states() {
        let mut t = SlotTable::new(1);
        if let Some(s) = t.get(0) {
            s.set_state(ChunkState::Loaded);
        }
        assert_eq!(
            t.pages[0].get().map(|p| p.len()),
            Some(1),
            "one slot for one chunk"
        );
        assert!(t.get(1).is_none());
        t.resize(3);
        assert_eq!(t.pages[0].get().map(|p| p.len()), Some(3));
        assert_eq!(
            state_of(t.word(0)),
            ChunkState::Loaded,
            "growth lost a state"
        );
        assert_eq!(state_of(t.word(2)), ChunkState::Unloaded);
        assert!(t.get(2).is_some());
        t.resize(SLOTS_PER_PAGE + 2);
        assert_eq!(t.pages[0].get().map(|p| p.len()), Some(SLOTS_PER_PAGE));
        assert!(t.get(SLOTS_PER_PAGE + 1).is_some());
        assert_eq!(t.pages[1].get().map(|p| p.len()), Some(2));
        assert_eq!(state_of(t.word(0)), ChunkState::Loaded);
    }
}
