//! The fixed-bucket allocator, after the way bcache manages its cache device: the device
//! is cut into equal buckets; one open bucket takes allocations sequentially, and a bucket
//! is reused only once everything in it has been freed. It never searches for holes, so
//! its cost is constant, and whatever a bucket held that was freed early stays lost until
//! the rest of the bucket is freed (bcache reclaims that space by garbage collection,
//! which moves data; nothing here moves data).
//!
//! Invariants (checked by [`BucketAllocator::check_invariants`]):
//! - a bucket is empty (in the empty set, no live data) or in use (at least one live
//!   allocation touches it, all below its fill offset);
//! - the open bucket, if any, is in use; every other bucket in use is closed and takes no
//!   more data;
//! - a request longer than a bucket takes a run of empty buckets, and the last one's
//!   remainder is closed with it.

use crate::space::{
    first_run, longest_run, AllocOutcome, BlockAddr, BlockCount, Extent, FreeOutcome, LiveSet,
    Placement, SpaceAllocator, SpaceStats,
};
use crate::Error;
use std::collections::BTreeSet;

/// Most buckets per device: bounds the state and keeps bucket numbers in a u32.
pub const BUCKETS_MAX: u64 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Empty,
    InUse {
        fill: u64,
        live_allocs: u32,
        live_blocks: u64,
    },
}

#[derive(Debug)]
pub struct BucketAllocator {
    bucket_blocks: u64,
    states: Vec<Bucket>,
    empty: BTreeSet<u32>,
    open: Option<u32>,
    live: LiveSet,
}

impl BucketAllocator {
    /// Buckets of `bucket_blocks` over the whole buckets of a device of `device_blocks`.
    pub fn new(device_blocks: BlockCount, bucket_blocks: BlockCount) -> Result<Self, Error> {
        let b = bucket_blocks.0;
        let n = device_blocks.0.checked_div(b).unwrap_or(0);
        if n == 0 || n > BUCKETS_MAX {
            return Err(Error::Config(format!(
                "{n} buckets of {b} blocks; 1 to {BUCKETS_MAX} are supported"
            )));
        }
        let n = n as u32;
        Ok(Self {
            bucket_blocks: b,
            states: vec![Bucket::Empty; n as usize],
            empty: (0..n).collect(),
            open: None,
            live: LiveSet::default(),
        })
    }

    fn managed_blocks(&self) -> u64 {
        self.states.len() as u64 * self.bucket_blocks
    }

    fn open_room(&self) -> u64 {
        match self.open.map(|o| self.states[o as usize]) {
            Some(Bucket::InUse { fill, .. }) => self.bucket_blocks - fill,
            _ => 0,
        }
    }

    fn take_empty(&mut self, x: u32, blocks: u64) {
        let was_empty = self.empty.remove(&x);
        debug_assert!(was_empty, "bucket {x} taken while in use");
        self.states[x as usize] = Bucket::InUse {
            fill: blocks,
            live_allocs: 1,
            live_blocks: blocks,
        };
    }
}

impl SpaceAllocator for BucketAllocator {
    fn name(&self) -> String {
        format!("bucket({} blocks)", self.bucket_blocks)
    }

    /// The hint is ignored: a bucket allocator writes where its open bucket is.
    fn place(&mut self, len: BlockCount, _hint: Option<BlockAddr>) -> AllocOutcome {
        let (n, b) = (len.0, self.bucket_blocks);
        if n == 0 || n > self.managed_blocks() {
            return AllocOutcome::Invalid;
        }
        if n <= b {
            if n <= self.open_room() {
                if let Some(o) = self.open {
                    if let Bucket::InUse {
                        fill,
                        live_allocs,
                        live_blocks,
                    } = self.states[o as usize]
                    {
                        self.states[o as usize] = Bucket::InUse {
                            fill: fill + n,
                            live_allocs: live_allocs + 1,
                            live_blocks: live_blocks + n,
                        };
                        let extent = Extent::new(BlockAddr(u64::from(o) * b + fill), len);
                        self.live.insert(extent);
                        return AllocOutcome::Placed {
                            extent,
                            how: Placement::Reused,
                        };
                    }
                }
            }
            // The open bucket is too full: it is closed, its remainder lost until it empties.
            let Some(x) = self.empty.first().copied() else {
                return AllocOutcome::NoSpace;
            };
            self.take_empty(x, n);
            self.open = Some(x);
            let extent = Extent::new(BlockAddr(u64::from(x) * b), len);
            self.live.insert(extent);
            return AllocOutcome::Placed {
                extent,
                how: Placement::Fresh,
            };
        }
        let m = n.div_ceil(b);
        let Some(first) = first_run(&self.empty, m, 0) else {
            return AllocOutcome::NoSpace;
        };
        for k in 0..m {
            self.take_empty(first + k as u32, (n - k * b).min(b));
        }
        let extent = Extent::new(BlockAddr(u64::from(first) * b), len);
        self.live.insert(extent);
        AllocOutcome::Placed {
            extent,
            how: Placement::Fresh,
        }
    }

    fn free(&mut self, extent: Extent) -> Result<FreeOutcome, Error> {
        self.live.remove(extent)?;
        let b = self.bucket_blocks;
        let (a, z) = (extent.start.0, extent.end().0);
        let mut reclaimed = 0u64;
        for x in a / b..z.div_ceil(b) {
            let blocks = z.min((x + 1) * b) - a.max(x * b);
            let x = x as u32;
            let Bucket::InUse {
                fill,
                live_allocs,
                live_blocks,
            } = self.states[x as usize]
            else {
                unreachable!("live extent {extent} covers empty bucket {x}");
            };
            if live_allocs == 1 {
                self.states[x as usize] = Bucket::Empty;
                self.empty.insert(x);
                if self.open == Some(x) {
                    self.open = None;
                }
                reclaimed += 1;
            } else {
                self.states[x as usize] = Bucket::InUse {
                    fill,
                    live_allocs: live_allocs - 1,
                    live_blocks: live_blocks - blocks,
                };
            }
        }
        Ok(if reclaimed > 0 {
            FreeOutcome::UnitsReclaimed { units: reclaimed }
        } else {
            FreeOutcome::HeldUntilUnitEmpty
        })
    }

    fn stats(&self) -> SpaceStats {
        let room = self.open_room();
        SpaceStats {
            managed_blocks: BlockCount(self.managed_blocks()),
            live_blocks: self.live.blocks(),
            live_allocs: self.live.len(),
            free_blocks: BlockCount(self.empty.len() as u64 * self.bucket_blocks + room),
            largest_free_blocks: BlockCount(
                (longest_run(&self.empty) * self.bucket_blocks).max(room),
            ),
        }
    }

    fn check_invariants(&self) -> Result<(), Error> {
        let b = self.bucket_blocks;
        self.live.check(BlockAddr(self.managed_blocks()))?;
        let mut per: Vec<(u32, u64, u64)> = vec![(0, 0, 0); self.states.len()];
        for e in self.live.iter() {
            let (a, z) = (e.start.0, e.end().0);
            for x in a / b..z.div_ceil(b) {
                let p = &mut per[x as usize];
                p.0 += 1;
                p.1 += z.min((x + 1) * b) - a.max(x * b);
                p.2 = p.2.max(z.min((x + 1) * b) - x * b);
            }
        }
        for (x, st) in self.states.iter().enumerate() {
            let ok = match *st {
                Bucket::Empty => self.empty.contains(&(x as u32)) && per[x].0 == 0,
                Bucket::InUse {
                    fill,
                    live_allocs,
                    live_blocks,
                } => {
                    !self.empty.contains(&(x as u32))
                        && live_allocs > 0
                        && per[x].0 == live_allocs
                        && per[x].1 == live_blocks
                        && per[x].2 <= fill
                        && fill <= b
                }
            };
            if !ok {
                return Err(Error::invariant(format!(
                    "bucket {x} state {st:?} vs live {:?}",
                    per[x]
                )));
            }
        }
        if let Some(o) = self.open {
            if self.states[o as usize] == Bucket::Empty {
                return Err(Error::invariant(format!("open bucket {o} is empty")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_sequentially_and_return_only_when_empty() {
        let mut a = BucketAllocator::new(BlockCount(40), BlockCount(10)).unwrap();
        let x = a.allocate(BlockCount(4), None).unwrap();
        let y = a.allocate(BlockCount(4), None).unwrap();
        assert_eq!((x.start, y.start), (BlockAddr(0), BlockAddr(4)));
        // 4 more do not fit the 2 left in bucket 0: bucket 1 opens, bucket 0 is closed.
        let z = a.allocate(BlockCount(4), None).unwrap();
        assert_eq!(z.start, BlockAddr(10));
        assert_eq!(a.free(x), Ok(FreeOutcome::HeldUntilUnitEmpty));
        assert_eq!(a.stats().free_blocks, BlockCount(20 + 6));
        assert_eq!(a.free(y), Ok(FreeOutcome::UnitsReclaimed { units: 1 }));
        assert_eq!(a.stats().free_blocks, BlockCount(30 + 6));
        // Empty buckets are 0, 2 and 3: three buckets' worth is free, but not contiguous.
        assert_eq!(a.place(BlockCount(25), None), AllocOutcome::NoSpace);
        let big = a.allocate(BlockCount(20), None).unwrap();
        assert_eq!(big.start, BlockAddr(20));
        a.check_invariants().unwrap();
    }
}
