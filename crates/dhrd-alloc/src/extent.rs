//! The plain extent allocator: free space as a set of maximal free extents, coalesced on
//! every free, searched first-fit or best-fit. It is the baseline ReHypar is measured
//! against (SPEC T3): every block a request does not use stays allocatable, so it has no
//! internal fragmentation beyond the caller's rounding to blocks, and all its loss is
//! external (free space cut into pieces too small for a request).
//!
//! Invariants (checked by [`ExtentAllocator::check_invariants`]):
//! - free extents are disjoint, non-empty, and never adjacent (a free merges with both
//!   neighbours), so each is maximal;
//! - `by_len` holds exactly the `(len, start)` pairs of `by_start`;
//! - free extents and live allocations together tile `[0, device_blocks)`.

use crate::space::{
    AllocOutcome, BlockAddr, BlockCount, Extent, FreeOutcome, LiveSet, Placement, SpaceAllocator,
    SpaceStats,
};
use crate::Error;
use std::collections::{BTreeMap, BTreeSet};

/// Largest device the allocator accepts (2^48 blocks): keeps every sum of lengths far from
/// overflow.
pub const DEVICE_BLOCKS_MAX: u64 = 1 << 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitPolicy {
    /// The first free extent that fits, searching upwards from the hint (or block 0) and
    /// wrapping around.
    FirstFit,
    /// The smallest free extent that fits (lowest address among equals).
    BestFit,
}

#[derive(Debug)]
pub struct ExtentAllocator {
    policy: FitPolicy,
    device_blocks: BlockCount,
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    free_blocks: u64,
    live: LiveSet,
}

impl ExtentAllocator {
    pub fn new(device_blocks: BlockCount, policy: FitPolicy) -> Result<Self, Error> {
        if device_blocks.0 == 0 || device_blocks.0 > DEVICE_BLOCKS_MAX {
            return Err(Error::Config(format!(
                "device of {} blocks outside [1, {DEVICE_BLOCKS_MAX}]",
                device_blocks.0
            )));
        }
        let mut a = Self {
            policy,
            device_blocks,
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free_blocks: 0,
            live: LiveSet::default(),
        };
        a.add_free(0, device_blocks.0);
        Ok(a)
    }

    fn add_free(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        self.free_blocks += len;
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        self.free_blocks -= len;
    }

    /// Takes `[at, at + len)` out of the free extent `[start, start + flen)`.
    fn carve(&mut self, start: u64, flen: u64, at: u64, len: u64) {
        debug_assert!(start <= at && at + len <= start + flen);
        self.remove_free(start, flen);
        if at > start {
            self.add_free(start, at - start);
        }
        let end = start + flen;
        if at + len < end {
            self.add_free(at + len, end - at - len);
        }
    }

    /// The free extent holding `addr`, if any.
    fn free_containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.by_start
            .range(..=addr)
            .next_back()
            .filter(|(&s, &l)| addr < s + l)
            .map(|(&s, &l)| (s, l))
    }

    fn first_fit(&self, len: u64, from: u64) -> Option<(u64, u64)> {
        let fits = |(&s, &l): (&u64, &u64)| (l >= len).then_some((s, l));
        self.by_start
            .range(from..)
            .find_map(fits)
            .or_else(|| self.by_start.range(..from).find_map(fits))
    }

    fn best_fit(&self, len: u64) -> Option<(u64, u64)> {
        self.by_len.range((len, 0)..).next().map(|&(l, s)| (s, l))
    }
}

impl SpaceAllocator for ExtentAllocator {
    fn name(&self) -> String {
        match self.policy {
            FitPolicy::FirstFit => "extent first-fit".into(),
            FitPolicy::BestFit => "extent best-fit".into(),
        }
    }

    fn place(&mut self, len: BlockCount, hint: Option<BlockAddr>) -> AllocOutcome {
        let n = len.0;
        if n == 0 || n > self.device_blocks.0 {
            return AllocOutcome::Invalid;
        }
        // A hint inside free space with room after it is taken exactly (a goal block, as
        // ext4 uses one): a file that grows stays contiguous under either policy.
        if let Some(h) = hint {
            if let Some((s, l)) = self.free_containing(h.0) {
                if s + l - h.0 >= n {
                    self.carve(s, l, h.0, n);
                    let extent = Extent::new(h, len);
                    self.live.insert(extent);
                    return AllocOutcome::Placed {
                        extent,
                        how: Placement::AtHint,
                    };
                }
            }
        }
        let found = match self.policy {
            FitPolicy::FirstFit => self.first_fit(n, hint.map_or(0, |h| h.0)),
            FitPolicy::BestFit => self.best_fit(n),
        };
        let Some((s, l)) = found else {
            return AllocOutcome::NoSpace;
        };
        self.carve(s, l, s, n);
        let extent = Extent::new(BlockAddr(s), len);
        self.live.insert(extent);
        AllocOutcome::Placed {
            extent,
            how: Placement::Fresh,
        }
    }

    fn free(&mut self, extent: Extent) -> Result<FreeOutcome, Error> {
        self.live.remove(extent)?;
        let (mut start, mut len) = (extent.start.0, extent.len.0);
        if let Some((&ps, &pl)) = self.by_start.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "free extent overlaps live {extent}");
            if ps + pl == start {
                self.remove_free(ps, pl);
                start = ps;
                len += pl;
            }
        }
        if let Some((&ns, &nl)) = self.by_start.range(start + len..).next() {
            if ns == start + len {
                self.remove_free(ns, nl);
                len += nl;
            }
        }
        self.add_free(start, len);
        Ok(FreeOutcome::Reusable)
    }

    fn stats(&self) -> SpaceStats {
        SpaceStats {
            managed_blocks: self.device_blocks,
            live_blocks: self.live.blocks(),
            live_allocs: self.live.len(),
            free_blocks: BlockCount(self.free_blocks),
            largest_free_blocks: BlockCount(self.by_len.last().map_or(0, |&(l, _)| l)),
        }
    }

    fn check_invariants(&self) -> Result<(), Error> {
        let device = self.device_blocks.0;
        self.live.check(BlockAddr(device))?;
        if self.by_len.len() != self.by_start.len()
            || self
                .by_start
                .iter()
                .any(|(&s, &l)| !self.by_len.contains(&(l, s)))
        {
            return Err(Error::invariant("by_len does not mirror by_start".into()));
        }
        let mut pieces: Vec<(u64, u64, bool)> = self
            .by_start
            .iter()
            .map(|(&s, &l)| (s, l, true))
            .chain(self.live.iter().map(|e| (e.start.0, e.len.0, false)))
            .collect();
        pieces.sort_unstable();
        let (mut at, mut prev_free, mut free_sum) = (0u64, false, 0u64);
        for (s, l, is_free) in pieces {
            if s != at || l == 0 {
                return Err(Error::invariant(format!(
                    "gap or overlap at block {at}: next piece [{s}, {})",
                    s + l
                )));
            }
            if is_free && prev_free {
                return Err(Error::invariant(format!(
                    "free extents meet at {s} uncoalesced"
                )));
            }
            if is_free {
                free_sum += l;
            }
            prev_free = is_free;
            at = s + l;
        }
        if at != device || free_sum != self.free_blocks {
            return Err(Error::invariant(format!(
                "pieces end at {at} of {device}; free {free_sum} vs counted {}",
                self.free_blocks
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn frees_coalesce_with_both_neighbours() {
        let mut a = ExtentAllocator::new(BlockCount(100), FitPolicy::FirstFit).unwrap();
        let x = a.allocate(BlockCount(10), None).unwrap();
        let y = a.allocate(BlockCount(10), None).unwrap();
        let z = a.allocate(BlockCount(10), None).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        // z merged with the free tail [30, 100); x stays a separate hole.
        assert_eq!(a.stats().largest_free_blocks, BlockCount(80));
        assert_eq!(a.stats().free_blocks, BlockCount(90));
        a.free(y).unwrap();
        assert_eq!(a.stats().largest_free_blocks, BlockCount(100));
        a.check_invariants().unwrap();
    }

    #[test]
    fn first_fit_and_best_fit_choose_different_holes() {
        for (policy, want) in [(FitPolicy::FirstFit, 0), (FitPolicy::BestFit, 30)] {
            let mut a = ExtentAllocator::new(BlockCount(100), policy).unwrap();
            let big = a.allocate(BlockCount(20), None).unwrap(); // [0, 20)
            let _k1 = a.allocate(BlockCount(10), None).unwrap(); // [20, 30)
            let small = a.allocate(BlockCount(5), None).unwrap(); // [30, 35)
            let _k2 = a.allocate(BlockCount(65), None).unwrap(); // [35, 100)
            a.free(big).unwrap();
            a.free(small).unwrap();
            let e = a.allocate(BlockCount(5), None).unwrap();
            assert_eq!(e.start, BlockAddr(want), "{policy:?}");
            a.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_free_hint_is_taken_exactly() {
        let mut a = ExtentAllocator::new(BlockCount(100), FitPolicy::BestFit).unwrap();
        let e = a.place(BlockCount(8), Some(BlockAddr(40)));
        assert_eq!(
            e,
            AllocOutcome::Placed {
                extent: Extent::new(BlockAddr(40), BlockCount(8)),
                how: Placement::AtHint
            }
        );
        let f = a.allocate(BlockCount(8), Some(BlockAddr(48))).unwrap();
        assert_eq!(f.start, BlockAddr(48));
        a.check_invariants().unwrap();
    }
}
