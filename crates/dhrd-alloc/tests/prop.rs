//! Property tests for the chunk geometry and for all three allocators:
//! - partitions tile their parent, MAP's next chunk starts where the leaf holding `pos`
//!   ends, and `chunk_at` finds it again;
//! - under random allocate/free sequences, live allocations never overlap and stay inside
//!   the device, every internal invariant holds (ReHypar's reuse lists stay ordered by
//!   non-increasing unused space), and the statistics add up;
//! - freed space is reused: after freeing everything, the device is wholly free and the
//!   same requests succeed again with the same extents.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use dhrd_alloc::rehypar::{BlockOffset, ChunkGeometry, MapOutcome};
use dhrd_alloc::{
    AllocOutcome, BlockAddr, BlockCount, BucketAllocator, Extent, ExtentAllocator, FitPolicy,
    FreePolicy, ReHypar, ReHyparConfig, SectionSpec, SpaceAllocator,
};
use proptest::prelude::*;

const DEVICE_BLOCKS: u64 = 4096;

/// Which allocator a case runs, with its parameters.
#[derive(Debug, Clone)]
enum Kind {
    ReHypar {
        extents: Vec<u64>,
        v: u64,
        window: Option<u64>,
        rewind: bool,
    },
    Extent(FitPolicy),
    Bucket(u64),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => (
            prop::sample::subsequence(vec![16u64, 64, 256], 1..=3),
            1u32..=4,
            prop_oneof![Just(None), (1u64..20).prop_map(Some)],
            any::<bool>(),
        )
            .prop_map(|(extents, vs, window, rewind)| Kind::ReHypar {
                extents,
                v: 1 << vs,
                window,
                rewind
            }),
        1 => Just(Kind::Extent(FitPolicy::FirstFit)),
        1 => Just(Kind::Extent(FitPolicy::BestFit)),
        1 => prop_oneof![Just(16u64), Just(64), Just(100)].prop_map(Kind::Bucket),
    ]
}

fn rehypar_config(extents: &[u64], v: u64, window: Option<u64>, rewind: bool) -> ReHyparConfig {
    ReHyparConfig {
        block_bytes: 1024,
        device_blocks: BlockCount(DEVICE_BLOCKS),
        sections: extents
            .iter()
            .map(|&s| SectionSpec {
                extent_bytes: s * 1024,
                weight: 1,
            })
            .collect(),
        // v may not exceed the smallest extent.
        threshold_blocks: BlockCount(v.min(extents.iter().copied().min().unwrap_or(16))),
        reuse_min_blocks: None,
        reuse_window_allocs: window,
        flash_block_bytes: None,
        free_policy: if rewind {
            FreePolicy::RewindToLastLive
        } else {
            FreePolicy::WholeExtent
        },
    }
}

fn build(k: &Kind) -> Box<dyn SpaceAllocator> {
    match k {
        Kind::ReHypar {
            extents,
            v,
            window,
            rewind,
        } => Box::new(ReHypar::new(rehypar_config(extents, *v, *window, *rewind)).unwrap()),
        Kind::Extent(p) => Box::new(ExtentAllocator::new(BlockCount(DEVICE_BLOCKS), *p).unwrap()),
        Kind::Bucket(b) => {
            Box::new(BucketAllocator::new(BlockCount(DEVICE_BLOCKS), BlockCount(*b)).unwrap())
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Allocate; the hint, if any, is a fraction of the device in 1/1000.
    Alloc { len: u64, hint: Option<u64> },
    /// Free the live allocation at this index (modulo their number).
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![4 => 1u64..12, 2 => 12u64..80, 1 => 80u64..700];
    prop_oneof![
        3 => (len, prop::option::of(0u64..1000)).prop_map(|(len, hint)| Op::Alloc { len, hint }),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

fn hint_addr(h: Option<u64>) -> Option<BlockAddr> {
    h.map(|f| BlockAddr(f * DEVICE_BLOCKS / 1000))
}

fn check_disjoint(live: &[Extent]) -> Result<(), TestCaseError> {
    let mut v = live.to_vec();
    v.sort();
    for w in v.windows(2) {
        prop_assert!(!w[0].overlaps(&w[1]), "{} overlaps {}", w[0], w[1]);
    }
    for e in &v {
        prop_assert!(
            e.len.0 > 0 && e.end().0 <= DEVICE_BLOCKS,
            "{e} outside the device"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn partitions_tile_and_map_finds_the_next_chunk(
        n in 2u32..=12,
        t in 1u32..=12,
        pos in any::<u64>(),
    ) {
        prop_assume!(t <= n);
        let g = ChunkGeometry::new(BlockCount(1 << n), BlockCount(1 << t)).unwrap();
        let mut stack = vec![g.partition_extent()];
        while let Some(part) = stack.pop() {
            for w in part.windows(2) {
                prop_assert_eq!(w[0].end(), w[1].start);
            }
            for c in &part {
                if let Some(kids) = g.partition(c) {
                    prop_assert_eq!(kids[0].start, c.start);
                    prop_assert_eq!(kids.last().unwrap().end(), c.end());
                    stack.push(kids);
                }
            }
        }
        let pos = BlockOffset(pos % (1 << n));
        let path = g.descend(pos);
        prop_assert!(path.iter().all(|c| c.contains(pos)));
        let leaf = *path.last().unwrap();
        prop_assert!(!g.is_partitioned(&leaf));
        match g.map(pos).unwrap() {
            MapOutcome::Next { leaf: l, next } => {
                prop_assert_eq!(l, leaf);
                prop_assert_eq!(next.start, leaf.end());
                prop_assert_eq!(g.chunk_at(next.start), Some(next));
            }
            MapOutcome::Full { leaf: l } => prop_assert_eq!(l.end().0, 1 << n),
        }
    }

    #[test]
    fn allocations_never_overlap_and_invariants_hold(
        k in kind(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut a = build(&k);
        let mut live: Vec<Extent> = Vec::new();
        for o in &ops {
            match *o {
                Op::Alloc { len, hint } => match a.place(BlockCount(len), hint_addr(hint)) {
                    AllocOutcome::Placed { extent, .. } => {
                        prop_assert_eq!(extent.len, BlockCount(len));
                        live.push(extent);
                    }
                    AllocOutcome::NoSpace => {}
                    AllocOutcome::Invalid => prop_assert!(false, "valid request {len} refused"),
                },
                Op::Free(i) => {
                    if !live.is_empty() {
                        let e = live.swap_remove(i % live.len());
                        a.free(e).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        prop_assert!(a.free(e).is_err(), "double free of {} accepted", e);
                    }
                }
            }
            check_disjoint(&live)?;
            a.check_invariants().map_err(|e| TestCaseError::fail(format!("{k:?}: {e}")))?;
            let st = a.stats();
            prop_assert_eq!(st.live_blocks.0, live.iter().map(|e| e.len.0).sum::<u64>());
            prop_assert_eq!(st.live_allocs, live.len() as u64);
            prop_assert!(st.live_blocks <= st.held_blocks());
            prop_assert!(st.largest_free_blocks <= st.free_blocks);
            prop_assert!(st.managed_blocks.0 <= DEVICE_BLOCKS);
        }
    }

    #[test]
    fn rehypar_lists_stay_ordered(
        extents in prop::sample::subsequence(vec![16u64, 64, 256], 1..=3),
        vs in 1u32..=4,
        rewind in any::<bool>(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut r = ReHypar::new(rehypar_config(&extents, 1 << vs, None, rewind)).unwrap();
        let mut live: Vec<Extent> = Vec::new();
        for o in &ops {
            match *o {
                Op::Alloc { len, hint } => {
                    live.extend(r.allocate(BlockCount(len), hint_addr(hint)));
                }
                Op::Free(i) => {
                    if !live.is_empty() {
                        let e = live.swap_remove(i % live.len());
                        r.free(e).unwrap();
                    }
                }
            }
            for sid in 0..r.sections().len() {
                for (pos, list) in r.reuse_lists(sid) {
                    prop_assert!(!list.is_empty());
                    for w in list.windows(2) {
                        prop_assert!(w[0].unused >= w[1].unused, "list {pos:?} out of order");
                    }
                    for e in &list {
                        // The listed remainder starts at the list's chunk and runs to the
                        // extent's end, and is at least v/2 long.
                        let info = r.sections()[sid];
                        let s = info.geometry.extent_blocks().0;
                        let off = (e.next_free.0 - info.base.0) % s;
                        let c = info.geometry.chunk_at(BlockOffset(off)).unwrap();
                        prop_assert_eq!((c.level, c.index), (pos.level, pos.index));
                        prop_assert_eq!(e.unused.0, s - off);
                        prop_assert!(e.unused.0 >= (r.config().threshold_blocks.0 / 2).max(1));
                    }
                }
            }
        }
    }

    #[test]
    fn freed_space_is_reused(
        k in kind(),
        lens in prop::collection::vec((1u64..300, prop::option::of(0u64..1000)), 1..80),
    ) {
        let mut a = build(&k);
        let empty = a.stats();
        let run = |a: &mut Box<dyn SpaceAllocator>| -> Vec<Option<Extent>> {
            lens.iter().map(|&(l, h)| a.allocate(BlockCount(l), hint_addr(h))).collect()
        };
        let first = run(&mut a);
        prop_assert!(first.iter().any(|e| e.is_some()), "nothing fitted an empty device");
        for e in first.iter().flatten() {
            a.free(*e).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let st = a.stats();
        prop_assert_eq!(st.free_blocks, st.managed_blocks, "{:?}: not all space came back", k);
        prop_assert_eq!(st.largest_free_blocks, empty.largest_free_blocks);
        let second = run(&mut a);
        prop_assert_eq!(first, second);
        a.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}
