//! What every fast-tier space allocator shares: block newtypes, the allocated [`Extent`],
//! the outcome enums, the statistics, and the [`SpaceAllocator`] trait the comparison
//! harness drives.
//!
//! Invariants every implementation keeps (the property tests check them through
//! [`SpaceAllocator::check_invariants`] and [`LiveSet`]):
//! - an allocation of `len` blocks is one contiguous [`Extent`] of exactly `len` blocks,
//!   inside `[0, device_blocks)`;
//! - no two live extents overlap;
//! - `free` accepts exactly a live extent as `allocate` returned it, once; anything else is
//!   [`Error::NotAllocated`] and changes nothing;
//! - `free_blocks` counts only blocks a new allocation could be given now, so
//!   `managed - free` is everything the allocator holds back, live or not.

use crate::Error;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Absolute address of a block on the fast device, counted from block 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockAddr(pub u64);

/// A number of blocks (a length, never an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockCount(pub u64);

impl BlockAddr {
    /// The address `n` blocks further on.
    pub fn plus(self, n: BlockCount) -> BlockAddr {
        BlockAddr(self.0 + n.0)
    }

    /// Blocks between `self` and `other`, whichever is larger.
    pub fn distance_blocks(self, other: BlockAddr) -> BlockCount {
        BlockCount(self.0.abs_diff(other.0))
    }
}

impl fmt::Display for BlockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

impl fmt::Display for BlockCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} blocks", self.0)
    }
}

/// A run of blocks handed out by an allocator: `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    pub start: BlockAddr,
    pub len: BlockCount,
}

impl Extent {
    pub fn new(start: BlockAddr, len: BlockCount) -> Self {
        Self { start, len }
    }

    /// First block after the extent.
    pub fn end(&self) -> BlockAddr {
        self.start.plus(self.len)
    }

    pub fn overlaps(&self, other: &Extent) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start.0, self.end().0)
    }
}

/// How an allocation was satisfied (for counters and tests; the extent is what matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Exactly at the hint, continuing what lies before it.
    AtHint,
    /// In the free remainder of a unit (ReHypar extent, bucket) that already holds data.
    Reused,
    /// In free space that held no live data: clean units, or a free extent of the plain
    /// allocator.
    Fresh,
}

/// Result of an allocation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocOutcome {
    Placed {
        extent: Extent,
        how: Placement,
    },
    /// No free space can take the request now; frees may change that.
    NoSpace,
    /// The request can never succeed here: zero blocks, or more than the allocator manages.
    Invalid,
}

impl AllocOutcome {
    pub fn extent(self) -> Option<Extent> {
        match self {
            AllocOutcome::Placed { extent, .. } => Some(extent),
            AllocOutcome::NoSpace | AllocOutcome::Invalid => None,
        }
    }
}

/// Result of freeing a live extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeOutcome {
    /// The blocks can be allocated again at once.
    Reusable,
    /// The blocks stay unusable until everything else in their unit is freed too.
    HeldUntilUnitEmpty,
    /// The free emptied `units` whole units, which are clean (allocatable) again.
    UnitsReclaimed { units: u64 },
}

/// A snapshot of how an allocator's space is used. All counts are in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceStats {
    /// Blocks the allocator hands out from (the device minus alignment slack).
    pub managed_blocks: BlockCount,
    /// Sum of the lengths of live allocations.
    pub live_blocks: BlockCount,
    pub live_allocs: u64,
    /// Blocks a new allocation could be given now.
    pub free_blocks: BlockCount,
    /// The longest single request that would succeed now.
    pub largest_free_blocks: BlockCount,
}

impl SpaceStats {
    /// Blocks taken out of free space: live data plus whatever the allocator holds back
    /// with it (alignment gaps, sealed remainders, freed blocks of partly live units).
    pub fn held_blocks(&self) -> BlockCount {
        BlockCount(self.managed_blocks.0 - self.free_blocks.0)
    }

    /// Held blocks that carry no live allocation.
    pub fn overhead_blocks(&self) -> BlockCount {
        BlockCount(self.held_blocks().0 - self.live_blocks.0)
    }

    /// Live blocks over held blocks (1 when nothing is held).
    pub fn utilisation(&self) -> f64 {
        ratio_or(self.live_blocks.0, self.held_blocks().0, 1.0)
    }

    /// Held-but-not-live blocks over held blocks: space lost inside what is allocated.
    pub fn internal_fragmentation(&self) -> f64 {
        ratio_or(self.overhead_blocks().0, self.held_blocks().0, 0.0)
    }

    /// 1 - largest request that fits / free blocks: free space that exists but cannot
    /// serve one request as large as itself.
    pub fn external_fragmentation(&self) -> f64 {
        1.0 - ratio_or(self.largest_free_blocks.0, self.free_blocks.0, 1.0)
    }
}

fn ratio_or(num: u64, den: u64, empty: f64) -> f64 {
    if den == 0 {
        empty
    } else {
        num as f64 / den as f64
    }
}

/// The interface the comparison harness drives; all three allocators implement it.
pub trait SpaceAllocator {
    /// Short name for reports.
    fn name(&self) -> String;

    /// Allocates `len` contiguous blocks, near `hint` when the policy uses one.
    fn place(&mut self, len: BlockCount, hint: Option<BlockAddr>) -> AllocOutcome;

    /// Frees an extent exactly as `place` returned it.
    fn free(&mut self, extent: Extent) -> Result<FreeOutcome, Error>;

    fn stats(&self) -> SpaceStats;

    /// Checks every internal invariant; meant for tests (cost is linear in the state).
    fn check_invariants(&self) -> Result<(), Error>;

    /// `place` without the outcome detail.
    fn allocate(&mut self, len: BlockCount, hint: Option<BlockAddr>) -> Option<Extent> {
        self.place(len, hint).extent()
    }
}

/// The set of live allocations, kept by every allocator so that `free` can refuse an
/// extent it never handed out (or already took back) instead of corrupting its counters.
/// A file system would find this in its inodes; here it is the allocator's own record.
#[derive(Debug, Default, Clone)]
pub struct LiveSet {
    by_start: BTreeMap<u64, u64>,
    blocks: u64,
}

impl LiveSet {
    pub fn insert(&mut self, e: Extent) {
        let prev = self.by_start.insert(e.start.0, e.len.0);
        assert!(prev.is_none(), "allocator handed out {e} twice");
        self.blocks += e.len.0;
    }

    /// Removes `e` if it is live exactly as given.
    pub fn remove(&mut self, e: Extent) -> Result<(), Error> {
        match self.by_start.get(&e.start.0) {
            Some(&len) if len == e.len.0 => {
                self.by_start.remove(&e.start.0);
                self.blocks -= len;
                Ok(())
            }
            _ => Err(Error::NotAllocated {
                start: e.start,
                len: e.len,
            }),
        }
    }

    pub fn len(&self) -> u64 {
        self.by_start.len() as u64
    }

    /// The live extent with the highest start below `addr`.
    pub fn last_starting_before(&self, addr: BlockAddr) -> Option<Extent> {
        self.by_start
            .range(..addr.0)
            .next_back()
            .map(|(&s, &l)| Extent::new(BlockAddr(s), BlockCount(l)))
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    pub fn blocks(&self) -> BlockCount {
        BlockCount(self.blocks)
    }

    pub fn iter(&self) -> impl Iterator<Item = Extent> + '_ {
        self.by_start
            .iter()
            .map(|(&s, &l)| Extent::new(BlockAddr(s), BlockCount(l)))
    }

    /// Checks that live extents are disjoint and end by `limit`.
    pub fn check(&self, limit: BlockAddr) -> Result<(), Error> {
        let mut prev_end = 0u64;
        let mut sum = 0u64;
        for e in self.iter() {
            if e.start.0 < prev_end {
                return Err(Error::invariant(format!(
                    "live extent {e} overlaps its predecessor"
                )));
            }
            if e.len.0 == 0 || e.end() > limit {
                return Err(Error::invariant(format!(
                    "live extent {e} outside [0, {})",
                    limit.0
                )));
            }
            prev_end = e.end().0;
            sum += e.len.0;
        }
        if sum != self.blocks {
            return Err(Error::invariant(format!(
                "live blocks counted {} but extents sum to {sum}",
                self.blocks
            )));
        }
        Ok(())
    }
}

/// Longest run of consecutive numbers in `set` (clean extents, empty buckets).
pub(crate) fn longest_run(set: &BTreeSet<u32>) -> u64 {
    let (mut best, mut run, mut prev) = (0u64, 0u64, None::<u32>);
    for &x in set {
        run = if prev.is_some_and(|p| p + 1 == x) {
            run + 1
        } else {
            1
        };
        best = best.max(run);
        prev = Some(x);
    }
    best
}

/// Start of the first run of `m` consecutive numbers in `set` that starts at or after
/// `from`, else of the first such run anywhere: a goal-directed search that wraps around.
pub(crate) fn first_run(set: &BTreeSet<u32>, m: u64, from: u32) -> Option<u32> {
    let (mut first, mut run_start, mut run, mut prev) = (None, 0u32, 0u64, None::<u32>);
    for &x in set {
        if prev.is_some_and(|p| p + 1 == x) {
            run += 1;
        } else {
            run_start = x;
            run = 1;
        }
        prev = Some(x);
        if run == m {
            if run_start >= from {
                return Some(run_start);
            }
            first = first.or(Some(run_start));
        }
    }
    first
}
