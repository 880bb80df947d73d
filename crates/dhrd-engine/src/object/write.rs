//! The object's write side: writes, zeroing, flush and size changes.
//!
//! Invariants:
//! - C3 ordering: a request reaches the backing first, then (in `sync` mode) a
//!   group-committed sync that started after it, then RAM, then the reply; RAM is never
//!   newer than the backing. This is the order of the steps in `write_held` and
//!   `zero_batch` (a RAM copy cannot be compared with the backing at run time); the
//!   crash and simulation tests check the outcome.
//! - A writer holds the range lock of every chunk it touches, taken in ascending index
//!   order, for the whole request; a Loading chunk is never written by a request (the
//!   loader claims only chunks with no writers).
//! - A size change holds the layout lock exclusively: no copy can run past a memfd that
//!   shrinks under it.
//!
//! Crash semantics: a request that fails after reaching the backing takes every chunk it
//! touched out of Loaded (its RAM copy can no longer be trusted), so RAM and backing never
//! diverge; any failure but ENOSPC makes the object read-only for good (C4); ENOSPC fails
//! only that request (C5). A failed extending write truncates the backing back, so the
//! backing holds only zeros past the length.

use super::*;

impl<D: Durable> Inner<D> {
    pub(super) fn check_writable(&self) -> Result<()> {
        if self.cfg.read_only {
            return Err(Error::ReadOnlyOpen);
        }
        self.failure.check()
    }

    /// Takes the range lock of every chunk of `[offset, end)` in ascending order (so
    /// writers never wait in a cycle) and decides each chunk's plan.
    pub(super) fn lock_range<'a>(
        &self,
        layout: &'a Layout,
        offset: u64,
        end: u64,
    ) -> Vec<(ChunkIndex, WritePlan, WriteHold<'a>)> {
        let mut out: Vec<(ChunkIndex, WritePlan, WriteHold<'a>)> = Vec::new();
        for p in self.geo.pieces(offset, end - offset) {
            let c = p.chunk;
            // Ascending order is what keeps writers from waiting on each other in a cycle.
            debug_assert!(
                out.last().is_none_or(|(prev, _, _)| prev.0 < c.0),
                "range locks taken out of order"
            );
            let past_end = || self.geo.start_of(c) >= self.len.load(Ordering::Acquire);
            let (hold, found, waited) =
                layout
                    .slot(c)
                    .acquire_write(p.offset, p.offset + p.len, past_end);
            if waited {
                self.stats.add(C::WriteWaitsOnLoad, 1); // I1
            }
            let plan = match found {
                Found::Loaded => WritePlan::Mirror,
                Found::Unloaded => WritePlan::BackingOnly,
                Found::Fresh => WritePlan::Fresh,
            };
            out.push((c, plan, hold));
        }
        out
    }

    /// Copies a written piece into RAM if its chunk is (still) Loaded, or makes a fresh
    /// chunk Loaded. A chunk invalidated meanwhile by another request's failure is left
    /// alone: the loader will copy it, this write included, from the backing.
    pub(super) fn apply_piece(
        &self,
        layout: &Layout,
        plan: WritePlan,
        c: ChunkIndex,
        offset: u64,
        src: &[u8],
    ) {
        let slot = layout.slot(c);
        match plan {
            WritePlan::Mirror => slot.with_state(|st| {
                // The loader claims only chunks with no writers, and we hold this one.
                debug_assert_ne!(st, ChunkState::Loading, "a held chunk is being loaded");
                if st == ChunkState::Loaded {
                    layout.ram.copy_in(offset, src);
                }
            }),
            WritePlan::Fresh => slot.with_state(|st| {
                // Held exclusively since it was found Unloaded past the end: nobody else
                // could have loaded it, and the length only grows under our shared lock.
                debug_assert_eq!(st, ChunkState::Unloaded, "a fresh chunk changed state");
                if self.budget.try_reserve(self.geo.chunk_bytes()) {
                    layout.ram.copy_in(offset, src);
                    slot.reset_meta(false);
                    slot.set_state(ChunkState::Loaded);
                    self.loaded_chunks.fetch_add(1, Ordering::AcqRel);
                    self.residency.lock().insert(c.0);
                } else {
                    self.stats.add(C::WritePiecesBackingOnly, 1);
                }
            }),
            WritePlan::BackingOnly => self.stats.add(C::WritePiecesBackingOnly, 1),
        }
    }

    /// A chunk leaves Loaded because its RAM copy may no longer match the backing. Its RAM
    /// is zeroed later, once no view can be reading it (`reclaim`).
    pub(super) fn invalidate(&self, layout: &Layout, c: ChunkIndex) {
        let slot = layout.slot(c);
        let was_loaded = slot.with_state_stale(|st, stale| {
            if st != ChunkState::Loaded {
                return false;
            }
            slot.set_state(ChunkState::Unloaded);
            *stale = true;
            self.add_pending(layout, c);
            true
        });
        if !was_loaded {
            return;
        }
        if slot.clear_meta() {
            self.stats.add(C::AheadWasted, 1);
        }
        self.residency.lock().remove(c.0);
        self.release_chunk(c);
        let loaded_before = self.loaded_chunks.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(loaded_before > 0, "more chunks left Loaded than entered it");
        self.stats.add(C::ChunksInvalidated, 1);
        let mut q = self.lq.lock();
        if q.demand.len() < DEMAND_QUEUE_MAX {
            q.demand.push_back(c);
        } else {
            q.cursor = q.cursor.min(c.0);
        }
        drop(q);
        self.kick_pending.store(true, Ordering::Release);
    }

    /// Handles a backing failure of a request that may have reached the backing.
    pub(super) fn fail_request(
        &self,
        layout: &Layout,
        plan: &[(ChunkIndex, WritePlan, WriteHold<'_>)],
        op: BackingOp,
        err: Error,
        len_before: u64,
    ) -> Error {
        self.stats.add(C::WritesFailed, 1);
        // Part of the request may sit in the backing's cache where reads see it: the next
        // flush must sync it rather than find nothing to do.
        self.commit.issue();
        self.dirty.store(true, Ordering::Release);
        let ret = match err {
            Error::Backing { source, .. } if is_enospc(&source) => Error::NoSpace,
            Error::Backing { source, .. } => {
                self.failure.fail(op, &source);
                Error::Backing { op, source }
            }
            other => other,
        };
        // The object stays writable (ENOSPC): its Loaded chunks must keep equalling the
        // backing (C1), which may now hold part of the request, so they are reloaded.
        // Failed for good (C4): the backing is no longer the reference and reads of it may
        // fail as the write did, so RAM keeps serving the last acknowledged bytes (the
        // request was never applied to RAM) and the chunks are noted as diverged.
        let sticky = self.failure.is_failed();
        for (c, p, _) in plan {
            if *p == WritePlan::Mirror {
                if sticky {
                    self.diverged.lock().insert(c.0);
                } else {
                    self.invalidate(layout, *c);
                }
            }
        }
        // A torn extending write may have grown the backing: cut it back so that the
        // bytes past our length stay zeros (chunks past the end are assumed empty).
        if let Ok(blen) = self.backing.len() {
            if blen > len_before && !self.cfg.fixed_len {
                if let Err(e) = self.backing.set_len(len_before) {
                    self.failure.fail(BackingOp::SetLen, &e);
                }
            }
        }
        ret
    }

    /// Makes a request that reached the backing as durable as the mode promises: in `sync`
    /// mode wait for a shared sync, unless the backing made it durable already; otherwise
    /// note that the next flush has work to do. Errors come from the sync (ReadOnly after
    /// a sticky failure, NoSpace for the batch an ENOSPC sync covered).
    pub(super) fn commit_request(&self, persisted: Persistence) -> Result<()> {
        let ticket = self.commit.issue();
        if self.cfg.durability == Durability::Sync && persisted == Persistence::NeedsSync {
            self.sync_through(ticket)
        } else {
            self.dirty.store(true, Ordering::Release);
            Ok(())
        }
    }

    pub(super) fn sync_through(&self, t: crate::commit::Ticket) -> Result<()> {
        self.commit
            .wait_durable(t, || self.backing.sync(), &self.failure, &self.stats)
    }

    /// The whole-block range around an unaligned `[offset, end)`, when the backing makes
    /// whole blocks durable in one device operation and the range lies inside the current
    /// length (an O_DIRECT write past it would grow the backing to a block boundary).
    fn whole_block_span(&self, offset: u64, end: u64, len: u64) -> Option<(u64, u64)> {
        let block = self.backing.durable_write_block_bytes()?;
        assert!(
            block.is_power_of_two() && self.geo.chunk_bytes().is_multiple_of(block),
            "a durable write block ({block} bytes) must divide the chunk size"
        );
        let start = offset / block * block;
        let stop = end.div_ceil(block) * block;
        ((start, stop) != (offset, end) && stop <= len).then_some((start, stop))
    }

    /// `buf` at `offset` inside a copy of `[start, stop)`, the bytes around it read from
    /// RAM where their chunk is Loaded (C1: equal to the backing) and from the backing
    /// otherwise. The caller holds `[start, stop)` (`plan`), so no writer changes those
    /// bytes meanwhile, and a chunk seen Loaded under its state lock stays readable: only
    /// the loader (which waits for writers) makes RAM of a chunk change other than by a
    /// writer of the same bytes.
    fn widen(
        &self,
        layout: &Layout,
        plan: &[(ChunkIndex, WritePlan, WriteHold<'_>)],
        buf: &[u8],
        offset: u64,
        start: u64,
        stop: u64,
    ) -> Result<Vec<u8>> {
        let mut out = vec![0u8; (stop - start) as usize];
        let head = (offset - start) as usize;
        out[head..head + buf.len()].copy_from_slice(buf);
        let edges = [(start, offset), (offset + buf.len() as u64, stop)];
        for (from, to) in edges.into_iter().filter(|(f, t)| f < t) {
            let c = self.geo.index_of(from);
            debug_assert_eq!(
                c,
                self.geo.index_of(to - 1),
                "an edge lies inside one block"
            );
            assert!(
                plan.iter().any(|(held, _, _)| *held == c),
                "edge chunk not held"
            );
            let dst = &mut out[(from - start) as usize..(to - start) as usize];
            let from_ram = layout.slot(c).with_state(|st| {
                if st == ChunkState::Loaded {
                    layout.ram.copy_out(from, dst);
                }
                st == ChunkState::Loaded
            });
            if !from_ram {
                let got = read_full(&self.backing, dst, from)
                    .map_err(|e| backing_err(BackingOp::Read, e))?;
                // Inside the length, the backing is shorter only if it was truncated
                // behind our back: refuse rather than write zeros we never read.
                if got < dst.len() {
                    return Err(backing_err(
                        BackingOp::Read,
                        io::Error::from(io::ErrorKind::UnexpectedEof),
                    ));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.check_writable()?;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|e| *e <= OBJECT_BYTES_MAX)
            .ok_or(Error::TooLarge {
                requested: offset.saturating_add(buf.len() as u64),
                max: OBJECT_BYTES_MAX,
            })?;
        let started = Instant::now();
        let layout = self.layout_for(end)?;
        let len_before = self.len.load(Ordering::Acquire);
        if self.cfg.fixed_len && end > len_before {
            return Err(Error::OutOfRange {
                offset,
                len: buf.len() as u64,
                size: len_before,
            });
        }
        // A backing whose whole aligned blocks are durable in one device operation gets an
        // unaligned write as the blocks around it: one O_DIRECT|O_DSYNC write instead of a
        // buffered write plus a flush. The request then holds, writes and mirrors the
        // widened range; the bytes added around it are the current ones.
        let span = self.whole_block_span(offset, end, len_before);
        let (lock_start, lock_end) = span.unwrap_or((offset, end));
        let plan = self.lock_range(&layout, lock_start, lock_end);
        let len_locked = self.len.load(Ordering::Acquire);
        let widened;
        let (data, data_offset) = match span {
            None => (buf, offset),
            Some((start, stop)) => {
                widened = self.widen(&layout, &plan, buf, offset, start, stop)?;
                self.stats.add(C::WritesWidened, 1);
                (&widened[..], start)
            }
        };
        let grew = self.write_held(&layout, &plan, data, data_offset, len_locked)?;
        // M4: in cache mode a write to a chunk not in RAM brings it in when there is room.
        // Collected only in cache mode: outside it this costs writes nothing.
        let missed: Vec<ChunkIndex> = if self.admission_active() {
            plan.iter()
                .filter(|(_, how, _)| *how == WritePlan::BackingOnly)
                .map(|(c, _, _)| *c)
                .collect()
        } else {
            Vec::new()
        };
        drop(plan);
        drop(layout);
        for c in missed {
            self.on_write_miss(c);
        }
        self.after_write(buf.len() as u64, grew, len_locked);
        self.stats.record(Lat::Write, started.elapsed());
        Ok(())
    }

    /// Steps 1 to 4 of a write (C3) whose chunks `plan` holds: backing, sync, RAM, length.
    /// Whether the object grew; on a failure, what `fail_request` made of it.
    fn write_held(
        &self,
        layout: &Layout,
        plan: &[(ChunkIndex, WritePlan, WriteHold<'_>)],
        data: &[u8],
        data_offset: u64,
        len_locked: u64,
    ) -> Result<bool> {
        let end = data_offset + data.len() as u64;
        // 1. Backing first (C3).
        let persisted = match self.backing.write_durably(data, data_offset) {
            Ok(p) => p,
            Err(e) => {
                let err = backing_err(BackingOp::Write, e);
                return Err(self.fail_request(layout, plan, BackingOp::Write, err, len_locked));
            }
        };
        // 2. Durable before RAM and before the reply in sync mode; shared sync, unless the
        // backing says this write is durable already.
        if let Err(e) = self.commit_request(persisted) {
            return Err(self.fail_request(layout, plan, BackingOp::Sync, e, len_locked));
        }
        // 3. RAM.
        if end > len_locked {
            if let Err(e) = layout.ram.ensure_file_bytes(end) {
                return Err(self.fail_request(layout, plan, BackingOp::Write, e, len_locked));
            }
        }
        // Every piece written to the backing must meet its chunk's plan: a short `zip`
        // would leave a Loaded chunk's RAM older than the backing (C1).
        debug_assert_eq!(
            self.geo.pieces(data_offset, end - data_offset).count(),
            plan.len(),
            "a write's pieces and its held chunks differ"
        );
        for (p, (c, how, _)) in self.geo.pieces(data_offset, end - data_offset).zip(plan) {
            debug_assert_eq!(p.chunk, *c);
            let at = (p.offset - data_offset) as usize;
            self.apply_piece(layout, *how, *c, p.offset, &data[at..at + p.len as usize]);
        }
        // 4. The new length becomes visible only after the bytes are in place.
        let grew = end > len_locked;
        if grew {
            self.len.fetch_max(end, Ordering::AcqRel);
        }
        // The memfd grows before a length that needs it is published (ram.rs), so no copy
        // bounded by the length runs past it.
        debug_assert!(
            layout.ram.file_bytes() >= self.len.load(Ordering::Acquire),
            "the length outran the memfd"
        );
        // The last chunk's charge depends on the length and on its state (see Rebate).
        let last = self
            .geo
            .index_of(self.len.load(Ordering::Acquire).saturating_sub(1));
        if grew || self.geo.index_of(end - 1) >= last {
            self.settle_rebate(layout);
        }
        Ok(grew)
    }

    /// What follows a write of `bytes` once its locks are gone: drop-behind of the backing's
    /// page cache in `sync` mode, and the loader's cursor moved back over chunks a growing
    /// write brought into range.
    fn after_write(&self, bytes: u64, grew: bool, len_locked: u64) {
        if self.cfg.durability == Durability::Sync {
            let n = bytes;
            if self.written_since_drop.fetch_add(n, Ordering::Relaxed) + n >= DROP_BEHIND_BYTES {
                self.written_since_drop.store(0, Ordering::Relaxed);
                self.backing.drop_cache(0, 0);
            }
        }
        if grew {
            // Chunks between the old end and this write are Unloaded and now in range; the
            // cursor may have passed them while the object was shorter.
            {
                let mut q = self.lq.lock();
                q.cursor = q.cursor.min(self.geo.index_of(len_locked).0);
                q.finished = None;
            }
            self.kick_loader();
        }
        self.stats.add(C::Writes, 1);
        self.stats.add(C::BytesWritten, bytes);
    }

    pub(super) fn zero_range(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.check_writable()?;
        let size = self.len.load(Ordering::Acquire);
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(());
        }
        self.stats.add(C::ZeroRanges, 1);
        let batch_bytes = ZERO_BATCH_CHUNKS * self.geo.chunk_bytes();
        let mut pos = offset;
        while pos < end {
            let stop = ((pos / batch_bytes + 1) * batch_bytes).min(end);
            self.zero_batch(pos, stop, mode)?;
            pos = stop;
        }
        Ok(())
    }

    pub(super) fn zero_batch(&self, offset: u64, end: u64, mode: ZeroMode) -> Result<()> {
        let layout = read_guard(&self.layout);
        let plan = self.lock_range(&layout, offset, end);
        let len_locked = self.len.load(Ordering::Acquire);
        let end = end.min(len_locked);
        if offset >= end {
            return Ok(());
        }
        let r = match mode {
            ZeroMode::Punch => self.backing.zero_range(offset, end - offset),
            ZeroMode::Allocate => self.backing.write_zeroes(offset, end - offset),
        };
        if let Err(e) = r {
            return Err(self.fail_request(
                &layout,
                &plan,
                BackingOp::Zero,
                backing_err(BackingOp::Zero, e),
                len_locked,
            ));
        }
        if let Err(e) = self.commit_request(Persistence::NeedsSync) {
            return Err(self.fail_request(&layout, &plan, BackingOp::Sync, e, len_locked));
        }
        for (p, (c, how, _)) in self.geo.pieces(offset, end - offset).zip(&plan) {
            if *how != WritePlan::Mirror {
                continue;
            }
            debug_assert_eq!(p.chunk, *c);
            let slot = layout.slot(*c);
            let r = slot.with_state(|st| {
                debug_assert_ne!(st, ChunkState::Loading, "a held chunk is being loaded");
                if st == ChunkState::Loaded {
                    layout.ram.zero(p.offset, p.len)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = r {
                return Err(self.fail_request(&layout, &plan, BackingOp::Zero, e, len_locked));
            }
        }
        drop(plan);
        Ok(())
    }

    pub(super) fn flush(&self) -> Result<()> {
        if self.cfg.read_only {
            return Ok(());
        }
        self.failure.check()?;
        self.stats.add(C::Flushes, 1);
        let t = self.commit.current();
        self.sync_through(t)?;
        if self.dirty.swap(false, Ordering::AcqRel) {
            // The written pages are clean now; drop the backing's cached copy (RAM has it).
            self.backing.drop_cache(0, 0);
        }
        Ok(())
    }

    pub(super) fn set_len(&self, new_len: u64) -> Result<()> {
        self.check_writable()?;
        if new_len > OBJECT_BYTES_MAX {
            return Err(Error::TooLarge {
                requested: new_len,
                max: OBJECT_BYTES_MAX,
            });
        }
        // The old length is read under the exclusive lock: read before it, a concurrent
        // size change could make this call skip the change or miss chunks to unload.
        let mut layout = write_guard(&self.layout);
        let old = self.len.load(Ordering::Acquire);
        if new_len == old {
            return Ok(());
        }
        if self.cfg.fixed_len {
            return Err(Error::OutOfRange {
                offset: new_len,
                len: 0,
                size: old,
            });
        }
        self.stats.add(C::SetLens, 1);
        if let Err(e) = self.backing.set_len(new_len) {
            // The size may or may not have changed: everything the change touches leaves
            // Loaded and is reloaded from what the backing says.
            let boundary = self.geo.index_of(old.min(new_len));
            if (boundary.0 as usize) < layout.slots.len() {
                self.invalidate(&layout, boundary);
            }
            return Err(if is_enospc(&e) {
                Error::NoSpace
            } else {
                self.failure.fail(BackingOp::SetLen, &e);
                backing_err(BackingOp::SetLen, e)
            });
        }
        let durable = self.commit_request(Persistence::NeedsSync);
        // The backing now has the new size (at least in its cache): mirror it in RAM.
        if new_len < old {
            layout.ram.set_file_bytes_exclusive(new_len)?;
            let first_gone = self.geo.chunks_for(new_len);
            for i in first_gone..self.geo.chunks_for(old) {
                // The loader loads under the shared layout lock, which we hold exclusively.
                let st = layout.state(ChunkIndex(i));
                assert_ne!(
                    st,
                    ChunkState::Loading,
                    "chunk {i} Loading during a size change"
                );
                if st == ChunkState::Loaded {
                    let slot = layout.slot(ChunkIndex(i));
                    slot.set_state(ChunkState::Unloaded);
                    slot.clear_meta();
                    self.residency.lock().remove(i);
                    self.release_chunk(ChunkIndex(i));
                    let loaded_before = self.loaded_chunks.fetch_sub(1, Ordering::AcqRel);
                    debug_assert!(loaded_before > 0, "more chunks left Loaded than entered it");
                }
            }
        } else {
            self.grow_layout(&mut layout, new_len)?;
            layout.ram.set_file_bytes_exclusive(new_len)?;
            let mut q = self.lq.lock();
            q.cursor = q.cursor.min(self.geo.index_of(old).0);
            q.finished = None;
        }
        self.len.store(new_len, Ordering::Release);
        self.settle_rebate(&layout);
        if let Err(e) = durable {
            let boundary = self.geo.index_of(old.min(new_len));
            if (boundary.0 as usize) < layout.slots.len() {
                self.invalidate(&layout, boundary);
            }
            return Err(e);
        }
        drop(layout);
        self.kick_loader();
        self.load_cv.notify_all();
        Ok(())
    }
}
