//! The state the tiered device's requests and write-back threads share: the slots in
//! memory, the device pair, the counters, and the steps every path takes on them
//! (writing a slot's entry, taking a slot, promoting a chunk, reading a slot's parts).
//!
//! Invariants:
//! - A lower chunk is in at most one slot, on the device too: a slot is reused only after
//!   its entry says FREE durably (`take_slot`, `untake`).
//! - A slot's newest entry is durable before the next change of it overwrites the other
//!   table copy (`write_entry`), so a change that fails or is cut off leaves the newest
//!   entry, never an older one that may name the slot's previous chunk; and nothing is
//!   written to the SSD once a write or sync of it failed (`check`, `StickyFailure`).
//! - Bytes read from the lower tier without a lock (a promotion) go into a slot only if
//!   no write to the lower tier of the chunk was in flight when they were read or began
//!   since (`lower_writes.rs`).
//! - Dirty slots are never evicted.
//! - Entries change under the state lock, so they change in the order memory sees.
//! - SSD syncs run one at a time, and none succeeds once a write or sync of the SSD
//!   failed (`fastdev::StickyFailure`).
//!
//! Crash semantics: an entry names a chunk, or a part of it, only after the slot's bytes
//! for it are durable, so a crash never pairs an entry with another chunk's bytes or with
//! a part never written.

use super::layout::{self, Entry, Geometry, SLOT_CLEAN, SLOT_FREE};
use super::lower_writes::{LowerWrites, Seen};
use super::mode::TierMode;
use super::parts::Parts;
use super::requests::RequestCounts;
use crate::fastdev::{read_padded, Background, StickyFailure};
use crate::pairing::Paired;
use dhrd_engine::cache::{AccessBits, Residency};
use dhrd_io::Durable;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Victims looked at before a promotion or an allocation gives up (dirty slots cannot be
/// evicted).
pub(super) const VICTIM_TRIES_MAX: usize = 32;
/// Times a write that takes a new slot fills it and finds a write to the lower tier began
/// meanwhile, before it writes the lower tier itself instead (so that it cannot be kept
/// waiting for ever by a stream of them).
pub(super) const FILL_TRIES_MAX: usize = 4;

pub(super) struct Slot {
    pub(super) chunk: u64,
    pub(super) state: u8,
    /// The parts holding the chunk's bytes (what the entry says, or will once durable).
    pub(super) parts: Parts,
    pub(super) writes: u64,
    pub(super) busy: bool,
    /// The sequence number of the slot's newest entry on the device (`layout.rs`).
    pub(super) seq: u64,
    /// The SSD's sync number after which the newest entry is durable (`None`: it is).
    pub(super) entry_ticket: Option<u64>,
}

impl Slot {
    /// Holds `chunk` in `state` with `parts`, after `writes` writes.
    pub(super) fn hold(&mut self, chunk: u64, state: u8, parts: Parts, writes: u64) {
        self.chunk = chunk;
        self.state = state;
        self.parts = parts;
        self.writes = writes;
        self.busy = false;
    }

    pub(super) fn clear(&mut self) {
        self.hold(0, SLOT_FREE, Parts::NONE, 0);
    }
}

pub(super) struct State {
    pub(super) slots: Vec<Slot>,
    pub(super) by_chunk: HashMap<u64, usize>,
    pub(super) free: Vec<usize>,
    pub(super) policy: Residency,
    pub(super) counts: HashMap<u64, u8>,
    /// Chunks whose slot was freed by an entry that may not be durable yet, with the SSD
    /// sync number after which it is: a write of such a chunk to the lower tier alone
    /// waits for it (`write_lower`). Covered ones are pruned as it grows.
    pub(super) dropped: HashMap<u64, u64>,
    pub(super) dirty: u64,
    pub(super) cursor: usize,
}

pub(super) struct Counts(std::cell::RefCell<HashMap<u64, u8>>);

impl AccessBits for Counts {
    fn count(&self, c: u64) -> u8 {
        self.0.borrow().get(&c).copied().unwrap_or(0)
    }
    fn set_count(&self, c: u64, n: u8) {
        self.0.borrow_mut().insert(c, n);
    }
}

pub(super) struct Shared<F: Durable, S: Durable> {
    pub(super) ssd: F,
    pub(super) lower: S,
    pub(super) geo: Geometry,
    pub(super) mode: TierMode,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    /// One lock per slot: data changes and write-back reads of a slot serialise.
    pub(super) locks: Vec<Mutex<()>>,
    /// Writes to the lower tier, counted per chunk: bytes read from it without a lock go
    /// into a slot only if none began meanwhile (`lower_writes.rs`).
    pub(super) lower_writes: LowerWrites,
    pub(super) stop: AtomicBool,
    /// A write or sync of the SSD failed: its table may name chunks memory has dropped,
    /// so no write is acknowledged any more (a write to the lower tier alone could be
    /// shadowed by such an entry after a restart). Reads go on. Also runs the SSD's syncs
    /// one at a time (`fastdev::StickyFailure`).
    pub(super) failed: StickyFailure,
    pub(super) reads_ssd: AtomicU64,
    pub(super) reads_lower: AtomicU64,
    pub(super) promotions: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) written_back: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) bypassed: AtomicU64,
    pub(super) partial_fills: AtomicU64,
    pub(super) completions: AtomicU64,
    pub(super) requests: RequestCounts,
    /// `SlotSync::AtFlush`: a write into a slot skips its last sync.
    pub(super) sync_at_flush: AtomicBool,
    pub(super) dirty_at_open: u64,
    pub(super) upgraded_dirty: u64,
    /// The lower tier as the opener named it, and the number of the SSD's pairing record
    /// written at open (`pairing.rs`); a clean close writes the next one.
    pub(super) paired: Paired,
}

impl<F: Durable, S: Durable> Shared<F, S> {
    pub(super) fn background(&self) -> Background<'_, State> {
        Background {
            state: &self.state,
            cv: &self.cv,
            stop: &self.stop,
            failures: &self.failures,
            failed: &self.failed,
        }
    }

    pub(super) fn chunk_range(&self, c: u64) -> (u64, u64) {
        let start = c * self.geo.chunk_bytes;
        (
            start,
            (start + self.geo.chunk_bytes).min(self.geo.lower_bytes),
        )
    }

    pub(super) fn slot_offset(&self, slot: usize) -> u64 {
        self.geo.data_offset() + slot as u64 * self.geo.chunk_bytes
    }

    /// All parts of chunk `c` (the device's last chunk may be short).
    pub(super) fn chunk_parts(&self, c: u64) -> Parts {
        let (start, end) = self.chunk_range(c);
        Parts::all((end - start).div_ceil(self.geo.part_bytes()))
    }

    /// Writes slot `slot`'s entry `e` into the copy that does not hold its newest one
    /// (`layout.rs`); under the state lock (`st`), so that entries change in the order
    /// memory sees.
    ///
    /// The copy it overwrites holds the entry before the newest. Should this write fail
    /// or be cut off, the newest entry decides what the slot holds after a restart, so it
    /// must be durable first: else a power cut could leave only the older entry valid,
    /// which may name the slot's previous chunk while the slot holds another's bytes. So
    /// when no sync has covered the newest entry yet (a promotion or a write-back names
    /// a slot without one of its own), this syncs first, under the lock. That is rare:
    /// nearly every change of an entry is followed by a sync anyway.
    pub(super) fn write_entry(&self, st: &mut State, slot: usize, mut e: Entry) -> io::Result<()> {
        if let Some(t) = st.slots[slot].entry_ticket {
            if !self.failed.covered(t) {
                self.ssd_sync()?;
            }
        }
        e.seq = st.slots[slot].seq + 1;
        self.ssd_write(
            &layout::encode_entry(&e),
            self.geo.entry_offset(slot, e.seq),
        )?;
        // Only after the write: a failed one changed nothing in memory (and nothing is
        // written to the SSD after a failure).
        st.slots[slot].seq = e.seq;
        st.slots[slot].entry_ticket = Some(self.failed.ticket());
        Ok(())
    }

    /// Every change of the SSD goes through here and `ssd_sync`: a failure is sticky, and
    /// after one nothing more is written (a later entry could overwrite the only valid
    /// copy of an older one).
    pub(super) fn ssd_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.failed.check()?;
        self.failed.write(self.ssd.write_at(buf, offset))
    }

    /// Syncs the SSD (or shares a sync that began after the call), one sync at a time, and
    /// fails once any write or sync of it failed:
    /// what a sync that returns Ok vouches for (an acknowledgement, a slot marked CLEAN,
    /// a slot reused) was not dropped by an earlier failure.
    pub(super) fn ssd_sync(&self) -> io::Result<()> {
        self.failed.sync(&self.ssd)
    }

    pub(super) fn check(&self) -> io::Result<()> {
        self.failed.check()
    }

    /// A free slot, evicting a clean one if needed (its FREE entry made durable before
    /// the slot can be reused). `None` when every slot is dirty or busy.
    pub(super) fn take_slot(&self) -> io::Result<Option<usize>> {
        let mut st = self.state.lock();
        if let Some(i) = st.free.pop() {
            return Ok(Some(i));
        }
        for _ in 0..VICTIM_TRIES_MAX {
            let bits = Counts(std::cell::RefCell::new(std::mem::take(&mut st.counts)));
            let v = st.policy.victim(&bits);
            st.counts = bits.0.into_inner();
            let Some(chunk) = v else {
                return Ok(None);
            };
            let Some(&i) = st.by_chunk.get(&chunk) else {
                continue;
            };
            if st.slots[i].state != SLOT_CLEAN || st.slots[i].busy {
                // Dirty or being written back: keep it, try another.
                st.policy.insert(chunk);
                continue;
            }
            st.by_chunk.remove(&chunk);
            st.counts.remove(&chunk);
            st.slots[i].clear();
            self.write_entry(&mut st, i, Entry::FREE)?;
            self.note_dropped(&mut st, chunk);
            drop(st);
            self.ssd_sync()?;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(i));
        }
        Ok(None)
    }

    /// Notes that the slot of `chunk` was just freed by an entry not yet synced.
    pub(super) fn note_dropped(&self, st: &mut State, chunk: u64) {
        if st.dropped.len() as u64 >= self.geo.slots {
            st.dropped.retain(|_, t| !self.failed.covered(*t));
        }
        st.dropped.insert(chunk, self.failed.ticket());
    }

    /// Gives a slot taken by `take_slot` back unused.
    pub(super) fn untake(&self, i: usize) {
        self.state.lock().free.push(i);
    }

    /// Copies chunk `c` (whose bytes `whole` holds, read from the lower tier after `seen`)
    /// into a new slot as CLEAN, unless a write to the lower tier of the chunk began since:
    /// `whole` may then be older than an acknowledged write.
    pub(super) fn promote(&self, c: u64, whole: &[u8], seen: Seen) -> io::Result<()> {
        let Some(i) = self.take_slot()? else {
            return Ok(());
        };
        let _g = self.locks[i].lock();
        let r = (|| {
            self.ssd_write(whole, self.slot_offset(i))?;
            self.ssd_sync()
        })();
        if let Err(e) = r {
            self.untake(i);
            return Err(e);
        }
        // The checks and the entry under one lock: a chunk is never named by two entries,
        // and a write to the lower tier that begins after the check finds this slot.
        let mut st = self.state.lock();
        if st.by_chunk.contains_key(&c) || !self.lower_writes.unchanged(seen) {
            // A write cached it, or reached the lower tier, meanwhile; this slot's entry is
            // still FREE.
            st.free.push(i);
            return Ok(());
        }
        let parts = self.chunk_parts(c);
        let e = Entry::new(c, SLOT_CLEAN, parts);
        if let Err(e) = self.write_entry(&mut st, i, e) {
            st.free.push(i);
            return Err(e);
        }
        st.slots[i].hold(c, SLOT_CLEAN, parts, 0);
        st.by_chunk.insert(c, i);
        st.policy.insert(c);
        self.promotions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Serves `dst`, at chunk-relative byte `a` of chunk `c`, from slot `i`, whose lock the
    /// caller holds and which lacks some of the parts `dst` needs: the lower tier's bytes
    /// with the slot's parts laid over them. (The write-back completes the slot.)
    pub(super) fn read_merged(
        &self,
        i: usize,
        c: u64,
        held: Parts,
        dst: &mut [u8],
        a: u64,
    ) -> io::Result<()> {
        let (start, end) = self.chunk_range(c);
        let mut whole = vec![0u8; (end - start) as usize];
        read_padded(&self.lower, &mut whole, start)?;
        self.lay_parts_over(i, held, &mut whole)?;
        dst.copy_from_slice(&whole[a as usize..a as usize + dst.len()]);
        Ok(())
    }

    /// Copies the parts `held` of slot `i` over `whole`, a buffer of its whole chunk.
    pub(super) fn lay_parts_over(&self, i: usize, held: Parts, whole: &mut [u8]) -> io::Result<()> {
        let base = self.slot_offset(i);
        for (x, y) in self.byte_runs(held, whole.len()) {
            read_padded(&self.ssd, &mut whole[x..y], base + x as u64)?;
        }
        Ok(())
    }

    /// Byte ranges, relative to the chunk, of the runs of `parts` in a chunk of `len` bytes.
    pub(super) fn byte_runs(
        &self,
        parts: Parts,
        len: usize,
    ) -> impl Iterator<Item = (usize, usize)> {
        let pb = self.geo.part_bytes() as usize;
        parts
            .runs()
            .map(move |(p, q)| (p as usize * pb, (q as usize * pb).min(len)))
    }
}
