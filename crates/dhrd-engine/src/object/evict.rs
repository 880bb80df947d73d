//! Cache mode inside the object: admission of misses, read-ahead requests, eviction, and
//! the deferred zeroing of RAM that left Loaded (`reclaim`).
//!
//! Invariants:
//! - A chunk is evicted only while Loaded, under its mutex, and never after a sticky
//!   failure or when its RAM holds bytes the backing may not (diverged): RAM is never
//!   dirty otherwise, so eviction needs no write.
//! - RAM of a chunk that left Loaded is zeroed only by `reclaim`, after every zero-copy
//!   view that was alive when it left has ended, and only if the chunk's state word is
//!   still the one it had when it left (it was not Loaded again since, so no newer view
//!   can show it). Until then its `ram_stale` flag tells a load not to trust its RAM.
//! - Lock order: chunk mutex, then the pending list; `reclaim` takes the pending list
//!   and lets it go before it takes any chunk mutex.
//!
//! Crash semantics: none; this only moves clean data in or out of RAM.

use super::*;
use crate::ahead::ReadAhead;
use crate::cache::{AccessBits, Admit, CachePolicy};

/// Read-ahead chunks queued per object at most; more are dropped (a later miss asks
/// again).
const AHEAD_QUEUE_MAX: usize = 256;
/// Victims one eviction looks at before it gives up (a victim may have left Loaded by
/// another way since the policy recorded it).
const VICTIM_TRIES_MAX: u32 = 16;
/// How often a reclaiming loader thread looks whether the views it waits for ended.
const RECLAIM_POLL: Duration = Duration::from_micros(50);

/// The slots' access counters, as the policy sees them.
struct SlotBits<'a>(&'a Layout);

impl AccessBits for SlotBits<'_> {
    fn count(&self, c: u64) -> u8 {
        self.0.slots.get(c as usize).map_or(0, |s| s.access_count())
    }
    fn set_count(&self, c: u64, n: u8) {
        if let Some(s) = self.0.slots.get(c as usize) {
            s.set_access_count(n);
        }
    }
}

impl<D: Durable> Inner<D> {
    /// Loads a read asked for may evict: a policy is set and nothing failed for good.
    pub(super) fn eviction_enabled(&self) -> bool {
        self.cfg.cache.policy != CachePolicy::Off && !self.failure.is_failed()
    }

    /// The background pass stops once loads compete for a full budget (it would take the
    /// room an eviction made for an admitted chunk).
    pub(super) fn cache_full(&self) -> bool {
        self.eviction_enabled() && self.cache_active.load(Ordering::Acquire)
    }

    /// Misses go through admission: a pure cache (no prefill), or a hybrid whose budget
    /// ran out.
    pub(super) fn admission_active(&self) -> bool {
        self.eviction_enabled()
            && (!self.cfg.cache.prefill || self.cache_active.load(Ordering::Acquire))
    }

    /// A read found chunk `c` not in RAM and was served from the backing.
    pub(super) fn on_read_miss(&self, c: ChunkIndex) {
        if self.cfg.cache.read_ahead != ReadAhead::None {
            let total = self.geo.chunks_for(self.len.load(Ordering::Acquire));
            let ahead = self.ahead.lock().on_miss(c.0, total);
            self.queue_ahead(ahead);
        }
        if !self.cfg.demand_priority {
            return;
        }
        if self.admission_active() {
            match self.residency.lock().on_miss(c.0) {
                Admit::Load => self.stats.add(C::Admissions, 1),
                Admit::Bypass => {
                    self.stats.add(C::Bypasses, 1);
                    return;
                }
            }
        }
        self.demand(c);
    }

    /// A write went to the backing only because chunk `c` was not in RAM (M4: "writes go
    /// to memory when there is room"). In cache mode the chunk is loaded, the write
    /// included, if the budget has room; a write never evicts (a write-once file would
    /// otherwise push out what is read).
    pub(super) fn on_write_miss(&self, c: ChunkIndex) {
        if self.failure.is_failed() {
            return;
        }
        let limit = self.budget.limit_bytes();
        if self
            .budget
            .used_bytes()
            .saturating_add(self.geo.chunk_bytes())
            <= limit
        {
            self.demand(c);
        }
    }

    /// A read was the first to use chunk `c`, which was read ahead.
    pub(super) fn on_ahead_hit(&self, c: ChunkIndex) {
        self.stats.add(C::AheadUsed, 1);
        let total = self.geo.chunks_for(self.len.load(Ordering::Acquire));
        let ahead = self.ahead.lock().on_ahead_hit(c.0, total);
        self.queue_ahead(ahead);
    }

    fn queue_ahead(&self, chunks: std::ops::Range<u64>) {
        if chunks.is_empty() {
            return;
        }
        {
            let mut q = self.lq.lock();
            for c in chunks {
                if q.ahead.len() >= AHEAD_QUEUE_MAX {
                    break;
                }
                q.ahead.push_back(ChunkIndex(c));
            }
            q.finished = None;
        }
        if let Some(l) = &self.loader {
            l.prioritize(self.weak_target(), self.id);
        }
    }

    /// Evicts one chunk the policy chooses. False when there is nothing to evict.
    pub(super) fn evict_one(&self) -> bool {
        let layout = read_guard(&self.layout);
        for _ in 0..VICTIM_TRIES_MAX {
            let victim = self.residency.lock().victim(&SlotBits(&layout));
            let Some(v) = victim else {
                return false;
            };
            if (v as usize) < layout.slots.len() && self.evict(&layout, ChunkIndex(v)) {
                return true;
            }
        }
        false
    }

    /// Takes chunk `c` out of RAM if it is Loaded and may leave (see the header).
    fn evict(&self, layout: &Layout, c: ChunkIndex) -> bool {
        let slot = layout.slot(c);
        let evicted = slot.with_state_stale(|st, stale| {
            if st != ChunkState::Loaded
                || self.failure.is_failed()
                || self.diverged.lock().contains(&c.0)
            {
                return false;
            }
            slot.set_state(ChunkState::Unloaded);
            *stale = true;
            self.add_pending(layout, c);
            true
        });
        if !evicted {
            return false;
        }
        if slot.clear_meta() {
            self.stats.add(C::AheadWasted, 1);
        }
        self.release_chunk(c);
        self.loaded_chunks.fetch_sub(1, Ordering::AcqRel);
        self.stats.add(C::Evictions, 1);
        true
    }

    /// Queues chunk `c`, which just left Loaded (its mutex held), for zeroing.
    pub(super) fn add_pending(&self, layout: &Layout, c: ChunkIndex) {
        let word = layout.word(c);
        self.pending.lock().push((c.0, word));
        self.pending_any.store(true, Ordering::Release);
    }

    /// Counts a view in the current view epoch; returns the counter to decrement when
    /// the view ends.
    pub(super) fn enter_view(&self) -> &AtomicU64 {
        loop {
            let e = self.view_epoch.load(Ordering::SeqCst);
            let live = &self.views_live[(e & 1) as usize];
            live.fetch_add(1, Ordering::SeqCst);
            // A reclaimer that flipped the epoch meanwhile may already have seen this
            // counter drain: count again in the new epoch.
            if self.view_epoch.load(Ordering::SeqCst) == e {
                return live;
            }
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Zeroes the RAM of chunks that left Loaded, once no view can be showing it. Called
    /// with no lock held. With `wait` (loader threads only, which hold no view) it flips
    /// the view epoch and waits for the views of the old one to end; views that start
    /// after the flip already see the chunks out of Loaded, so it cannot be starved.
    /// Without `wait` it zeroes only if no view is out at all, and otherwise leaves the
    /// work to the loader: a request thread may itself hold a view.
    pub(super) fn reclaim(&self, wait: bool) {
        if !self.pending_any.load(Ordering::Acquire) {
            return;
        }
        let _one = if wait {
            self.reclaim_lock.lock()
        } else {
            match self.reclaim_lock.try_lock() {
                Some(g) => g,
                None => return,
            }
        };
        self.pending_any.store(false, Ordering::Release);
        let list = std::mem::take(&mut *self.pending.lock());
        if list.is_empty() {
            return;
        }
        // Every chunk in the list left Loaded before this fence; a view counted after it
        // sees that and does not use the chunk.
        fence(Ordering::SeqCst);
        if wait {
            let old = self.view_epoch.fetch_add(1, Ordering::SeqCst);
            let live = &self.views_live[(old & 1) as usize];
            while live.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(RECLAIM_POLL);
            }
        } else if self.views_live.iter().any(|l| l.load(Ordering::SeqCst) > 0) {
            let mut p = self.pending.lock();
            p.extend(list);
            drop(p);
            self.pending_any.store(true, Ordering::Release);
            self.kick_loader();
            return;
        }
        let layout = read_guard(&self.layout);
        let file_bytes = layout.ram.file_bytes();
        for (i, word) in list {
            let c = ChunkIndex(i);
            if i as usize >= layout.slots.len() {
                continue;
            }
            let slot = layout.slot(c);
            slot.with_state_stale(|_, stale| {
                // A changed word means the chunk was loaded (or is loading) since: that
                // load wrote its RAM, or knows from `ram_stale` that it must.
                if !*stale || layout.word(c) != word {
                    return;
                }
                let start = self.geo.start_of(c);
                let end = self.geo.end_of(c).min(file_bytes);
                if end > start && layout.ram.zero(start, end - start).is_err() {
                    // Left stale: a later load writes all of it; only memory is lost.
                    return;
                }
                *stale = false;
            });
        }
    }
}
