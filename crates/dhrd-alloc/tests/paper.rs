//! The ReHypar paper's worked examples as test vectors (SPEC T2): Figure 1 with equation 3,
//! Figure 2 with equation 5, Table 1, and Algorithm 1 transcribed literally.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use dhrd_alloc::rehypar::{BlockOffset, Chunk, ChunkGeometry, ChunkIndex, MapOutcome};
use dhrd_alloc::{
    BlockAddr, BlockCount, Extent, ReHypar, ReHyparConfig, SectionSpec, SpaceAllocator,
};

fn geo(s: u64, v: u64) -> ChunkGeometry {
    ChunkGeometry::new(BlockCount(s), BlockCount(v)).unwrap()
}

fn chunk(level: u32, index: Option<u32>, start: u64, len: u64) -> Chunk {
    Chunk {
        level,
        index: index.map_or(ChunkIndex::Head, ChunkIndex::Pow),
        start: BlockOffset(start),
        len: BlockCount(len),
    }
}

/// (start, len) of each chunk, for compact comparisons.
fn spans(cs: &[Chunk]) -> Vec<(u64, u64)> {
    cs.iter().map(|c| (c.start.0, c.len.0)).collect()
}

#[test]
fn figure1_level0_of_a_256_block_extent() {
    let g = geo(256, 32);
    let l0 = g.partition_extent();
    // (log2 s) + 1 = 9 chunks: the head, then 2^i blocks at 2^i.
    assert_eq!(
        spans(&l0),
        vec![
            (0, 1),
            (1, 1),
            (2, 2),
            (4, 4),
            (8, 8),
            (16, 16),
            (32, 32),
            (64, 64),
            (128, 128)
        ]
    );
    assert_eq!(l0[0].index, ChunkIndex::Head);
    assert_eq!(l0[8].index, ChunkIndex::Pow(7));
    assert!(l0.iter().all(|c| c.level == 0));
}

#[test]
fn figure1_equation3_recursive_partitioning_of_c0_7() {
    let g = geo(256, 32);
    let c0_7 = g.partition_extent()[8];
    assert_eq!(c0_7, chunk(0, Some(7), 128, 128));

    // phi(128, c_0^7) -> level 1: c_1^H .. c_1^6, eight chunks.
    let l1 = g.partition(&c0_7).unwrap();
    assert_eq!(l1.len(), 8);
    assert_eq!(l1[0], chunk(1, None, 128, 1));
    assert_eq!(
        spans(&l1),
        vec![
            (128, 1),
            (129, 1),
            (130, 2),
            (132, 4),
            (136, 8),
            (144, 16),
            (160, 32),
            (192, 64)
        ]
    );

    // c_1^5 and c_1^6 are at least v = 32: divided again at level 2.
    let c1_5 = l1[6];
    let c1_6 = l1[7];
    assert_eq!(
        (c1_5, c1_6),
        (chunk(1, Some(5), 160, 32), chunk(1, Some(6), 192, 64))
    );
    let l2a = g.partition(&c1_5).unwrap(); // phi(160, c_1^5) -> c_2^H .. c_2^4
    assert_eq!(l2a.len(), 6);
    assert_eq!(l2a.last().unwrap(), &chunk(2, Some(4), 176, 16));
    let l2b = g.partition(&c1_6).unwrap(); // phi(192, c_1^6) -> c_2^H .. c_2^5
    assert_eq!(l2b.len(), 7);

    // In level 2, c_2^5 (from c_1^6) is the only chunk of at least v: it starts at the
    // head c_2^H (192) plus 32, and phi(224, c_2^5) -> c_3^H .. c_3^4.
    let big: Vec<Chunk> = l2a
        .iter()
        .chain(&l2b)
        .copied()
        .filter(|c| g.is_partitioned(c))
        .collect();
    assert_eq!(big, vec![chunk(2, Some(5), 224, 32)]);
    let l3 = g.partition(&big[0]).unwrap();
    assert_eq!(l3.len(), 6);
    assert!(l3.iter().all(|c| c.level == 3 && !g.is_partitioned(c)));

    // Everything partitioned under c_0^7 is exactly the list of equation 3.
    let under: Vec<(u32, u64, u64)> = g
        .partitioned_chunks()
        .iter()
        .filter(|c| c.start.0 >= 128)
        .map(|c| (c.level, c.start.0, c.len.0))
        .collect();
    assert_eq!(
        under,
        vec![(0, 128, 128), (1, 160, 32), (1, 192, 64), (2, 224, 32)]
    );
}

#[test]
fn figure2_equation5_a_file_ending_at_block_107() {
    let g = geo(256, 32);
    let pos = BlockOffset(107);
    let path = g.descend(pos);
    // L = 0: split(c_0^H, 107) = c_0^6, 2^6 <= 107 < 2^7.
    // L = 1: phi(64, c_0^6); split(c_0^6, 107) = c_1^5, 2^5 <= 107 - 64 < 2^6.
    // L = 2: phi(96, c_1^5); split(c_1^5, 107) = c_2^3, 2^3 <= 107 - 96 < 2^4.
    assert_eq!(
        path,
        vec![
            chunk(0, Some(6), 64, 64),
            chunk(1, Some(5), 96, 32),
            chunk(2, Some(3), 104, 8)
        ]
    );
    assert_eq!(g.split(&path[0], pos), Some(path[1]));
    assert_eq!(g.split(&path[1], pos), Some(path[2]));
    // c_2^3 is smaller than v: no more partitioning.
    assert_eq!(g.split(&path[2], pos), None);
    // The new file is allocated from c_2^4.
    assert_eq!(
        g.map(pos),
        Some(MapOutcome::Next {
            leaf: chunk(2, Some(3), 104, 8),
            next: chunk(2, Some(4), 112, 16)
        })
    );
    assert_eq!(algorithm1(107, 32), (2, 4));
}

#[test]
fn figure2_through_the_allocator() {
    let mut r = ReHypar::new(ReHyparConfig {
        block_bytes: 1024,
        device_blocks: BlockCount(256 * 4),
        sections: vec![SectionSpec {
            extent_bytes: 256 << 10,
            weight: 1,
        }],
        threshold_blocks: BlockCount(32),
        reuse_min_blocks: None,
        reuse_window_allocs: None,
        flash_block_bytes: None,
        free_policy: Default::default(),
    })
    .unwrap();
    let f = r.allocate(BlockCount(108), None).unwrap();
    assert_eq!(f, Extent::new(BlockAddr(0), BlockCount(108)));
    let lists = r.reuse_lists(0);
    assert_eq!(lists.len(), 1);
    assert_eq!(
        (lists[0].0.level, lists[0].0.index),
        (2, ChunkIndex::Pow(4))
    );
    assert_eq!(lists[0].1[0].next_free, BlockAddr(112));
    assert_eq!(lists[0].1[0].unused, BlockCount(256 - 112));
    let g = r.allocate(BlockCount(20), None).unwrap();
    assert_eq!(g.start, BlockAddr(112));
    r.check_invariants().unwrap();
}

/// Table 1: extent structure for 64 and 256 KiB extents (1 KiB blocks) with v = 8 and 32.
#[test]
fn table1_extent_structures() {
    // (s, v, level-0 chunks, highest level-0 index, levels that partition, first level-0
    // chunk that is partitioned: section 4 "from c_0^3" for v = 8, "from c_0^5" for v = 32)
    let rows = [
        (64, 8, 7, 5, vec![0, 1, 2], 3),
        (64, 32, 7, 5, vec![0], 5),
        (256, 8, 9, 7, vec![0, 1, 2, 3, 4], 3),
        (256, 32, 9, 7, vec![0, 1, 2], 5),
    ];
    for (s, v, n0, top, levels, first) in rows {
        let g = geo(s, v);
        let l0 = g.partition_extent();
        assert_eq!(l0.len(), n0, "s={s} v={v}");
        assert_eq!(l0.last().unwrap().index, ChunkIndex::Pow(top));
        let parts = g.partitioned_chunks();
        let mut seen: Vec<u32> = parts.iter().map(|c| c.level).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, levels, "s={s} v={v}");
        assert_eq!(g.partition_levels() as usize, levels.len());
        let lowest = parts.iter().filter(|c| c.level == 0).map(|c| c.index).min();
        assert_eq!(lowest, Some(ChunkIndex::Pow(first)), "s={s} v={v}");
        // For all c_L^i with i >= log2 v: phi(start(c_L^i), c_L^i) -> c_(L+1)^H .. c_(L+1)^(i-1),
        // and no other chunk is partitioned.
        let lv = v.ilog2();
        let mut stack = l0;
        while let Some(c) = stack.pop() {
            let ChunkIndex::Pow(i) = c.index else {
                assert!(g.partition(&c).is_none());
                continue;
            };
            match g.partition(&c) {
                Some(kids) => {
                    assert!(i >= lv);
                    assert_eq!(kids.len(), i as usize + 1);
                    assert_eq!(kids[0].index, ChunkIndex::Head);
                    assert_eq!(kids.last().unwrap().index, ChunkIndex::Pow(i - 1));
                    assert!(kids.iter().all(|k| k.level == c.level + 1));
                    stack.extend(kids);
                }
                None => assert!(i < lv),
            }
        }
    }
}

/// Algorithm 1's MAP, transcribed line by line. Returns (L, i): the next allocation takes
/// place in chunk i of level L. The paper leaves `pos` on a partition's first block
/// undefined (no k with 2^k <= 0); it is the head chunk there (k = H = -1).
fn algorithm1(pos: u64, v: u64) -> (u32, i64) {
    let log_v = i64::from(v.ilog2());
    let log2 = |x: u64| if x == 0 { -1 } else { i64::from(x.ilog2()) };
    // (1) compute k such that 2^k <= pos < 2^(k+1); L = 0
    let mut k = log2(pos);
    let mut level = 0u32;
    // (2)-(4)
    if k < log_v {
        return (level, k + 1);
    }
    // start(c_L^k) of the chunk holding pos at the current level.
    let mut chunk_start = 1u64 << k;
    // (6) while (k >= log2 v)
    while k >= log_v {
        // (7) L++
        level += 1;
        // (8) find j such that 2^j <= pos - start(c_L^H) < 2^(j+1); c_L^H starts where its
        // parent does.
        let head_start = chunk_start;
        let j = log2(pos - head_start);
        if j < log_v {
            return (level, j + 1); // (9)-(11)
        }
        chunk_start = head_start + (1 << j);
        k = j; // (13)
    }
    unreachable!("the loop returns once a chunk is below v")
}

#[test]
fn map_agrees_with_algorithm1_wherever_its_answer_exists() {
    for (s, v) in [(64, 8), (64, 32), (256, 8), (256, 32), (16, 2), (1024, 4)] {
        let g = geo(s, v);
        for pos in 0..s {
            let (level, i) = algorithm1(pos, v);
            let path = g.descend(BlockOffset(pos));
            let leaf = *path.last().unwrap();
            assert_eq!(leaf.level, level, "s={s} v={v} pos={pos}");
            let parent_shift = match path.len() {
                1 => s.ilog2(),
                n => match path[n - 2].index {
                    ChunkIndex::Pow(p) => p,
                    ChunkIndex::Head => unreachable!("a head is never partitioned"),
                },
            };
            match g.map(BlockOffset(pos)).unwrap() {
                MapOutcome::Next { leaf: l, next } => {
                    assert_eq!(l, leaf);
                    assert_eq!(next.start, leaf.end());
                    if i < i64::from(parent_shift) {
                        // Chunk i of the leaf's own partition exists: MAP's answer as is.
                        assert_eq!((next.level, next.index), (level, ChunkIndex::Pow(i as u32)));
                    } else {
                        // Past the partition's last chunk: the next chunk is shallower.
                        assert!(next.level < level, "s={s} v={v} pos={pos}");
                    }
                }
                MapOutcome::Full { leaf: l } => {
                    assert_eq!(l, leaf);
                    assert_eq!(leaf.end().0, s);
                }
            }
        }
    }
}
