//! A data section's state: its extents, clean set and reuse lists, with the operations that
//! keep them consistent. The invariants are stated in `rehypar.rs`; [`Section::check`]
//! verifies them.

use super::chunk::{BlockOffset, MapOutcome};
use super::{ChunkPos, ExtentNo, SectionInfo};
use crate::space::{BlockAddr, BlockCount, LiveSet};
use crate::Error;
use std::collections::{BTreeMap, BTreeSet};

/// A resident extent's bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resident {
    /// Where the next allocation in this extent starts (a chunk start, or the extent end).
    pub(super) fill: BlockOffset,
    /// Live allocations touching this extent, and their blocks inside it.
    pub(super) live_allocs: u32,
    pub(super) live_blocks: u64,
    /// Allocation tick at which the extent received its first data: its resident time t
    /// is measured from here.
    pub(super) since_tick: u64,
    /// The reuse list it is in, if any.
    pub(super) listed: Option<ChunkPos>,
    /// Its reuse window ended (by the allocation count, or by the caller's clock through
    /// `ReHypar::seal`): it never joins a list again, whatever is freed in it.
    pub(super) sealed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ExtentState {
    Clean,
    Resident(Resident),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ListEntry {
    pub(super) unused: BlockCount,
    pub(super) extent: ExtentNo,
}

#[derive(Debug)]
pub(super) struct Section {
    pub(super) info: SectionInfo,
    pub(super) states: Vec<ExtentState>,
    pub(super) clean: BTreeSet<u32>,
    /// The per-level reuse lists, keyed by the chunk where the listed extents' free space
    /// begins; empty lists are removed, so iteration visits only candidates.
    pub(super) lists: BTreeMap<ChunkPos, Vec<ListEntry>>,
    /// Sum of `unused` over all list entries (free space outside clean extents).
    pub(super) listed_unused_blocks: u64,
}

impl Section {
    pub(super) fn s(&self) -> u64 {
        self.info.geometry.extent_blocks().0
    }

    pub(super) fn extent_addr(&self, x: u32) -> BlockAddr {
        BlockAddr(self.info.base.0 + u64::from(x) * self.s())
    }

    pub(super) fn end(&self) -> BlockAddr {
        self.info.base.plus(self.info.blocks())
    }

    pub(super) fn link(&mut self, x: u32, pos: ChunkPos, unused: BlockCount) {
        let list = self.lists.entry(pos).or_default();
        // After every entry with at least as much unused space: equal ones keep the order
        // in which they joined, so the longest-waiting comes first among equals.
        let at = list.partition_point(|e| e.unused >= unused);
        list.insert(
            at,
            ListEntry {
                unused,
                extent: ExtentNo(x),
            },
        );
        self.listed_unused_blocks += unused.0;
    }

    pub(super) fn unlink(&mut self, x: u32, pos: ChunkPos) {
        let list = self.lists.get_mut(&pos);
        let Some(list) = list else {
            unreachable!("extent {x} marked as listed at {pos:?}, which has no list");
        };
        let Some(at) = list.iter().position(|e| e.extent == ExtentNo(x)) else {
            unreachable!("extent {x} marked as listed at {pos:?} but not in that list");
        };
        let e = list.remove(at);
        self.listed_unused_blocks -= e.unused.0;
        if list.is_empty() {
            self.lists.remove(&pos);
        }
    }

    /// The clean extent closest to extent `near`, or the lowest one without a hint.
    pub(super) fn clean_near(&self, near: Option<u32>) -> Option<u32> {
        let Some(n) = near else {
            return self.clean.first().copied();
        };
        let after = self.clean.range(n..).next().copied();
        let before = self.clean.range(..n).next_back().copied();
        match (before, after) {
            (Some(b), Some(a)) => Some(if n - b < a - n { b } else { a }),
            (b, a) => a.or(b),
        }
    }

    /// Moves resident extent `x`'s fill offset back to the chunk MAP gives after its last
    /// live allocation (`FreePolicy::RewindToLastLive`), relisting it under the new chunk.
    /// `listable` is false when its reuse window has expired.
    pub(super) fn rewind(&mut self, x: u32, live: &LiveSet, reuse_min: BlockCount, listable: bool) {
        let ExtentState::Resident(mut r) = self.states[x as usize] else {
            unreachable!("rewinding clean extent {x}");
        };
        let s = self.s();
        let base = self.extent_addr(x).0;
        let Some(last) = live
            .last_starting_before(BlockAddr(base + s))
            .filter(|e| e.end().0 > base)
        else {
            unreachable!("resident extent {x} without a live allocation");
        };
        let last_block = BlockOffset(last.end().0.min(base + s) - 1 - base);
        let fill = match self.info.geometry.map(last_block) {
            Some(MapOutcome::Next { next, .. }) => next.start,
            Some(MapOutcome::Full { .. }) => BlockOffset(s),
            None => unreachable!("block {} outside extent {x}", last_block.0),
        };
        if fill >= r.fill {
            return;
        }
        if let Some(pos) = r.listed.take() {
            self.unlink(x, pos);
        }
        r.fill = fill;
        let unused = BlockCount(s - fill.0);
        if listable && !r.sealed && unused >= reuse_min {
            if let Some(c) = self.info.geometry.chunk_at(fill) {
                self.link(x, c.pos(), unused);
                r.listed = Some(c.pos());
            }
        }
        self.states[x as usize] = ExtentState::Resident(r);
    }

    /// Checks this section against the live set (see the invariants in `rehypar.rs`): each
    /// extent's state against what the live set has in it, then the reuse lists.
    pub(super) fn check(
        &self,
        sid: usize,
        live: &LiveSet,
        reuse_min: BlockCount,
    ) -> Result<(), Error> {
        let per_extent = self.live_per_extent(sid, live)?;
        let listed = self.check_extents(sid, &per_extent)?;
        self.check_lists(sid, listed, reuse_min)
    }

    /// Per extent of this section: the live allocations in it, their blocks in it, and the
    /// highest offset they reach, recomputed from the live set.
    fn live_per_extent(
        &self,
        sid: usize,
        live: &LiveSet,
    ) -> Result<BTreeMap<u32, (u32, u64, u64)>, Error> {
        let s = self.s();
        let mut per_extent: BTreeMap<u32, (u32, u64, u64)> = BTreeMap::new();
        for e in live.iter() {
            if e.start < self.info.base || e.start >= self.end() {
                continue;
            }
            if e.end() > self.end() {
                return Err(invariant(
                    sid,
                    format!("allocation {e} crosses the section end"),
                ));
            }
            let (a, z) = (e.start.0 - self.info.base.0, e.end().0 - self.info.base.0);
            for x in a / s..z.div_ceil(s) {
                let lo = a.max(x * s);
                let hi = z.min((x + 1) * s);
                let v = per_extent.entry(x as u32).or_insert((0, 0, 0));
                v.0 += 1;
                v.1 += hi - lo;
                v.2 = v.2.max(hi - x * s);
            }
        }
        Ok(per_extent)
    }

    /// Each extent's state against `per_extent`: a clean extent is in the clean set and
    /// holds nothing live, a resident one counts what it holds and is listed where its fill
    /// says. How many extents are listed.
    fn check_extents(
        &self,
        sid: usize,
        per_extent: &BTreeMap<u32, (u32, u64, u64)>,
    ) -> Result<usize, Error> {
        let sec = self;
        let s = sec.s();
        let bad = |what: String| Err(invariant(sid, what));
        let mut listed = 0usize;
        for (x, st) in sec.states.iter().enumerate() {
            let x = x as u32;
            let r = match st {
                ExtentState::Clean if !sec.clean.contains(&x) || per_extent.contains_key(&x) => {
                    return bad(format!("clean extent {x} not in the clean set or live"));
                }
                ExtentState::Clean => continue,
                ExtentState::Resident(r) => r,
            };
            let Some(&(allocs, blocks, max_end)) = per_extent.get(&x) else {
                return bad(format!("resident extent {x} holds no live allocation"));
            };
            if sec.clean.contains(&x) || allocs != r.live_allocs || blocks != r.live_blocks {
                return bad(format!(
                    "extent {x}: counted {}/{} allocs/blocks, live set {allocs}/{blocks}",
                    r.live_allocs, r.live_blocks
                ));
            }
            if max_end > r.fill.0 || r.fill.0 > s || r.fill.0 == 0 {
                return bad(format!(
                    "extent {x}: fill {} but data up to {max_end}",
                    r.fill.0
                ));
            }
            if r.sealed && r.listed.is_some() {
                return bad(format!("sealed extent {x} is in a reuse list"));
            }
            if let Some(pos) = r.listed {
                listed += 1;
                let chunk = sec.info.geometry.chunk_at(r.fill);
                let in_list = sec
                    .lists
                    .get(&pos)
                    .map_or(0, |l| l.iter().filter(|e| e.extent.0 == x).count());
                if chunk.map(|c| c.pos()) != Some(pos) || in_list != 1 {
                    return bad(format!("extent {x} listed at {pos:?} but not found there"));
                }
            }
        }
        Ok(listed)
    }

    /// The reuse lists: none empty, each in non-increasing unused order, every entry that
    /// of a resident extent listed there with its current unused blocks, and as many
    /// entries and unused blocks as the extents and the running sum say.
    fn check_lists(&self, sid: usize, listed: usize, reuse_min: BlockCount) -> Result<(), Error> {
        let sec = self;
        let s = sec.s();
        let bad = |what: String| Err(invariant(sid, what));
        let mut entries = 0usize;
        let mut unused_sum = 0u64;
        for (pos, list) in &sec.lists {
            if list.is_empty() {
                return bad(format!("empty list kept at {pos:?}"));
            }
            if list.windows(2).any(|w| w[0].unused < w[1].unused) {
                return bad(format!(
                    "list {pos:?} is not in non-increasing unused order"
                ));
            }
            for e in list {
                let ExtentState::Resident(r) = sec.states[e.extent.0 as usize] else {
                    return bad(format!("clean extent {} in list {pos:?}", e.extent.0));
                };
                if r.listed != Some(*pos) || e.unused.0 != s - r.fill.0 || e.unused < reuse_min {
                    return bad(format!(
                        "entry of extent {} in {pos:?} is stale",
                        e.extent.0
                    ));
                }
                entries += 1;
                unused_sum += e.unused.0;
            }
        }
        if entries != listed || unused_sum != sec.listed_unused_blocks {
            return bad(format!(
                "{entries} list entries for {listed} listed extents, unused {unused_sum} vs {}",
                sec.listed_unused_blocks
            ));
        }
        Ok(())
    }
}

/// A broken invariant of section `sid`.
fn invariant(sid: usize, what: String) -> Error {
    Error::invariant(format!("section {sid}: {what}"))
}
