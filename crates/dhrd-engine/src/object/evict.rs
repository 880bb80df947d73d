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
//! - `reclaim` never waits, for a view or for another reclaimer: a view lives as long as
//!   its holder likes (an NBD reply to a slow client), and a loader thread waiting for one
//!   would stop loading for every reader of the object. A batch whose views are still out
//!   is kept (one at a time, in `reclaiming`) and finished by whichever later call finds
//!   them ended; the loader looks again every [`RECLAIM_POLL`] meanwhile, between loads.
//! - Lock order: chunk mutex, then the pending list; `reclaim` takes the pending list
//!   and lets it go before it takes any chunk mutex; the `reclaiming` mutex is only ever
//!   tried, never waited for.
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
/// How soon the loader looks again whether the views a reclaim batch waits for ended,
/// when no request or load has finished it meanwhile.
pub(super) const RECLAIM_POLL: Duration = Duration::from_millis(1);
/// `reclaim_epoch` when no batch waits.
pub(super) const NO_EPOCH: u64 = u64::MAX;

/// Chunks that left Loaded before the view epoch moved past `epoch`: their RAM is zeroed
/// once the views counted in `epoch` have ended.
pub(super) struct ReclaimBatch {
    chunks: Vec<(u64, u32)>,
    epoch: u64,
}

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
        let loaded_before = self.loaded_chunks.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(loaded_before > 0, "more chunks left Loaded than entered it");
        self.stats.add(C::Evictions, 1);
        true
    }

    /// Queues chunk `c`, which just left Loaded (its mutex held) or failed a load (just
    /// after: a word read after a reload makes `zero_left` skip the chunk), for zeroing.
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

    /// Whether `reclaim` would make progress now: a batch whose views have all ended, or
    /// chunks pending and no batch waiting (then it starts one). Lock-free, for the loader.
    pub(super) fn reclaim_due(&self) -> bool {
        match self.reclaim_epoch.load(Ordering::Acquire) {
            NO_EPOCH => self.pending_any.load(Ordering::Acquire),
            e => self.views_of(e).load(Ordering::SeqCst) == 0,
        }
    }

    /// Whether a batch waits for views to end (the loader must look again later).
    pub(super) fn reclaim_waiting(&self) -> bool {
        self.reclaim_epoch.load(Ordering::Acquire) != NO_EPOCH
    }

    fn views_of(&self, epoch: u64) -> &AtomicU64 {
        &self.views_live[(epoch & 1) as usize]
    }

    /// Zeroes the RAM of chunks that left Loaded, once no view can be showing it. Never
    /// waits (see the header): it returns at once when another thread reclaims, finishes
    /// the waiting batch if its views have ended, then starts a batch of the chunks pending
    /// now by moving the view epoch on (views that start after the move already see the
    /// chunks out of Loaded, so the old epoch's views only drain), and zeroes it at once if
    /// the old epoch has no view out. Called with no lock held, from any thread; a thread
    /// holding a view may call it too, since nothing here waits for a view.
    pub(super) fn reclaim(&self) {
        if !self.reclaim_waiting() && !self.pending_any.load(Ordering::Acquire) {
            return;
        }
        let Some(mut batch) = self.reclaiming.try_lock() else {
            return;
        };
        if let Some(b) = batch.as_ref() {
            if self.views_of(b.epoch).load(Ordering::SeqCst) > 0 {
                return;
            }
            if let Some(b) = batch.take() {
                self.reclaim_epoch.store(NO_EPOCH, Ordering::Release);
                self.zero_left(&b.chunks);
            }
        }
        if !self.pending_any.swap(false, Ordering::AcqRel) {
            return;
        }
        let list = std::mem::take(&mut *self.pending.lock());
        if list.is_empty() {
            return;
        }
        // Every chunk in the list left Loaded before this fence; a view counted after it
        // sees that and does not use the chunk.
        fence(Ordering::SeqCst);
        let old = self.view_epoch.fetch_add(1, Ordering::SeqCst);
        if self.views_of(old).load(Ordering::SeqCst) == 0 {
            self.zero_left(&list);
            return;
        }
        *batch = Some(ReclaimBatch {
            chunks: list,
            epoch: old,
        });
        self.reclaim_epoch.store(old, Ordering::Release);
        drop(batch);
        // The loader keeps the object queued and looks again (`next_job_inner`).
        self.kick_loader();
    }

    /// Zeroes the RAM of `list`'s chunks that stayed out of Loaded since they left; no
    /// view of the time they were Loaded is alive any more.
    fn zero_left(&self, list: &[(u64, u32)]) {
        let layout = read_guard(&self.layout);
        let file_bytes = layout.ram.file_bytes();
        for &(i, word) in list {
            let c = ChunkIndex(i);
            if i as usize >= layout.slots.len() {
                continue;
            }
            let slot = layout.slot(c);
            slot.with_state_stale(|st, stale| {
                // Whatever leaves Loaded marks the RAM stale, a load clears the mark before
                // it turns the chunk Loaded: a stale Loaded chunk would be zeroed here.
                debug_assert!(
                    !*stale || st != ChunkState::Loaded,
                    "chunk {c:?} Loaded with stale RAM"
                );
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
