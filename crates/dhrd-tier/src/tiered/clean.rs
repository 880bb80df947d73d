//! The write-back of dirty slots to the lower tier.
//!
//! Invariants (with those of `mod.rs`): one write-back works on a slot at a time (it is
//! `busy`, so neither evicted nor picked again); it marks the slot CLEAN only if the slot's
//! write count did not move since it read the slot under its lock, after the bytes it read
//! were synced on the SSD, written to the lower tier and synced there. Its writes to the
//! lower tier are counted (`lower_writes.rs`), and the parts it completes from the lower
//! tier are put into the slot only if no write to the lower tier of the chunk began since
//! it read them.
//!
//! Crash semantics: a power cut at any point leaves the slot DIRTY on the SSD (or CLEAN
//! with the lower tier holding its bytes), so the write-back simply runs again.

use super::layout::{Entry, SLOT_CLEAN, SLOT_DIRTY};
use super::parts::Parts;
use super::shared::{Shared, State};
use crate::fastdev::read_padded;
use dhrd_io::Durable;
use std::io;
use std::sync::atomic::Ordering;

impl<F: Durable, S: Durable> Shared<F, S> {
    fn next_dirty(&self, st: &mut State) -> Option<usize> {
        let n = st.slots.len();
        if st.dirty == 0 {
            return None;
        }
        for k in 0..n {
            let i = (st.cursor + k) % n;
            if st.slots[i].state == SLOT_DIRTY && !st.slots[i].busy {
                st.cursor = i + 1;
                st.slots[i].busy = true;
                return Some(i);
            }
        }
        None
    }

    /// Copies dirty slot `i` to the lower tier and marks it CLEAN unless written meanwhile.
    /// A slot holding only some parts is completed first, so that a clean slot always holds
    /// its whole chunk and later reads of it never reach the lower tier: the parts it lacks
    /// are read from the lower tier without the slot's lock (writes to the chunk need not
    /// wait for the slow tier; the lower tier's bytes of parts the slot lacks are current),
    /// written into the slot under the lock, and named once the sync below made them durable.
    fn write_back(&self, i: usize) -> io::Result<()> {
        let (chunk, held) = {
            let st = self.state.lock();
            (st.slots[i].chunk, st.slots[i].parts)
        };
        let (start, end) = self.chunk_range(chunk);
        let all = self.chunk_parts(chunk);
        let mut whole = None;
        let mut seen = None;
        if held != all {
            // While the slot names the chunk only this write-back writes the chunk to the
            // lower tier; the count checks that all the same, as for every read of the
            // lower tier whose bytes go into a slot (`lower_writes.rs`).
            seen = Some(self.lower_writes.wait_seen(chunk));
            let mut b = vec![0u8; (end - start) as usize];
            read_padded(&self.lower, &mut b, start)?;
            whole = Some(b);
        }
        let base = self.slot_offset(i);
        let (before, filled, pieces) = {
            let _g = self.locks[i].lock();
            let (before, held) = {
                let st = self.state.lock();
                // A dirty slot being written back is neither evicted nor dropped.
                assert_eq!(
                    st.slots[i].chunk, chunk,
                    "slot {i} changed chunk while dirty"
                );
                (st.slots[i].writes, st.slots[i].parts)
            };
            let mut filled = Parts::NONE;
            if seen.is_some_and(|s| !self.lower_writes.unchanged(s)) {
                return Ok(()); // the lower tier changed under the read: try again later
            }
            let pieces = match whole {
                Some(mut w) => {
                    // Parts added by writes since the read above are in the slot already.
                    self.lay_parts_over(i, held, &mut w)?;
                    filled = all.minus(held);
                    for (x, y) in self.byte_runs(filled, w.len()) {
                        self.ssd_write(&w[x..y], base + x as u64)?;
                    }
                    vec![(0, w)]
                }
                None => {
                    let mut pieces = Vec::new();
                    for (x, y) in self.byte_runs(held, (end - start) as usize) {
                        let mut b = vec![0u8; y - x];
                        read_padded(&self.ssd, &mut b, base + x as u64)?;
                        pieces.push((x as u64, b));
                    }
                    pieces
                }
            };
            (before, filled, pieces)
        };
        self.ssd_sync()?;
        {
            let _writing = self.lower_writes.begin(chunk);
            for (x, b) in &pieces {
                self.lower.write_at(b, start + x)?;
            }
            self.lower.sync()?;
        }
        let mut st = self.state.lock();
        let clean = st.slots[i].writes == before && st.slots[i].state == SLOT_DIRTY;
        // Filled parts a write took meanwhile were named by that write; naming the rest is
        // safe whatever happened since: their bytes are durable and equal the lower tier's.
        let parts = st.slots[i].parts.union(filled);
        if !clean && parts == st.slots[i].parts {
            return Ok(());
        }
        let e = Entry::new(chunk, if clean { SLOT_CLEAN } else { SLOT_DIRTY }, parts);
        self.write_entry(&mut st, i, e)?;
        st.slots[i].parts = parts;
        if !filled.is_empty() {
            self.completions.fetch_add(1, Ordering::Relaxed);
        }
        if clean {
            st.slots[i].state = SLOT_CLEAN;
            st.dirty -= 1;
            self.written_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

pub(super) fn writeback_loop<F: Durable, S: Durable>(s: &Shared<F, S>) {
    s.background().run(
        |st| s.next_dirty(st),
        |i| s.write_back(i),
        |st, i| st.slots[i].busy = false,
    );
}
