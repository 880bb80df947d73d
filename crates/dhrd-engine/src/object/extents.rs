//! Block status: how a range of the object is allocated, for sparse copies (NBD
//! `base:allocation`). Answered from what the backing knows of its holes and what the RAM
//! tier knows is zero, without reading any data.
//!
//! Invariants:
//! - a range is reported as reading zeros (`Zero` or `Hole`) only when a read of it would
//!   return zeros: for a Loaded chunk, a hole in the RAM tier's memfd (C2: reads of Loaded
//!   chunks come from RAM); for any chunk, a hole in the backing, since every write reaches
//!   the backing before it is acknowledged and a Loaded chunk's RAM equals the backing
//!   (C1). After a sticky failure that no longer holds for chunks the failed request
//!   touched, so from then on a Loaded chunk trusts only its RAM;
//! - a Loaded chunk's RAM answer counts only if the chunk stayed Loaded throughout (its
//!   state word, generation included, is the same before and after), as for reads;
//! - a request concurrent with writes may see the range before or after them, as a read
//!   would: the protocol orders nothing between concurrent requests;
//! - no data is read and nothing is loaded: the answer costs `lseek` calls only.

use super::{read_guard, HybridObject, Inner, Layout};
use crate::error::Result;
use crate::slot::{state_of, ChunkState};
use dhrd_io::{Allocation, Durable, Extent};
use std::sync::atomic::{fence, Ordering};

impl<D: Durable> HybridObject<D> {
    /// How `[offset, offset + len)` is allocated, as consecutive extents from `offset`
    /// (clipped to the length; empty past it). At most `max_extents` extents (at least
    /// one): they may then cover less than `len`, and the caller asks again for the rest.
    pub fn extents(&self, offset: u64, len: u64, max_extents: usize) -> Result<Vec<Extent>> {
        self.inner.check_reads_allowed()?;
        Ok(self.inner.extents(offset, len, max_extents.max(1)))
    }
}

/// Appends an extent, merging it into the last one when they are alike; false when
/// `max` extents are there already and it is unlike the last.
fn push(out: &mut Vec<Extent>, e: Extent, max: usize) -> bool {
    if let Some(last) = out.last_mut().filter(|l| l.allocation == e.allocation) {
        last.len += e.len;
        return true;
    }
    if out.len() >= max {
        return false;
    }
    out.push(e);
    true
}

impl<D: Durable> Inner<D> {
    fn extents(&self, offset: u64, len: u64, max: usize) -> Vec<Extent> {
        let layout = read_guard(&self.layout);
        let size = self.len.load(Ordering::Acquire);
        let end = offset.saturating_add(len).min(size);
        let mut out = Vec::new();
        // After a sticky failure a Loaded chunk may differ from the backing (see the
        // module header): then only its RAM speaks for it.
        let trust_backing_hole = !self.failure.is_failed();
        let mut pos = offset;
        while pos < end {
            let backing = match self.backing.extent_at(pos, end - pos) {
                Ok(e) if e.len > 0 => e,
                _ => Extent::data(end - pos),
            };
            let run_end = pos + backing.len.min(end - pos);
            if backing.allocation == Allocation::Hole && trust_backing_hole {
                if !push(
                    &mut out,
                    Extent {
                        len: run_end - pos,
                        ..backing
                    },
                    max,
                ) {
                    return out;
                }
                pos = run_end;
                continue;
            }
            // The backing holds data here (or cannot be trusted): Loaded chunks may still
            // know zeros, chunk by chunk.
            for p in self.geo.pieces(pos, run_end - pos) {
                if !self.piece_extents(&layout, p.chunk, p.offset, p.len, backing, &mut out, max) {
                    return out;
                }
            }
            pos = run_end;
        }
        out
    }

    /// Extents of `[at, at + len)`, inside one chunk, where the backing says `backing`.
    /// False when `max` was reached.
    #[allow(clippy::too_many_arguments)] // one loop's state, named rather than bundled
    fn piece_extents(
        &self,
        layout: &Layout,
        c: crate::units::ChunkIndex,
        at: u64,
        len: u64,
        backing: Extent,
        out: &mut Vec<Extent>,
        max: usize,
    ) -> bool {
        let from_backing = Extent { len, ..backing };
        let w = layout.word(c);
        if state_of(w) != ChunkState::Loaded {
            // I5: the backing answers for a chunk that is not Loaded.
            return push(out, from_backing, max);
        }
        let mut found = Vec::new();
        let mut p = at;
        while p < at + len {
            let e = layout.ram.extent(p, at + len - p);
            let allocation = match e.allocation {
                Allocation::Data => Allocation::Data,
                // RAM holds zeros; whether the backing has storage there is its business.
                _ if backing.allocation == Allocation::Hole => Allocation::Hole,
                _ => Allocation::Zero,
            };
            found.push(Extent {
                len: e.len,
                allocation,
            });
            p += e.len;
        }
        fence(Ordering::Acquire);
        if layout.word(c) != w {
            // Left Loaded while we looked: its RAM may have been given back meanwhile.
            return push(out, from_backing, max);
        }
        found.into_iter().all(|e| push(out, e, max))
    }
}
