//! The durable hybrid object (docs/requirements.md: C1-C5, I1-I11, D5, D6, durability modes).
//!
//! A byte-addressed extent held twice: in a RAM tier ([`RamRegion`], a memfd) and on a
//! durable backing ([`Durable`]). It is divided into fixed-size chunks, each in one of three
//! states: Unloaded, Loading, Loaded.
//!
//! Invariants (checked by `verify_mirror` in tests):
//! - C1: a Loaded chunk's RAM bytes equal the backing's bytes;
//! - an Unloaded chunk's RAM bytes are zero (so a hole needs no read to load), and so are
//!   the RAM bytes past the length;
//! - a chunk lying wholly past the length is Unloaded, and the backing holds only zeros
//!   there (a failed extending write truncates the backing back);
//! - a chunk is Loading only while the loader has claimed it (see `slot.rs`).
//!
//! Here: the object's state and opening. The read side (reads, zero-copy views) is
//! `object/read.rs`, the write side (writes, zeroing, flush, size changes)
//! `object/write.rs`, the load side `object/load.rs`, cache mode's eviction
//! `object/evict.rs`.
//!
//! Locks, in acquisition order: the layout lock (shared by every request; exclusive only
//! to truncate, to grow the mapping, or to verify), then chunk range locks in ascending
//! index order (writers register their byte range; disjoint writers share a chunk; the
//! loader claims a chunk with no writers), then the group-commit and load-queue mutexes;
//! the rebate mutex (budget accounting of a partial last chunk) is a leaf.
//! Readers take no chunk lock: they read the chunk state word (state plus a generation
//! bumped whenever a chunk leaves Loaded), copy, and check the word again, so a read never
//! waits on a writer and never returns RAM bytes of a chunk that was not Loaded throughout.
//! Whatever touches RAM reads the length only while holding the layout lock: a size change
//! takes it exclusively, so the memfd never shrinks below a length a copy was bounded by
//! (past the memfd's size a copy raises SIGBUS, which kills the process).
//!
//! Cache mode (`cache.rs`, `ahead.rs`, `object/evict.rs`): once the RAM budget is
//! exhausted, loads that a read asked for (admitted misses, read-ahead) evict a chunk the
//! policy chooses. RAM of a chunk that leaves Loaded (evicted, or invalidated after a
//! failed request) is not zeroed at once: a zero-copy view ([`RamView`]) taken while it was
//! Loaded may still be sending those bytes. The chunk is queued as pending and its RAM is
//! zeroed only after every view that could have seen it Loaded has ended (`reclaim`);
//! until then "an Unloaded chunk's RAM is zero" holds for chunks not pending, and a load of
//! a pending chunk never relies on its RAM being zero. Copying readers need no such care:
//! their generation check sees the chunk leave Loaded.
//!
//! Write ordering (C3): the backing first, then (in `sync` mode) a group-committed sync,
//! then RAM, then the reply. A request that fails after reaching the backing takes the
//! chunks it touched out of Loaded (their RAM copy can no longer be trusted to match), so
//! RAM and backing never diverge; a non-ENOSPC failure also makes the object read-only for
//! good (C4), ENOSPC fails only that request (C5).

use crate::ahead::Ahead;
use crate::cache::Residency;
use crate::commit::{Failure, GroupCommit};
use crate::config::{Durability, ObjectConfig, DEMAND_QUEUE_MAX, OBJECT_BYTES_MAX};
use crate::error::{is_enospc, BackingOp, Error, FailureCause, Result};
use crate::layout_lock::LayoutLock;
use crate::layout_lock::ReadGuard;
use crate::loader::{LoadKind, LoadResult, LoadTarget, Loader, NextJob};
use crate::ram::RamRegion;
use crate::slot::{state_of, ChunkState, Found, LoadClaim, Slot, SlotTable, WriteHold};
use crate::stats::{sample_read, Lat, Stats, StatsSnapshot, C};
use crate::units::{ChunkGeometry, ChunkIndex};
use crossbeam_utils::sync::ShardedLockWriteGuard;
use dhrd_io::RamBudget;
use dhrd_io::{read_full, Durable, Persistence, PAGE_BYTES};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Evictions one load may make before it gives up (a budget shared with other objects
/// can be taken again by them between our eviction and our reservation).
const EVICT_ATTEMPTS_MAX: u32 = 8;
/// Chunks zeroed per lock round in `zero_range`, so a whole-device TRIM does not hold
/// every chunk lock at once.
const ZERO_BATCH_CHUNKS: u64 = 64;
/// In `sync` mode the written pages are clean once synced; they are dropped from the
/// backing's page cache (RAM holds the data) once this many bytes were written, rather
/// than after every write, which would cost a system call per write.
const DROP_BEHIND_BYTES: u64 = 32 << 20;

/// How `zero_range` treats the backing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZeroMode {
    /// Deallocate where possible (TRIM, punch hole).
    Punch,
    /// Keep the range allocated (NBD WRITE_ZEROES with NO_HOLE).
    Allocate,
}

struct Layout {
    ram: RamRegion,
    slots: SlotTable,
}

impl Layout {
    /// The slot of chunk `c` (allocating its table page on first use): for writers, the
    /// loader and state changes.
    #[inline]
    fn slot(&self, c: ChunkIndex) -> &Slot {
        let s = self.slots.get(c.0 as usize);
        assert!(
            s.is_some(),
            "{c} outside the chunk table of {}",
            self.slots.len()
        );
        s.unwrap_or_else(|| unreachable!())
    }

    /// The state word of chunk `c`, without allocating: for readers.
    #[inline]
    fn word(&self, c: ChunkIndex) -> u32 {
        self.slots.word(c.0 as usize)
    }

    #[inline]
    fn state(&self, c: ChunkIndex) -> ChunkState {
        state_of(self.word(c))
    }
}

/// Where a read was served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Ram,
    Backing,
    /// Some pieces from RAM, some from the backing.
    Mixed,
    /// At or past the end: nothing read.
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    pub bytes: usize,
    pub served: Served,
}

/// What a write does with one chunk, decided under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WritePlan {
    /// Loaded: backing then RAM (I2).
    Mirror,
    /// Unloaded inside the data: backing only; the loader will pick the bytes up (I3).
    BackingOnly,
    /// Unloaded and wholly past the end: RAM is zero and the backing holds nothing there,
    /// so after the write the chunk can become Loaded without reading it.
    Fresh,
}

/// A zero-copy view of Loaded RAM (D5).
pub enum View<'a> {
    Ram(RamView<'a>),
    /// Some chunk of the range is not Loaded; read it with `read_at` instead.
    NotLoaded(ChunkIndex),
    Eof,
}

/// Borrowed bytes of the RAM tier. Holds the layout lock shared, so the mapping cannot move
/// while the view lives (a truncate or a growth of the mapping waits for it). Like a shared
/// mmap, concurrent writes to the range are visible through it. It is counted among the
/// live views, so a chunk evicted or invalidated meanwhile keeps its bytes until the view
/// ends (see the module header): a view shows the bytes of the time it was taken or newer
/// ones, never zeros that were not written.
///
/// Loading never waits for a view, but while one lives the RAM of every chunk that leaves
/// Loaded stays allocated (its budget is already free), and size changes wait. So a view
/// is for copying bytes out, never for waiting on someone else: a frontend sending it to
/// a client must not hold it while the client is slow to take the bytes.
pub struct RamView<'a> {
    _guard: ReadGuard<'a, Layout>,
    live: &'a AtomicU64,
    ptr: *const u8,
    len: usize,
}

impl Drop for RamView<'_> {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::ops::Deref for RamView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range was checked below the length while the guard was taken; the
        // guard keeps the mapping and memfd size from shrinking or moving.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What one synchronous loader step did (see [`HybridObject::load_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStep {
    Loaded(ChunkIndex),
    /// The chunk was Loaded already or is past the end.
    Skipped(ChunkIndex),
    OverBudget(ChunkIndex),
    Failed(ChunkIndex),
    /// Only retries are left; the next is due at this instant.
    Waiting(Instant),
    /// Nothing left to load.
    Idle,
}

static NEXT_OBJECT_ID: AtomicU64 = AtomicU64::new(1);

/// Budget accounting of a partial last chunk. Every Loaded chunk reserves a whole chunk
/// (that is what the RAM tier may come to hold there), but the last chunk of a file that
/// ends inside it holds only the pages up to the end: the difference is given back while
/// that chunk is Loaded and taken again when it leaves Loaded or the file grows.
/// Invariant (under the mutex): the budget holds `loaded_chunks * chunk_bytes - bytes`
/// for this object, and `bytes > 0` only while chunk `chunk` is Loaded.
#[derive(Default)]
struct Rebate {
    chunk: u64,
    bytes: u64,
}

struct Inner<D: Durable> {
    id: u64,
    backing: D,
    cfg: ObjectConfig,
    geo: ChunkGeometry,
    layout: LayoutLock<Layout>,
    ram_fd: RawFd,
    len: AtomicU64,
    commit: GroupCommit,
    failure: Failure,
    stats: Stats,
    lq: Mutex<LoadQueue>,
    load_cv: Condvar,
    loaded_chunks: AtomicU64,
    budget: Arc<RamBudget>,
    /// Budget given back for the Loaded last chunk of a file that ends inside it (see
    /// `settle_rebate`); guards every release of a chunk's reservation.
    rebate: Mutex<Rebate>,
    loader: Option<Loader>,
    me: Weak<Inner<D>>,
    closed: AtomicBool,
    /// Chunks kept Loaded through a sticky failure of a request that wrote them: their RAM
    /// holds the last acknowledged bytes, the backing may hold part of the failed request.
    diverged: Mutex<BTreeSet<u64>>,
    /// The backing file has no links left and no opener (`discard`): flushing it would
    /// make durable data that nothing can reach, so nothing flushes it any more.
    discarded: AtomicBool,
    /// fsync modes: some write reached the backing's page cache since the last flush.
    dirty: AtomicBool,
    /// A chunk was invalidated under the layout lock; wake the loader once it is released.
    kick_pending: AtomicBool,
    /// Bytes written in `sync` mode since the backing's cache was last dropped.
    written_since_drop: AtomicU64,
    flusher_stop: Arc<(Mutex<bool>, Condvar)>,
    /// Background jobs (a load, a reclaim, a periodic flush) running on the object now;
    /// `close` waits until none is, so the backing is let go of (its file closed, its
    /// single-writer lock released) when the last handle is dropped, not some time later.
    background: BackgroundJobs,
    /// Cache-mode bookkeeping of the Loaded chunks (lock order: after the chunk mutexes).
    residency: Mutex<Residency>,
    ahead: Mutex<Ahead>,
    /// Set once a load found the budget exhausted: from then on misses go through
    /// admission and admitted loads may evict.
    cache_active: AtomicBool,
    /// Zero-copy views alive now, counted in the slot of the view epoch they started in
    /// (see `evict.rs`, `reclaim`).
    views_live: [AtomicU64; 2],
    view_epoch: AtomicU64,
    /// One reclaimer at a time (it flips the view epoch); holds the batch whose RAM waits
    /// for the views of an old epoch to end (see `evict.rs`, `reclaim`).
    reclaiming: Mutex<Option<ReclaimBatch>>,
    /// The epoch `reclaiming`'s batch waits for, or `NO_EPOCH`: lets the loader see
    /// without the mutex whether a reclaim could progress.
    reclaim_epoch: AtomicU64,
    /// Chunks that left Loaded and whose RAM is not zeroed yet, with their state word at
    /// that time (see the module header and `evict.rs`).
    pending: Mutex<Vec<(u64, u32)>>,
    pending_any: AtomicBool,
}

mod evict;
mod extents;
mod load;
mod read;
use evict::ReclaimBatch;
pub use load::LoadProgress;
use load::LoadQueue;
mod write;

/// The durable hybrid object. Cheap to clone; all methods take `&self` and may be called
/// from many threads at once.
pub struct HybridObject<D: Durable> {
    inner: Arc<Inner<D>>,
}

impl<D: Durable> Clone for HybridObject<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

fn read_guard<T>(l: &LayoutLock<T>) -> ReadGuard<'_, T> {
    l.read()
}

fn write_guard<T>(l: &LayoutLock<T>) -> ShardedLockWriteGuard<'_, T> {
    l.write()
}

fn backing_err(op: BackingOp, source: io::Error) -> Error {
    Error::Backing { op, source }
}

impl<D: Durable> HybridObject<D> {
    /// Opens an object over `backing`. Returns at once: every chunk starts Unloaded and is
    /// served from the backing until the loader has copied it (I7). An object no longer
    /// than `cfg.inline_load_bytes_max` is loaded before this returns.
    pub fn open(backing: D, cfg: ObjectConfig) -> Result<Self> {
        let geo = ChunkGeometry::new(cfg.chunk_bytes).ok_or_else(|| {
            Error::Config(format!(
                "chunk size {} is not a power of two in range",
                cfg.chunk_bytes
            ))
        })?;
        // Reload what the device holds, not what the page cache may still hold: after a
        // failed writeback (maybe before a restart) the cache can keep bytes that never
        // reached the media, and a later successful sync would not write them.
        backing.drop_cache(0, 0);
        let len = backing.len().map_err(|e| backing_err(BackingOp::Len, e))?;
        if len > OBJECT_BYTES_MAX {
            return Err(Error::TooLarge {
                requested: len,
                max: OBJECT_BYTES_MAX,
            });
        }
        let map_bytes = geo.chunks_for(len).max(1) * geo.chunk_bytes();
        let ram = RamRegion::new(&cfg.name, len, map_bytes, &cfg.ram)?;
        let ram_fd = ram.fd().as_raw_fd();
        let slots = SlotTable::new(geo.chunks_for(map_bytes) as usize);
        let loader = match (&cfg.loader, cfg.load_disabled) {
            (_, true) => None,
            (Some(l), false) => Some(l.clone()),
            (None, false) => Some(Loader::new(cfg.loader_config.clone()).map_err(Error::Ram)?),
        };
        let budget = cfg.budget.clone().unwrap_or_else(RamBudget::unlimited);
        let inner = Arc::new_cyclic(|me| Inner {
            id: NEXT_OBJECT_ID.fetch_add(1, Ordering::Relaxed),
            backing,
            geo,
            layout: LayoutLock::new(Layout { ram, slots }),
            ram_fd,
            len: AtomicU64::new(len),
            commit: GroupCommit::default(),
            failure: Failure::default(),
            stats: Stats::new(),
            lq: Mutex::new(LoadQueue::new()),
            load_cv: Condvar::new(),
            loaded_chunks: AtomicU64::new(0),
            rebate: Mutex::new(Rebate::default()),
            budget,
            loader,
            me: me.clone(),
            closed: AtomicBool::new(false),
            diverged: Mutex::new(BTreeSet::new()),
            discarded: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            kick_pending: AtomicBool::new(false),
            written_since_drop: AtomicU64::new(0),
            flusher_stop: Arc::new((Mutex::new(false), Condvar::new())),
            background: BackgroundJobs::default(),
            residency: Mutex::new(Residency::new(
                cfg.cache.policy,
                cfg.cache.admission,
                cfg.budget
                    .as_ref()
                    .map_or(u64::MAX, |b| b.limit_bytes() / geo.chunk_bytes()),
            )),
            ahead: Mutex::new(Ahead::new(
                cfg.cache.read_ahead,
                cfg.cache.read_ahead_window_max_chunks,
            )),
            cache_active: AtomicBool::new(false),
            views_live: [AtomicU64::new(0), AtomicU64::new(0)],
            view_epoch: AtomicU64::new(0),
            reclaiming: Mutex::new(None),
            reclaim_epoch: AtomicU64::new(evict::NO_EPOCH),
            pending: Mutex::new(Vec::new()),
            pending_any: AtomicBool::new(false),
            cfg,
        });
        // A previous instance may have left unsynced bytes in the backing's cache; they are
        // readable, so the first flush must sync them even if we write nothing.
        inner.commit.issue();
        inner.dirty.store(true, Ordering::Release);
        if let Durability::Periodic(period) = inner.cfg.durability {
            spawn_flusher(&inner, period).map_err(Error::Ram)?;
        }
        let inline = len <= inner.cfg.inline_load_bytes_max
            && !inner.cfg.load_disabled
            && inner.cfg.gate.is_none();
        if inline {
            for c in 0..geo.chunks_for(len) {
                inner.load_chunk(ChunkIndex(c), LoadKind::Pass);
            }
        }
        // Whatever an inline load left (budget, read errors) goes the loader's way.
        if !inner.is_fully_loaded() {
            inner.kick_loader();
        }
        Ok(Self { inner })
    }

    pub fn len(&self) -> u64 {
        self.inner.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.inner.geo.chunk_bytes()
    }

    pub fn durability(&self) -> Durability {
        self.inner.cfg.durability
    }

    /// Whether the length is fixed at open (`ObjectConfig::fixed_len`): writes past it and
    /// size changes are refused.
    pub fn is_fixed_len(&self) -> bool {
        self.inner.cfg.fixed_len
    }

    pub fn backing(&self) -> &D {
        &self.inner.backing
    }

    /// The memfd holding the RAM copy; its size always equals `len()`. Only chunks that are
    /// Loaded hold real data, so hand it to the kernel only when `is_fully_loaded()`.
    pub fn ram_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the memfd lives inside `Inner` (RamRegion never closes or replaces it)
        // for at least as long as `&self`.
        unsafe { BorrowedFd::borrow_raw(self.inner.ram_fd) }
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<ReadOutcome> {
        self.inner.check_reads_allowed()?;
        self.inner.read_at(buf, offset)
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let r = self.inner.write_at(buf, offset);
        self.inner.after_request();
        r
    }

    /// Zeroes `[offset, offset+len)` (clipped to the length, which never changes): RAM is
    /// zeroed and the backing range punched (TRIM, WRITE_ZEROES, FALLOC_FL_PUNCH_HOLE).
    pub fn zero_range(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.zero_range(offset, len, ZeroMode::Punch);
        self.inner.after_request();
        r
    }

    /// Like `zero_range`, but the backing range stays allocated (NBD WRITE_ZEROES with
    /// NO_HOLE, FALLOC_FL_ZERO_RANGE).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.zero_range(offset, len, ZeroMode::Allocate);
        self.inner.after_request();
        r
    }

    /// Makes every completed write durable (fsync, NBD FLUSH).
    pub fn flush(&self) -> Result<()> {
        let r = self.inner.flush();
        self.inner.reclaim();
        r
    }

    pub fn set_len(&self, len: u64) -> Result<()> {
        let r = self.inner.set_len(len);
        self.inner.after_request();
        r
    }

    /// A borrowed zero-copy view of `[offset, offset+len)` if every chunk in it is Loaded.
    ///
    /// The view holds the object's layout lock shared: the thread holding it must not call
    /// into the same object until it drops the view (a size change waiting meanwhile would
    /// make that call wait for the view, forever; debug builds assert it).
    pub fn view(&self, offset: u64, len: usize) -> Result<View<'_>> {
        self.inner.check_reads_allowed()?;
        self.inner.view(offset, len)
    }

    pub fn is_fully_loaded(&self) -> bool {
        self.inner.is_fully_loaded()
    }

    /// Waits until every chunk is Loaded; `false` on timeout or when the load cannot
    /// complete (failed chunks, budget exhausted, loading disabled).
    pub fn wait_loaded(&self, timeout: Option<Duration>) -> bool {
        self.inner.wait_loaded(timeout)
    }

    pub fn progress(&self) -> LoadProgress {
        self.inner.progress()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub fn failure(&self) -> Option<FailureCause> {
        self.inner.failure.cause()
    }

    pub fn is_read_only(&self) -> bool {
        self.inner.cfg.read_only || self.inner.failure.is_failed()
    }

    /// Loads the next chunk on the calling thread, as a loader thread would. With
    /// `load_disabled` this makes loading fully deterministic (simulation tests).
    pub fn load_step(&self) -> LoadStep {
        self.inner.reclaim();
        match self.inner.next_job_inner(Instant::now(), false) {
            NextJob::Load(c, kind) => match self.inner.load_chunk(c, kind) {
                LoadResult::Loaded { .. } => LoadStep::Loaded(c),
                LoadResult::Skipped => LoadStep::Skipped(c),
                LoadResult::OverBudget => LoadStep::OverBudget(c),
                LoadResult::Failed => LoadStep::Failed(c),
            },
            NextJob::RetryAt(at) => LoadStep::Waiting(at),
            NextJob::Idle | NextJob::Reclaim => LoadStep::Idle,
        }
    }

    /// State of one chunk (tests, status output).
    pub fn chunk_state(&self, c: ChunkIndex) -> Option<ChunkState> {
        let l = read_guard(&self.inner.layout);
        ((c.0 as usize) < l.slots.len()).then(|| l.state(c))
    }

    /// Flushes (non-`sync` modes), stops the periodic flusher and further loading, and
    /// returns once no background job runs on the object any more: once its handles are
    /// dropped, nothing holds the backing.
    pub fn close(&self) -> Result<()> {
        let r = if self.inner.cfg.read_only {
            Ok(())
        } else {
            self.inner.flush()
        };
        self.inner.closed.store(true, Ordering::Release);
        let (m, cv) = &*self.inner.flusher_stop;
        *m.lock() = true;
        cv.notify_all();
        self.inner.background.wait_idle();
        r
    }

    /// Closes without flushing, for an object whose backing file was unlinked and is no
    /// longer open anywhere: its data can never be read again, so a sync (in the non-`sync`
    /// modes) would cost a device flush for nothing. Stops loading like `close`.
    pub fn discard(&self) {
        self.inner.discarded.store(true, Ordering::Release);
        self.inner.closed.store(true, Ordering::Release);
        let (m, cv) = &*self.inner.flusher_stop;
        *m.lock() = true;
        cv.notify_all();
        self.inner.background.wait_idle();
    }

    /// Checks the mirror invariants against the backing: every Loaded chunk equals the
    /// backing, every other chunk's RAM is zero. For tests and `dhrd check`; it reads the
    /// whole backing.
    pub fn verify_mirror(&self) -> std::result::Result<(), String> {
        self.inner.verify_mirror()
    }
}

impl<D: Durable> Inner<D> {
    fn weak_target(&self) -> Weak<dyn LoadTarget> {
        self.me.clone()
    }

    /// Runs after a mutating request has released every lock.
    fn after_request(&self) {
        if self.kick_pending.swap(false, Ordering::AcqRel) {
            self.kick_loader();
        }
        self.reclaim();
    }

    fn kick_loader(&self) {
        if let Some(l) = &self.loader {
            l.register(self.weak_target(), self.id);
        }
    }

    fn is_fully_loaded(&self) -> bool {
        self.loaded_chunks.load(Ordering::Acquire)
            >= self.geo.chunks_for(self.len.load(Ordering::Acquire))
    }

    /// Takes the layout lock shared, growing the mapping first if `end` is past it.
    fn layout_for(&self, end: u64) -> Result<ReadGuard<'_, Layout>> {
        loop {
            let g = read_guard(&self.layout);
            if end <= g.ram.map_bytes() {
                return Ok(g);
            }
            drop(g);
            let mut w = write_guard(&self.layout);
            self.grow_layout(&mut w, end)?;
        }
    }

    /// Re-derives the rebate (see [`Rebate`]) from the current length and the last
    /// chunk's state. Called after anything that may change either: a load, a write into
    /// the last chunk or past the end, a size change. A missed call leaves this object's
    /// charge off by less than a chunk until the next one and can never release more than
    /// was reserved: `release_chunk` and `Drop` give back exactly what the record says.
    fn settle_rebate(&self, layout: &Layout) {
        let mut r = self.rebate.lock();
        let want = self.rebate_for(layout, self.len.load(Ordering::Acquire));
        // Taking back the old rebate and giving the new one, netted: the old chunk is still
        // Loaded (release_chunk clears the record when it leaves), so its full reservation
        // is restored before the new chunk's is reduced.
        if want.bytes >= r.bytes {
            self.budget.release(want.bytes - r.bytes);
        } else {
            self.budget.charge(r.bytes - want.bytes);
        }
        *r = want;
    }

    /// What the rebate should be at length `len` with the chunk states in `layout`.
    fn rebate_for(&self, layout: &Layout, len: u64) -> Rebate {
        match len.checked_sub(1).map(|l| self.geo.index_of(l)) {
            Some(last)
                if (last.0 as usize) < layout.slots.len()
                    && layout.state(last) == ChunkState::Loaded =>
            {
                let held = (len - self.geo.start_of(last)).div_ceil(PAGE_BYTES) * PAGE_BYTES;
                Rebate {
                    chunk: last.0,
                    bytes: self.geo.chunk_bytes().saturating_sub(held),
                }
            }
            _ => Rebate::default(),
        }
    }

    /// Gives back the reservation of chunk `c`, which is leaving Loaded.
    fn release_chunk(&self, c: ChunkIndex) {
        let mut r = self.rebate.lock();
        let mut bytes = self.geo.chunk_bytes();
        if r.bytes > 0 && r.chunk == c.0 {
            bytes -= r.bytes;
            *r = Rebate::default();
        }
        self.budget.release(bytes);
    }

    fn grow_layout(&self, w: &mut Layout, end: u64) -> Result<()> {
        if end <= w.ram.map_bytes() {
            return Ok(());
        }
        let cb = self.geo.chunk_bytes();
        let want = end
            .max(w.ram.map_bytes().saturating_mul(2))
            .min(OBJECT_BYTES_MAX);
        let want = want.div_ceil(cb) * cb;
        w.ram.grow_map(want)?;
        let n = self.geo.chunks_for(want) as usize;
        w.slots.resize(n);
        Ok(())
    }

    // ---------------------------------------------------------------- reads

    /// Fails when the backing says RAM must not be served (a shared backing that lost or
    /// could not confirm its exclusive lock): stale bytes are never returned.
    fn verify_mirror(&self) -> std::result::Result<(), String> {
        // Exclusive: stops the loader and every request, so states and counters hold still.
        let layout = write_guard(&self.layout);
        let len = self.len.load(Ordering::Acquire);
        let blen = self.backing.len().map_err(|e| e.to_string())?;
        // After a sticky failure the cut-back of a torn extending write may itself have
        // failed: the backing may then be longer (the object serves only up to `len`).
        if blen != len && !(self.failure.is_failed() && blen > len) {
            return Err(format!("backing length {blen} != object length {len}"));
        }
        if layout.ram.file_bytes() != len {
            return Err(format!(
                "memfd size {} != object length {len}",
                layout.ram.file_bytes()
            ));
        }
        let cb = self.geo.chunk_bytes();
        let mut ram = vec![0u8; cb as usize];
        let mut disk = vec![0u8; cb as usize];
        let mut loaded = 0u64;
        for i in 0..self.geo.chunks_for(len) {
            let c = ChunkIndex(i);
            let start = self.geo.start_of(c);
            let n = (self.geo.end_of(c).min(len) - start) as usize;
            let (r, d) = (&mut ram[..n], &mut disk[..n]);
            layout.ram.copy_out(start, r);
            match layout.state(c) {
                ChunkState::Loaded if self.diverged.lock().contains(&i) => loaded += 1,
                ChunkState::Loaded => {
                    loaded += 1;
                    let got = read_full(&self.backing, d, start).map_err(|e| e.to_string())?;
                    if got != n || r != d {
                        let at = r
                            .iter()
                            .zip(d.iter())
                            .position(|(a, b)| a != b)
                            .unwrap_or(got);
                        return Err(format!(
                            "{c}: RAM differs from backing at byte {}",
                            start + at as u64
                        ));
                    }
                }
                // A pending chunk's RAM is zeroed once no view can see it (see the header).
                ChunkState::Unloaded if layout.slot(c).with_state_stale(|_, stale| *stale) => {}
                ChunkState::Unloaded => {
                    if let Some(at) = r.iter().position(|b| *b != 0) {
                        return Err(format!(
                            "{c} is Unloaded but RAM byte {} is not zero",
                            start + at as u64
                        ));
                    }
                }
                ChunkState::Loading => return Err(format!("{c} is Loading with its lock free")),
            }
        }
        if loaded != self.loaded_chunks.load(Ordering::Acquire) {
            return Err(format!(
                "{loaded} chunks Loaded but counter says {}",
                self.loaded_chunks.load(Ordering::Acquire)
            ));
        }
        let want = self.rebate_for(&layout, len);
        let r = self.rebate.lock();
        if (r.chunk, r.bytes) != (want.chunk, want.bytes) && (r.bytes, want.bytes) != (0, 0) {
            return Err(format!(
                "budget rebate of {} bytes on chunk {} where the length {len} asks for {} on {}",
                r.bytes, r.chunk, want.bytes, want.chunk
            ));
        }
        Ok(())
    }
}

impl<D: Durable> Drop for Inner<D> {
    fn drop(&mut self) {
        // Best effort for fsync modes when the owner forgot `close`: the data is in the
        // backing's page cache either way; this only shortens the loss window.
        if self.cfg.durability != Durability::Sync
            && !self.failure.is_failed()
            && !self.discarded.load(Ordering::Acquire)
            && !self.commit.is_clean()
        {
            let _ = self.backing.sync();
        }
        let loaded = self.loaded_chunks.load(Ordering::Acquire);
        let rebate = self.rebate.get_mut().bytes;
        self.budget
            .release((loaded * self.geo.chunk_bytes()).saturating_sub(rebate));
    }
}

/// Counts the background jobs running on an object (see `Inner::background`).
#[derive(Default)]
struct BackgroundJobs {
    running: Mutex<u32>,
    idle: Condvar,
}

/// One background job; ends on drop.
struct BackgroundJob<'a>(&'a BackgroundJobs);

impl BackgroundJobs {
    /// Starts a job unless the object is closed. `closed` is read under the count's lock,
    /// and `close` sets it before it waits, so no job starts after `wait_idle` returned.
    fn begin<'a>(&'a self, closed: &AtomicBool) -> Option<BackgroundJob<'a>> {
        let mut n = self.running.lock();
        if closed.load(Ordering::Acquire) {
            return None;
        }
        *n += 1;
        Some(BackgroundJob(self))
    }

    fn wait_idle(&self) {
        let mut n = self.running.lock();
        while *n > 0 {
            self.idle.wait(&mut n);
        }
    }
}

impl Drop for BackgroundJob<'_> {
    fn drop(&mut self) {
        let mut n = self.0.running.lock();
        assert!(*n > 0, "a background job ended twice");
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

fn spawn_flusher<D: Durable>(inner: &Arc<Inner<D>>, period: Duration) -> io::Result<()> {
    let weak = Arc::downgrade(inner);
    let stop = inner.flusher_stop.clone();
    std::thread::Builder::new()
        .name(String::from("dhrd-flush"))
        .spawn(move || loop {
            {
                let (m, cv) = &*stop;
                let mut s = m.lock();
                if !*s {
                    cv.wait_for(&mut s, period);
                }
                if *s {
                    return;
                }
            }
            let Some(inner) = weak.upgrade() else { return };
            let Some(_job) = inner.background.begin(&inner.closed) else {
                return;
            };
            // A failure is recorded as the object's sticky cause and shown by status.
            let _ = inner.flush();
        })?;
    Ok(())
}
