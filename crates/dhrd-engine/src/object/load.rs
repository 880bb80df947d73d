//! The object's load side: filling chunks from the backing, the retry schedule, progress
//! and waiting for the full load.
//!
//! Invariants:
//! - A chunk is filled only while the loader holds its claim (Loading), and becomes
//!   Loaded only after its RAM bytes equal the backing's (C1); the RAM budget is reserved
//!   before the copy and given back if it fails.
//! - In cache mode only a load a read asked for (demand, read-ahead) evicts to make room;
//!   the background pass never does.
//! - A failed load leaves the chunk Unloaded (reads go to the backing), gives its budget
//!   back and is retried with doubling back-off (I9); after `retry_attempts_max` tries
//!   the chunk is reported as failed in the progress and stays served from the backing.
//!   A load failure never makes the object fail (a read failure is not a lost write).
//!
//! Crash semantics: none; a load only copies durable bytes into RAM.

use super::*;

/// Load progress (I8); serialised with its durations in seconds (`elapsed_s`, `eta_s`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadProgress {
    pub chunk_bytes: u64,
    pub chunks_total: u64,
    pub chunks_loaded: u64,
    /// Chunks whose load failed and that are waiting for a retry.
    pub chunks_retrying: u64,
    /// Chunks that failed every attempt and are served from the backing.
    pub chunks_failed: u64,
    /// Chunks left Unloaded because the RAM budget is exhausted (I11).
    pub chunks_over_budget: u64,
    pub bytes_total: u64,
    /// Bytes the loader copied since open.
    pub bytes_loaded: u64,
    #[serde(rename = "elapsed_s", serialize_with = "crate::stats::secs")]
    pub elapsed: Duration,
    pub rate_bytes_per_s: f64,
    #[serde(rename = "eta_s", serialize_with = "crate::stats::secs_if_known")]
    pub eta: Option<Duration>,
    /// RAM the memfd really holds.
    pub ram_resident_bytes: u64,
}

impl LoadProgress {
    pub fn fraction(&self) -> f64 {
        if self.chunks_total == 0 {
            1.0
        } else {
            self.chunks_loaded as f64 / self.chunks_total as f64
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    pub attempts: u32,
    pub due: Instant,
}

/// What is left to load, in the order it is taken: demand, read-ahead, retries due, the
/// background pass at `cursor`.
pub(super) struct LoadQueue {
    pub cursor: u64,
    pub demand: VecDeque<ChunkIndex>,
    /// Read-ahead, after demand and before the background pass.
    pub ahead: VecDeque<ChunkIndex>,
    pub retries: BTreeMap<u64, Retry>,
    pub failed: BTreeSet<u64>,
    pub over_budget: BTreeSet<u64>,
    pub started: Instant,
    pub finished: Option<Instant>,
    pub bytes_loaded: u64,
}

impl LoadQueue {
    /// Nothing queued, the pass at chunk 0, started now.
    pub(super) fn new() -> Self {
        Self {
            cursor: 0,
            demand: VecDeque::new(),
            ahead: VecDeque::new(),
            retries: BTreeMap::new(),
            failed: BTreeSet::new(),
            over_budget: BTreeSet::new(),
            started: Instant::now(),
            finished: None,
            bytes_loaded: 0,
        }
    }
}

impl<D: Durable> Inner<D> {
    /// Loads chunk `c` from the backing. In cache mode a load a read asked for (demand,
    /// read-ahead) evicts to make room; the background pass never does.
    pub(super) fn load_chunk(&self, c: ChunkIndex, kind: LoadKind) -> LoadResult {
        let may_evict = kind != LoadKind::Pass && self.eviction_enabled();
        let mut r = self.load_chunk_once(c, kind, may_evict);
        let mut attempts = 0;
        while r == LoadResult::OverBudget && may_evict && attempts < EVICT_ATTEMPTS_MAX {
            attempts += 1;
            if !self.evict_one() {
                break;
            }
            r = self.load_chunk_once(c, kind, may_evict);
        }
        if r == LoadResult::OverBudget && may_evict {
            // Nothing of ours to evict (the budget is shared) or no room after retries:
            // the chunk stays served from the backing, as the background pass leaves it.
            self.lq.lock().over_budget.insert(c.0);
            self.load_cv.notify_all();
        }
        // Give the memory of what was evicted back now if no view is out; otherwise a later
        // call does, once the views have ended (NextJob::Reclaim).
        self.reclaim();
        r
    }

    pub(super) fn load_chunk_once(
        &self,
        c: ChunkIndex,
        kind: LoadKind,
        may_evict: bool,
    ) -> LoadResult {
        if self.closed.load(Ordering::Acquire) {
            return LoadResult::Skipped;
        }
        let layout = read_guard(&self.layout);
        if self.geo.start_of(c) >= self.len.load(Ordering::Acquire)
            || c.0 as usize >= layout.slots.len()
        {
            return LoadResult::Skipped;
        }
        let slot = layout.slot(c);
        let cb = self.geo.chunk_bytes();
        // I3: writers inside the chunk make us wait, so the copy includes their writes.
        let mut claim = match slot.begin_load(|| self.budget.try_reserve(cb)) {
            Ok(LoadClaim::Claimed(g)) => g,
            Ok(LoadClaim::NotNeeded) => return LoadResult::Skipped,
            Err(()) => {
                self.cache_active.store(true, Ordering::Release);
                if !may_evict {
                    self.lq.lock().over_budget.insert(c.0);
                    // Waiters in wait_loaded learn that the load cannot complete.
                    self.load_cv.notify_all();
                }
                return LoadResult::OverBudget;
            }
        };
        // A chunk whose RAM was not zeroed yet when it left Loaded: the fill below must
        // write all of it rather than trust it to be zero.
        let was_pending = claim.ram_stale;
        // The chunk is Loading and ours: writers wait for it (I1), readers go to the
        // backing (I5). The mutex itself is released while we read.
        let result = Slot::unlocked_while(&mut claim, || self.fill_chunk(&layout, c, was_pending));
        match result {
            Ok(want) => {
                slot.reset_meta(kind == LoadKind::Ahead);
                claim.ram_stale = false;
                slot.end_load(claim, ChunkState::Loaded);
                self.loaded_chunks.fetch_add(1, Ordering::AcqRel);
                self.residency.lock().insert(c.0);
                if kind == LoadKind::Ahead {
                    self.stats.add(C::AheadLoaded, 1);
                }
                self.settle_rebate(&layout);
                let mut q = self.lq.lock();
                q.retries.remove(&c.0);
                q.bytes_loaded += want;
                drop(q);
                self.load_cv.notify_all();
                LoadResult::Loaded { bytes: want }
            }
            Err(_) => {
                // Its RAM holds part of the read: zeroed by `reclaim` (a view of an
                // earlier Loaded time may still be reading it).
                claim.ram_stale = true;
                slot.end_load(claim, ChunkState::Unloaded);
                self.add_pending(&layout, c);
                self.budget.release(cb);
                self.schedule_retry(c);
                LoadResult::Failed
            }
        }
    }

    /// Copies chunk `c` from the backing into RAM. The caller has claimed it (Loading).
    /// Returns the number of data bytes in the chunk; on failure RAM is left zero.
    pub(super) fn fill_chunk(
        &self,
        layout: &Layout,
        c: ChunkIndex,
        was_pending: bool,
    ) -> io::Result<u64> {
        if let Some(g) = &self.cfg.gate {
            g.at_loading(c);
        }
        // Only the loader's claim lets a chunk's RAM be filled (readers skip it, writers wait).
        assert_eq!(
            layout.state(c),
            ChunkState::Loading,
            "chunk {c:?} filled without a claim"
        );
        let start = self.geo.start_of(c);
        let end = self.geo.end_of(c).min(self.len.load(Ordering::Acquire));
        // The caller saw the chunk inside the length under the shared layout lock, which a
        // shrink needs exclusively.
        assert!(start < end, "chunk {c:?} loaded past the length {end}");
        let want = end - start;
        let result = if self.backing.is_zero_range(start, want) {
            if was_pending {
                // Zeros are what the chunk holds now, so a view may see them.
                layout
                    .ram
                    .zero(start, want)
                    .map(|()| want as usize)
                    .map_err(|e| io::Error::other(e.to_string()))
            } else {
                Ok(want as usize) // RAM of an Unloaded chunk is already zero
            }
        } else {
            // Round up to whole pages for O_DIRECT; the page holding the last byte is
            // mapped and past-end bytes of the backing read as nothing (zeros stay).
            let file_pages_end = layout.ram.file_bytes().div_ceil(PAGE_BYTES) * PAGE_BYTES;
            let read_len = (want.div_ceil(PAGE_BYTES) * PAGE_BYTES).min(file_pages_end - start);
            // SAFETY: the chunk is claimed Loading, so no reader (they skip non-Loaded
            // chunks) or writer (they wait) touches this RAM range, and the layout lock
            // is held shared; the range lies within the memfd's last page.
            let dst = unsafe { layout.ram.slice_mut_pages(start, read_len as usize) };
            let r = self.backing.read_bulk_at(dst, start);
            if let Ok(n) = r {
                debug_assert!(n <= dst.len(), "the backing read more than it was asked");
                if let Some(tail) = dst.get_mut(n.min(dst.len())..) {
                    tail.fill(0);
                }
                // Bytes past the length must stay zero in RAM.
                if let Some(past) = dst.get_mut(want as usize..) {
                    past.fill(0);
                }
            }
            r
        };
        result.map(|_| want)
    }

    /// I9: a failed load is retried with doubling back-off, then reported as failed.
    pub(super) fn schedule_retry(&self, c: ChunkIndex) {
        let lc = &self.cfg.loader_config;
        let mut q = self.lq.lock();
        let attempts = q.retries.get(&c.0).map_or(0, |r| r.attempts) + 1;
        if attempts >= lc.retry_attempts_max {
            q.retries.remove(&c.0);
            q.failed.insert(c.0);
        } else {
            let backoff = lc
                .retry_base
                .saturating_mul(1 << (attempts - 1).min(16))
                .min(lc.retry_max);
            q.retries.insert(
                c.0,
                Retry {
                    attempts,
                    due: Instant::now() + backoff,
                },
            );
        }
        drop(q);
        self.load_cv.notify_all();
    }

    pub(super) fn next_job_inner(&self, now: Instant, may_reclaim: bool) -> NextJob {
        if self.closed.load(Ordering::Acquire) {
            return NextJob::Idle;
        }
        if may_reclaim && self.reclaim_due() {
            return NextJob::Reclaim;
        }
        let nchunks = self.geo.chunks_for(self.len.load(Ordering::Acquire));
        let mut q = self.lq.lock();
        let blocked = |q: &LoadQueue, i: u64| {
            q.retries.contains_key(&i) || q.failed.contains(&i) || q.over_budget.contains(&i)
        };
        // In cache mode a chunk over budget may come in by evicting another.
        let evicting = self.eviction_enabled();
        let blocked_asked = |q: &LoadQueue, i: u64| {
            if evicting {
                q.retries.contains_key(&i) || q.failed.contains(&i)
            } else {
                blocked(q, i)
            }
        };
        while let Some(c) = q.demand.pop_front() {
            if c.0 < nchunks && !blocked_asked(&q, c.0) {
                q.over_budget.remove(&c.0);
                return NextJob::Load(c, LoadKind::Demand);
            }
        }
        while let Some(c) = q.ahead.pop_front() {
            if c.0 < nchunks && !blocked_asked(&q, c.0) {
                q.over_budget.remove(&c.0);
                return NextJob::Load(c, LoadKind::Ahead);
            }
        }
        while self.cfg.cache.prefill && q.cursor < nchunks && !self.cache_full() {
            let c = q.cursor;
            q.cursor += 1;
            if !blocked(&q, c) {
                return NextJob::Load(ChunkIndex(c), LoadKind::Pass);
            }
        }
        let due = q
            .retries
            .iter()
            .find(|(_, r)| r.due <= now)
            .map(|(c, _)| *c);
        if let Some(c) = due {
            // Parked far ahead until this attempt reports back.
            if let Some(r) = q.retries.get_mut(&c) {
                r.due = now + Duration::from_secs(3600);
            }
            return NextJob::Load(ChunkIndex(c), LoadKind::Retry);
        }
        // A reclaim batch waiting for views: look again soon (see `evict.rs`).
        let reclaim_at = (may_reclaim && self.reclaim_waiting()).then(|| now + evict::RECLAIM_POLL);
        if let Some(at) = q.retries.values().map(|r| r.due).chain(reclaim_at).min() {
            return NextJob::RetryAt(at);
        }
        if q.finished.is_none() {
            q.finished = Some(Instant::now());
        }
        NextJob::Idle
    }

    pub(super) fn progress(&self) -> LoadProgress {
        let len = self.len.load(Ordering::Acquire);
        let total = self.geo.chunks_for(len);
        let loaded = self.loaded_chunks.load(Ordering::Acquire).min(total);
        let resident = read_guard(&self.layout).ram.resident_bytes();
        let q = self.lq.lock();
        let elapsed = q
            .finished
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(q.started);
        let rate = if elapsed.as_secs_f64() > 0.0 {
            q.bytes_loaded as f64 / elapsed.as_secs_f64()
        } else {
            0.0
        };
        let remaining = (total - loaded) * self.geo.chunk_bytes();
        // In cache mode the background pass stops at the first chunk over budget: every
        // chunk not in RAM, not failed and not retrying is then on the backing by choice.
        let over_budget = if self.cache_full() {
            total.saturating_sub(loaded + q.failed.len() as u64 + q.retries.len() as u64)
        } else {
            q.over_budget.len() as u64
        };
        let eta = (rate > 0.0 && self.loader.is_some())
            .then(|| Duration::from_secs_f64(remaining as f64 / rate));
        LoadProgress {
            chunk_bytes: self.geo.chunk_bytes(),
            chunks_total: total,
            chunks_loaded: loaded,
            chunks_retrying: q.retries.len() as u64,
            chunks_failed: q.failed.len() as u64,
            chunks_over_budget: over_budget,
            bytes_total: len,
            bytes_loaded: q.bytes_loaded,
            elapsed,
            rate_bytes_per_s: rate,
            eta,
            ram_resident_bytes: resident,
        }
    }

    pub(super) fn wait_loaded(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.lq.lock();
        loop {
            if self.is_fully_loaded() {
                return true;
            }
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            let stuck = self.loader.is_none() || !q.failed.is_empty() || !q.over_budget.is_empty();
            if stuck && q.retries.is_empty() && q.demand.is_empty() {
                return false;
            }
            match deadline {
                Some(d) => {
                    if self.load_cv.wait_until(&mut q, d).timed_out() {
                        return self.is_fully_loaded();
                    }
                }
                None => {
                    self.load_cv.wait_for(&mut q, Duration::from_millis(100));
                }
            }
        }
    }
}

impl<D: Durable> LoadTarget for Inner<D> {
    fn target_id(&self) -> u64 {
        self.id
    }
    fn next_job(&self, now: Instant) -> NextJob {
        self.next_job_inner(now, true)
    }
    fn reclaim(&self) {
        if let Some(_job) = self.background.begin(&self.closed) {
            Inner::reclaim(self);
        }
    }
    fn load(&self, c: ChunkIndex, kind: LoadKind) -> LoadResult {
        match self.background.begin(&self.closed) {
            Some(_job) => self.load_chunk(c, kind),
            None => LoadResult::Skipped,
        }
    }
    fn chunk_bytes(&self) -> u64 {
        self.geo.chunk_bytes()
    }
}
