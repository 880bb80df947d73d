//! The write paths of the tiered device: into the chunk's slot, into a new slot, and to
//! the lower tier alone (write-through, or no slot to be had).
//!
//! Invariants (with those of `mod.rs`):
//! - Every write into a slot is counted in the slot before it changes anything
//!   (`write_into_slot`), so the write-back never marks a slot CLEAN over a write it did
//!   not copy.
//! - A slot is named for a chunk only if no write to the lower tier of that chunk was in
//!   flight when the bytes it takes from there were read, and none began since
//!   (`lower_writes.rs`); a write to the lower tier begins before it looks for the slot.
//! - A write to the lower tier alone is acknowledged only when no entry that named the
//!   chunk can come back after a power cut: the FREE entry that dropped its slot is
//!   durable, and the SSD has not failed.
//!
//! Crash semantics: a write is acknowledged only after its bytes are durable on the SSD
//! (in a slot whose entry names them) or on the lower tier (with no entry naming the chunk
//! any more); an unacknowledged write leaves each sector old or new.

use super::layout::{Entry, SLOT_CLEAN, SLOT_DIRTY};
use super::parts::{self, Parts};
use super::requests::Reached;
use super::shared::{Shared, State, FILL_TRIES_MAX};
use crate::fastdev::read_padded;
use dhrd_io::Durable;
use std::io;
use std::sync::atomic::Ordering;

/// What `write_cached` did with a write.
pub(super) enum Cached {
    /// Into the chunk's slot; whether the edges of a part came from the lower tier.
    Slot(Reached),
    /// No slot could be had: the caller writes the lower tier.
    NoSlot,
}

impl<F: Durable, S: Durable> Shared<F, S> {
    /// Writes `buf` at chunk-relative byte `a` of chunk `c` into slot `i`, whose lock the
    /// caller holds, and returns the parts the write touched. The slot holds `held`
    /// already; a touched part outside `held` that the write covers only partly gets its
    /// other bytes from the lower tier, so that every touched part holds the chunk's bytes
    /// (then the write `Reached::Lower`).
    fn write_parts(
        &self,
        i: usize,
        c: u64,
        held: Parts,
        buf: &[u8],
        a: u64,
    ) -> io::Result<(Parts, Reached)> {
        let (start, end) = self.chunk_range(c);
        let pb = self.geo.part_bytes();
        let (touched, edges) = parts::touched(pb, end - start, a, a + buf.len() as u64);
        let base = self.slot_offset(i);
        let mut reached = Reached::Ssd;
        for (x, y) in edges {
            if held.contains(x / pb) {
                continue;
            }
            let mut fill = vec![0u8; (y - x) as usize];
            read_padded(&self.lower, &mut fill, start + x)?;
            reached = Reached::Lower;
            self.ssd_write(&fill, base + x)?;
        }
        self.ssd_write(buf, base + a)?;
        Ok((touched, reached))
    }

    /// Writes `buf` at chunk-relative byte `a` into slot `i`, which holds chunk `c` DIRTY
    /// and whose lock the caller holds. Parts new to the slot are named by its entry only
    /// after their bytes are durable; the caller's final sync makes the entry durable.
    fn write_dirty_slot(&self, i: usize, c: u64, buf: &[u8], a: u64) -> io::Result<Reached> {
        // A DIRTY slot's parts only grow: writes add them under the slot's lock, which the
        // caller holds, and the write-back names the parts it completed without that lock.
        // So `held` may fall behind, never ahead: a part it lacks but the write-back filled
        // holds the lower tier's bytes, as does an edge fill from there.
        let held = self.state.lock().slots[i].parts;
        let (touched, reached) = self.write_parts(i, c, held, buf, a)?;
        if touched.minus(held).is_empty() {
            return Ok(reached);
        }
        self.ssd_sync()?;
        let mut st = self.state.lock();
        debug_assert_eq!(st.slots[i].state, SLOT_DIRTY);
        // The current parts, not `held`: naming from a stale `held` would drop parts the
        // write-back named meanwhile, and with them later writes into those parts.
        let parts = st.slots[i].parts.union(touched);
        let e = Entry::new(c, SLOT_DIRTY, parts);
        self.write_entry(&mut st, i, e)?;
        st.slots[i].parts = parts;
        Ok(reached)
    }

    /// Writes `buf` at chunk-relative byte `a` into slot `i`, which holds chunk `c`: the
    /// caller holds the slot's lock and saw, under `st`, that it holds the chunk. Every
    /// write into a slot goes through here. It is counted before anything changes: the
    /// write-back marks a slot CLEAN only if the count did not move since it read the slot,
    /// so a write it did not copy keeps the slot dirty. A CLEAN slot is marked DIRTY durably
    /// before its bytes change.
    fn write_into_slot(
        &self,
        mut st: parking_lot::MutexGuard<'_, State>,
        i: usize,
        c: u64,
        buf: &[u8],
        a: u64,
    ) -> io::Result<Reached> {
        debug_assert_eq!(st.by_chunk.get(&c), Some(&i));
        st.slots[i].writes += 1;
        if st.slots[i].state == SLOT_CLEAN {
            st.slots[i].state = SLOT_DIRTY;
            st.dirty += 1;
            let e = Entry::new(c, SLOT_DIRTY, st.slots[i].parts);
            self.write_entry(&mut st, i, e)?;
            drop(st);
            self.ssd_sync()?;
        } else {
            drop(st);
        }
        self.write_dirty_slot(i, c, buf, a)
    }

    /// Write-back mode: writes into the chunk's slot, taking one if the SSD does not hold
    /// the chunk. `NoSlot` when no slot could be had (every one dirty or busy), or when
    /// writes to the lower tier kept spoiling the fill of a new one.
    pub(super) fn write_cached(&self, c: u64, buf: &[u8], offset: u64) -> io::Result<Cached> {
        let a = offset - self.chunk_range(c).0;
        let mut fills = 0;
        // A fill that had to be repeated read the lower tier all the same.
        let mut reached = Reached::Ssd;
        loop {
            let found = self.state.lock().by_chunk.get(&c).copied();
            if let Some(i) = found {
                let _g = self.locks[i].lock();
                let st = self.state.lock();
                if st.by_chunk.get(&c) != Some(&i) {
                    continue; // evicted meanwhile
                }
                let r = self.write_into_slot(st, i, c, buf, a)?;
                return Ok(Cached::Slot(reached.and(r)));
            }
            let Some(i) = self.take_slot()? else {
                return Ok(Cached::NoSlot);
            };
            let _g = self.locks[i].lock();
            // The edges of the parts the write covers partly come from the lower tier:
            // taken once no write to it is in flight, and named only if none began since.
            // (Waiting holds the lock of a slot nobody else can find, so it cannot deadlock.)
            let seen = self.lower_writes.wait_seen(c);
            // Only the parts the write touches: the rest of the chunk stays on the lower
            // tier and is not read now.
            let r = (|| {
                let touched = self.write_parts(i, c, Parts::NONE, buf, a)?;
                self.ssd_sync()?;
                Ok(touched)
            })();
            let parts = match r {
                Ok((p, r)) => {
                    reached = reached.and(r);
                    p
                }
                Err(e) => {
                    self.untake(i);
                    return Err(e);
                }
            };
            let mut st = self.state.lock();
            if st.by_chunk.contains_key(&c) {
                // Another writer cached it first: retry on that slot.
                st.free.push(i);
                continue;
            }
            if !self.lower_writes.unchanged(seen) {
                // A write reached the lower tier meanwhile: the edges may be older, and
                // until now such a write did not find this slot. Fill again.
                st.free.push(i);
                fills += 1;
                if fills == FILL_TRIES_MAX {
                    return Ok(Cached::NoSlot);
                }
                continue;
            }
            let e = Entry::new(c, SLOT_DIRTY, parts);
            self.write_entry(&mut st, i, e)?;
            st.slots[i].hold(c, SLOT_DIRTY, parts, 1);
            st.by_chunk.insert(c, i);
            st.dirty += 1;
            st.policy.insert(c);
            if parts != self.chunk_parts(c) {
                self.partial_fills.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Cached::Slot(reached));
        }
    }

    /// Write-through (and the write-back mode's fallback): drops the chunk's slot, durably,
    /// then writes the lower tier. A write that finds the chunk's slot dirty goes into it
    /// instead, and reaches the lower tier only if that does.
    pub(super) fn write_lower(&self, c: u64, buf: &[u8], offset: u64) -> io::Result<Reached> {
        // Counted before the look-up: a slot named for the chunk after the look-up missed
        // it is named only if this write had not begun (`lower_writes.rs`).
        let looking = self.lower_writes.begin(c);
        let found = self.state.lock().by_chunk.get(&c).copied();
        let _writing = match found {
            None => looking,
            Some(i) => {
                // Not counted while it waits for the slot's lock: a write filling a new slot
                // holds that slot's lock while it waits for the count, and this slot may be
                // it by now (evicted and taken). Counted again before the second look.
                drop(looking);
                let _g = self.locks[i].lock();
                let writing = self.lower_writes.begin(c);
                let mut st = self.state.lock();
                if st.by_chunk.get(&c) == Some(&i) {
                    if st.slots[i].state == SLOT_DIRTY {
                        // Its newer bytes must reach the lower tier first: write into the
                        // slot instead (write-back keeps it; write-through drains below).
                        let (start, _) = self.chunk_range(c);
                        let r = self.write_into_slot(st, i, c, buf, offset - start)?;
                        self.ssd_sync()?;
                        return Ok(r);
                    }
                    st.by_chunk.remove(&c);
                    st.policy.remove(c);
                    st.slots[i].clear();
                    self.write_entry(&mut st, i, Entry::FREE)?;
                    self.note_dropped(&mut st, c);
                    drop(st);
                    self.ssd_sync()?;
                    // Reused only now that its FREE entry is durable.
                    self.state.lock().free.push(i);
                }
                writing
            }
        };
        // No slot names the chunk in memory, and none can until this write ended. But an
        // entry that freed one (here or in an eviction) may not be durable yet, or may have
        // failed: were the power cut after this write was acknowledged, the old entry would
        // name the chunk again, with bytes older than this write. So it is made durable
        // first, and once the SSD failed this write fails before it changes anything. (A
        // failed entry write sets the failure under the state lock, before this look.)
        let pending = {
            let st = self.state.lock();
            self.check()?;
            st.dropped.get(&c).is_some_and(|t| !self.failed.covered(*t))
        };
        if pending {
            self.ssd_sync()?;
        }
        self.lower.write_at(buf, offset)?;
        self.lower.sync()?;
        Ok(Reached::Lower)
    }
}
