//! ReHypar's chunk partitioning of one extent and its chunk mapping (MAP).
//!
//! An extent of `s = 2^n` blocks is partitioned at level 0 into a head chunk `c_0^H` of one
//! block at offset 0 and chunks `c_0^i` of `2^i` blocks at offset `2^i`, `0 <= i < n`
//! (paper Definition 1, equations 1 and 2). A chunk `c_L^i` of at least the threshold `v`
//! blocks is partitioned again in the same way, relative to its own start, into
//! `c_{L+1}^H, c_{L+1}^0, ..., c_{L+1}^{i-1}`; smaller chunks are leaves. Nothing here is
//! stored: every chunk follows from its offset by bit arithmetic, which is what keeps MAP at
//! `O(log s)`.
//!
//! Invariants (property-tested):
//! - the chunks of one partition tile their parent exactly, in address order;
//! - every leaf is shorter than `v` (a head chunk is one block and `v >= 2`);
//! - a chunk starting at offset `o > 0` sits at level `popcount(o) - 1` and has index
//!   `trailing_zeros(o)`: each set bit above the lowest is the start of one ancestor,
//!   which is why [`ChunkGeometry::chunk_at`] needs no search.

use crate::space::BlockCount;
use crate::Error;
use std::fmt;

/// Smallest extent shift: the paper requires `s = 2^n` with `n > 1`.
pub const EXTENT_SHIFT_MIN: u32 = 2;
/// Largest extent shift (16 Mi blocks, 16 GiB at 1 KiB blocks): far above any useful
/// extent, and it keeps every offset and level in small integers.
pub const EXTENT_SHIFT_MAX: u32 = 24;
/// Smallest threshold shift: `v >= 2`, so a one-block head chunk is always a leaf and the
/// recursion ends.
pub const THRESHOLD_SHIFT_MIN: u32 = 1;

/// Offset of a block from the start of its ReHypar extent: the paper's `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BlockOffset(pub u64);

/// A chunk's index within its partition. The paper writes the head as `H = -1`, so it sorts
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChunkIndex {
    Head,
    /// Chunk `c^i` of `2^i` blocks at `2^i` blocks past the partition's start.
    Pow(u32),
}

impl fmt::Display for ChunkIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkIndex::Head => f.write_str("H"),
            ChunkIndex::Pow(i) => write!(f, "{i}"),
        }
    }
}

/// Where a chunk sits in the partition tree: `c_level^index`. The per-level reuse lists are
/// keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkPos {
    pub level: u32,
    pub index: ChunkIndex,
}

/// One chunk of an extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub level: u32,
    pub index: ChunkIndex,
    pub start: BlockOffset,
    pub len: BlockCount,
}

impl Chunk {
    pub fn end(&self) -> BlockOffset {
        BlockOffset(self.start.0 + self.len.0)
    }

    pub fn contains(&self, pos: BlockOffset) -> bool {
        self.start <= pos && pos < self.end()
    }

    pub fn pos(&self) -> ChunkPos {
        ChunkPos {
            level: self.level,
            index: self.index,
        }
    }
}

impl fmt::Display for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "c_{}^{} [{}, {})",
            self.level,
            self.index,
            self.start.0,
            self.end().0
        )
    }
}

/// What MAP (Algorithm 1) found for the last block `pos` of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapOutcome {
    /// The next allocation in the extent starts at chunk `next`, right after `leaf`, the
    /// leaf chunk holding `pos` (whose blocks after `pos` stay unused).
    Next { leaf: Chunk, next: Chunk },
    /// `leaf` is the extent's last chunk: the extent is full.
    Full { leaf: Chunk },
}

/// The partitioning of extents of `2^extent_shift` blocks with threshold
/// `2^threshold_shift` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGeometry {
    extent_shift: u32,
    threshold_shift: u32,
}

impl ChunkGeometry {
    /// Both sizes must be powers of two with `2 <= v <= s` and `4 <= s <= 2^24` blocks.
    pub fn new(extent_blocks: BlockCount, threshold_blocks: BlockCount) -> Result<Self, Error> {
        let (s, v) = (extent_blocks.0, threshold_blocks.0);
        if !s.is_power_of_two() || !v.is_power_of_two() {
            return Err(Error::Config(format!(
                "extent ({s} blocks) and threshold ({v} blocks) must be powers of two"
            )));
        }
        let (n, t) = (s.trailing_zeros(), v.trailing_zeros());
        if !(EXTENT_SHIFT_MIN..=EXTENT_SHIFT_MAX).contains(&n) {
            return Err(Error::Config(format!(
                "extent of {s} blocks outside [{}, {}]",
                1u64 << EXTENT_SHIFT_MIN,
                1u64 << EXTENT_SHIFT_MAX
            )));
        }
        if t < THRESHOLD_SHIFT_MIN || t > n {
            return Err(Error::Config(format!(
                "threshold of {v} blocks outside [{}, {s}]",
                1u64 << THRESHOLD_SHIFT_MIN
            )));
        }
        Ok(Self {
            extent_shift: n,
            threshold_shift: t,
        })
    }

    pub fn extent_blocks(&self) -> BlockCount {
        BlockCount(1 << self.extent_shift)
    }

    pub fn threshold_blocks(&self) -> BlockCount {
        BlockCount(1 << self.threshold_shift)
    }

    /// Number of levels at which partitioning happens, `log2(s / v)` (the paper's count of
    /// levels in its complexity analysis; Table 1's `0 <= L <= log2(s / v) - 1`).
    pub fn partition_levels(&self) -> u32 {
        self.extent_shift - self.threshold_shift
    }

    /// Whether `c` is partitioned further (its length is at least `v`).
    pub fn is_partitioned(&self, c: &Chunk) -> bool {
        c.len.0 >= 1 << self.threshold_shift
    }

    /// `phi(0, E)`: the level-0 chunks of an extent, `c_0^H, c_0^0, ..., c_0^(n-1)`.
    pub fn partition_extent(&self) -> Vec<Chunk> {
        children(0, BlockOffset(0), self.extent_shift)
    }

    /// `phi(start(c), c)`: the chunks of level `L + 1` that `c` is divided into, or `None`
    /// when `c` is shorter than `v` and stays whole.
    pub fn partition(&self, c: &Chunk) -> Option<Vec<Chunk>> {
        let ChunkIndex::Pow(i) = c.index else {
            return None;
        };
        self.is_partitioned(c)
            .then(|| children(c.level + 1, c.start, i))
    }

    /// Every partitioned chunk of an extent, parents before children (depth first, in
    /// address order): the extent structure of Figure 1 and Table 1.
    pub fn partitioned_chunks(&self) -> Vec<Chunk> {
        let mut out = Vec::new();
        let mut stack: Vec<Chunk> = self.partition_extent();
        stack.reverse();
        while let Some(c) = stack.pop() {
            if let Some(kids) = self.partition(&c) {
                out.push(c);
                stack.extend(kids.into_iter().rev());
            }
        }
        out
    }

    /// `split(c, pos)` (equation 4): the chunk of `phi(start(c), c)` that holds `pos`.
    /// `None` when `c` is not partitioned or does not hold `pos`.
    pub fn split(&self, c: &Chunk, pos: BlockOffset) -> Option<Chunk> {
        let ChunkIndex::Pow(_) = c.index else {
            return None;
        };
        (self.is_partitioned(c) && c.contains(pos))
            .then(|| child_containing(c.level + 1, c.start, pos))
    }

    /// The chunks holding `pos` from level 0 down to its leaf (the `split` chain of
    /// equation 5). Empty when `pos` is outside the extent.
    pub fn descend(&self, pos: BlockOffset) -> Vec<Chunk> {
        let mut path = Vec::new();
        if pos.0 >= self.extent_blocks().0 {
            return path;
        }
        let mut c = child_containing(0, BlockOffset(0), pos);
        path.push(c);
        while let Some(child) = self.split(&c, pos) {
            path.push(child);
            c = child;
        }
        path
    }

    /// MAP (Algorithm 1): where the next allocation in an extent starts after one whose
    /// last block is `pos`, or `None` when `pos` is outside the extent.
    ///
    /// Algorithm 1 finds `k` with `2^k <= pos < 2^(k+1)` at level 0 and, while the chunk
    /// `c_L^k` is at least `v` long, goes one level down with `2^j <= pos - start < 2^(j+1)`;
    /// the first chunk shorter than `v` is the leaf and the answer is chunk `j + 1` of the
    /// leaf's level. The paper leaves two cases implicit, taken here as the geometry
    /// dictates: `pos` on a partition's first block (no `k` exists) lies in the head chunk,
    /// so the answer is chunk 0; and when `j + 1` runs past the last chunk of the partition,
    /// the next chunk is the first one after the parent, i.e. whatever chunk starts at the
    /// leaf's end ([`Self::chunk_at`]). Either way the next allocation starts exactly where
    /// the leaf ends: the leaf's blocks after `pos` are never used.
    pub fn map(&self, pos: BlockOffset) -> Option<MapOutcome> {
        if pos.0 >= self.extent_blocks().0 {
            return None;
        }
        // The same walk as `descend`, without building the path (this is the hot path).
        let mut leaf = child_containing(0, BlockOffset(0), pos);
        while let Some(child) = self.split(&leaf, pos) {
            leaf = child;
        }
        let end = leaf.end();
        if end.0 == self.extent_blocks().0 {
            return Some(MapOutcome::Full { leaf });
        }
        match self.chunk_at(end) {
            Some(next) => Some(MapOutcome::Next { leaf, next }),
            // A leaf always ends where a sibling or an ancestor's sibling starts.
            None => unreachable!("leaf {leaf} ends at {} where no chunk starts", end.0),
        }
    }

    /// The shallowest chunk that starts at `start`, or `None` if no chunk does (some
    /// ancestor would have to be a partitioned chunk shorter than `v`) or `start` is
    /// outside the extent. Offset 0 is the level-0 head chunk.
    pub fn chunk_at(&self, start: BlockOffset) -> Option<Chunk> {
        let o = start.0;
        if o >= self.extent_blocks().0 {
            return None;
        }
        if o == 0 {
            return Some(child_containing(0, BlockOffset(0), BlockOffset(0)));
        }
        let index = o.trailing_zeros();
        // Every set bit above the lowest is the start of an ancestor of length 2^bit, which
        // exists only if that ancestor was partitioned, i.e. 2^bit >= v.
        let ancestors = o & !(1u64 << index);
        if ancestors != 0 && ancestors.trailing_zeros() < self.threshold_shift {
            return None;
        }
        Some(Chunk {
            level: o.count_ones() - 1,
            index: ChunkIndex::Pow(index),
            start,
            len: BlockCount(1 << index),
        })
    }
}

/// The partition of a chunk of `2^shift` blocks at `start` into level `level`.
fn children(level: u32, start: BlockOffset, shift: u32) -> Vec<Chunk> {
    let mut out = Vec::with_capacity(shift as usize + 1);
    out.push(Chunk {
        level,
        index: ChunkIndex::Head,
        start,
        len: BlockCount(1),
    });
    out.extend((0..shift).map(|k| Chunk {
        level,
        index: ChunkIndex::Pow(k),
        start: BlockOffset(start.0 + (1 << k)),
        len: BlockCount(1 << k),
    }));
    out
}

/// The chunk of the partition at `start` (into level `level`) that holds `pos >= start`:
/// the head when `pos == start`, else `c^k` with `2^k <= pos - start < 2^(k+1)`.
fn child_containing(level: u32, start: BlockOffset, pos: BlockOffset) -> Chunk {
    let rel = pos.0 - start.0;
    if rel == 0 {
        return Chunk {
            level,
            index: ChunkIndex::Head,
            start,
            len: BlockCount(1),
        };
    }
    let k = rel.ilog2();
    Chunk {
        level,
        index: ChunkIndex::Pow(k),
        start: BlockOffset(start.0 + (1 << k)),
        len: BlockCount(1 << k),
    }
}
