//! Cache mode against the in-memory model (SPEC M1-M3, M2, M5): a RAM budget much
//! smaller than the data, eviction and read-ahead running at random, reads through
//! `read_at` and through zero-copy views, writes, zeroing, truncation and restarts; and
//! concurrent threads whose views must never show bytes other than their own last writes
//! while other threads' misses evict around them.

mod common;

use common::{apply, Model, Op};
use dhrd_engine::{
    Admission, CacheConfig, CachePolicy, Durability, HybridObject, LoaderConfig, ObjectConfig,
    RamBudget, ReadAhead, View,
};
use dhrd_io::{SimBacking, SplitMix64};
use proptest::prelude::*;
use std::sync::Arc;

type Obj = HybridObject<Arc<SimBacking>>;

#[derive(Debug, Clone)]
enum Step {
    Op(Op),
    Read { offset: u64, len: usize },
    View { offset: u64, len: usize },
    Restart,
}

fn step(max: u64) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..max, 1..3 * 4096usize, any::<u8>()).prop_map(|(offset, len, b)| {
            Step::Op(Op::Write { offset, data: (0..len).map(|i| b.wrapping_add(i as u8) | 1).collect() })
        }),
        5 => (0..max, 1..3 * 4096usize).prop_map(|(offset, len)| Step::Read { offset, len }),
        3 => (0..max, 1..3 * 4096usize).prop_map(|(offset, len)| Step::View { offset, len }),
        1 => (0..max, 1..2 * 4096u64).prop_map(|(offset, len)| Step::Op(Op::Zero { offset, len })),
        1 => (0..max).prop_map(|l| Step::Op(Op::SetLen(l))),
        1 => Just(Step::Op(Op::Flush)),
        1 => Just(Step::Restart),
    ]
}

fn cache_strategy() -> impl Strategy<Value = CacheConfig> {
    (
        prop_oneof![Just(CachePolicy::Clock), Just(CachePolicy::S3Fifo)],
        prop_oneof![Just(Admission::Always), Just(Admission::SecondAccess)],
        prop_oneof![
            Just(ReadAhead::None),
            Just(ReadAhead::Sequential),
            Just(ReadAhead::History)
        ],
        1u64..5,
        any::<bool>(),
    )
        .prop_map(
            |(policy, admission, read_ahead, window, prefill)| CacheConfig {
                policy,
                admission,
                read_ahead,
                read_ahead_window_max_chunks: window,
                prefill,
            },
        )
}

fn open(sim: &Arc<SimBacking>, cb: u64, budget: &Arc<RamBudget>, cache: CacheConfig) -> Obj {
    let cfg = ObjectConfig {
        chunk_bytes: cb,
        durability: Durability::Sync,
        budget: Some(budget.clone()),
        loader_config: LoaderConfig {
            threads: 2,
            ..Default::default()
        },
        cache,
        name: "cache-prop".into(),
        ..Default::default()
    };
    HybridObject::open(sim.clone(), cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

fn check_read(
    o: &Obj,
    model: &Model,
    offset: u64,
    len: usize,
    view: bool,
) -> Result<(), TestCaseError> {
    let start = (offset as usize).min(model.data.len());
    let end = (start + len).min(model.data.len());
    if view {
        match o
            .view(offset, len)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
        {
            View::Ram(v) => prop_assert_eq!(&v[..], &model.data[start..end]),
            View::NotLoaded(_) => {}
            View::Eof => prop_assert_eq!(start, end),
        }
        return Ok(());
    }
    let mut buf = vec![0xEEu8; len];
    let r = o
        .read_at(&mut buf, offset)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(r.bytes, end - start);
    prop_assert_eq!(&buf[..r.bytes], &model.data[start..end]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn cache_mode_matches_the_model(
        steps in prop::collection::vec(step(60_000), 1..80),
        cb_shift in 12u32..15,
        budget_chunks in 1u64..5,
        cache in cache_strategy(),
        initial_len in 0u64..60_000,
    ) {
        let cb = 1u64 << cb_shift;
        let budget = RamBudget::new(budget_chunks * cb);
        let init: Vec<u8> = (0..initial_len as usize).map(|i| (i % 239) as u8 | 1).collect();
        let sim = Arc::new(SimBacking::from_bytes(init.clone(), 11));
        let mut o = open(&sim, cb, &budget, cache);
        let mut model = Model { data: init };
        for s in &steps {
            match s {
                Step::Op(op) => {
                    apply(&o, op).map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))?;
                    model.apply(op);
                }
                Step::Read { offset, len } => check_read(&o, &model, *offset, *len, false)?,
                Step::View { offset, len } => check_read(&o, &model, *offset, *len, true)?,
                Step::Restart => {
                    o.close().map_err(|e| TestCaseError::fail(e.to_string()))?;
                    drop(o);
                    o = open(&sim, cb, &budget, cache);
                }
            }
            prop_assert!(budget.used_bytes() <= budget.limit_bytes() + cb, "budget overrun: {:?}", budget);
        }
        check_read(&o, &model, 0, model.data.len() + 1, false)?;
        o.verify_mirror().map_err(TestCaseError::fail)?;
        prop_assert_eq!(sim.volatile(), model.data);
    }
}

/// Each worker owns a region, writes it, and reads it back through `read_at` and views;
/// the regions together are many times the budget, so every worker's misses evict chunks
/// other workers are viewing. A view must show exactly the owner's last write: never
/// zeros from an eviction or an invalidation under it.
#[test]
fn views_never_see_eviction() -> Result<(), String> {
    const CB: u64 = 4096;
    const REGION: u64 = 16 * CB;
    const THREADS: u64 = 3;
    let seeds = if std::env::var_os("DHRD_SOAK").is_some() {
        100
    } else {
        6
    };
    let mut views = 0;
    for seed in 0..seeds {
        let sim = Arc::new(SimBacking::from_bytes(
            vec![0x5A; (THREADS * REGION) as usize],
            seed,
        ));
        let budget = RamBudget::new(6 * CB);
        let cache = CacheConfig {
            policy: if seed % 2 == 0 {
                CachePolicy::S3Fifo
            } else {
                CachePolicy::Clock
            },
            admission: Admission::Always,
            read_ahead: [ReadAhead::None, ReadAhead::Sequential, ReadAhead::History]
                [seed as usize % 3],
            read_ahead_window_max_chunks: 2,
            prefill: seed % 2 == 1,
        };
        let o = open(&sim, CB, &budget, cache);
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let o = o.clone();
            handles.push(std::thread::spawn(move || -> Result<u64, String> {
                let mut r = SplitMix64::new(seed * 100 + t);
                let start = t * REGION;
                let mut model = vec![0x5Au8; REGION as usize];
                let mut views = 0;
                for i in 0..1500 {
                    if i % 50 == 0 {
                        // The loader runs at a lower priority; let it in so evictions
                        // happen while the workers run.
                        std::thread::sleep(std::time::Duration::from_micros(300));
                    }
                    let off = r.below(REGION);
                    let len = 1 + r.below((REGION - off).min(3 * CB));
                    let want = &model[off as usize..(off + len) as usize];
                    match r.below(10) {
                        0 | 1 => {
                            let mut d = vec![0u8; len as usize];
                            r.fill(&mut d);
                            for b in &mut d {
                                *b |= 1;
                            }
                            o.write_at(&d, start + off).map_err(|e| e.to_string())?;
                            model[off as usize..(off + len) as usize].copy_from_slice(&d);
                        }
                        2..=5 => {
                            if let View::Ram(v) = o
                                .view(start + off, len as usize)
                                .map_err(|e| e.to_string())?
                            {
                                views += 1;
                                // Hold it a while so evictions run under it.
                                std::thread::yield_now();
                                if &v[..] != want {
                                    return Err(format!(
                                        "seed {seed} thread {t} step {i}: view at {} differs",
                                        start + off
                                    ));
                                }
                            }
                        }
                        _ => {
                            let mut b = vec![0u8; len as usize];
                            o.read_at(&mut b, start + off).map_err(|e| e.to_string())?;
                            if b != want {
                                return Err(format!(
                                    "seed {seed} thread {t} step {i}: read at {} differs",
                                    start + off
                                ));
                            }
                        }
                    }
                }
                Ok(views)
            }));
        }
        for h in handles {
            views += h.join().map_err(|_| "worker panicked")??;
        }
        let st = o.stats();
        assert!(
            st.evictions > 0,
            "seed {seed}: nothing was evicted: {st} {:?}",
            o.progress()
        );
        o.verify_mirror()?;
    }
    assert!(views > 0, "no view was served from RAM");
    Ok(())
}

/// A write that fails with ENOSPC after reaching the backing takes its chunk out of
/// Loaded. A zero-copy view taken before must keep showing the bytes it showed (RAM is
/// zeroed only once the view ends); afterwards the chunk is reloaded from the backing.
#[test]
fn an_invalidation_under_a_live_view_keeps_its_bytes() -> Result<(), String> {
    use dhrd_io::{Fault, FaultKind};
    const CB: u64 = 4096;
    let data: Vec<u8> = (0..4 * CB as usize).map(|i| (i % 251) as u8 | 1).collect();
    let sim = Arc::new(SimBacking::from_bytes(data.clone(), 3));
    let budget = RamBudget::new(1 << 30);
    let o = open(&sim, CB, &budget, CacheConfig::default());
    assert!(o.wait_loaded(Some(std::time::Duration::from_secs(10))));
    let view = match o.view(CB, CB as usize).map_err(|e| e.to_string())? {
        View::Ram(v) => v,
        _ => return Err("chunk 1 not in RAM after the load".into()),
    };
    sim.inject(Fault {
        at_op: sim.stats().ops,
        kind: FaultKind::Enospc,
        persist: false,
        reads: false,
    });
    // The requests come from another thread: the thread holding a view must not call
    // into its object (`HybridObject::view`), as a frontend sending the view does not.
    std::thread::scope(|s| {
        s.spawn(|| {
            // The write fails; ENOSPC is not sticky, so the object stays writable and the
            // chunk it touched leaves Loaded.
            let failed = o.write_at(&[0xAA; 100], CB + 10);
            assert!(
                failed.is_err(),
                "the injected ENOSPC did not fail the write"
            );
            assert_eq!(o.stats().chunks_invalidated, 1);
            // Other requests run meanwhile (each ends by trying to zero pending chunks).
            o.write_at(&[7; 10], 3 * CB).map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("the writer thread panicked".into()))
    })?;
    // The chunk may have been reloaded under the view meanwhile (the failed write may have
    // left part of its bytes on the backing): each byte is the old one or the backing's
    // current one, never a zero the invalidation put there.
    let now = sim.volatile();
    for (i, b) in view.iter().enumerate() {
        let at = CB as usize + i;
        assert!(
            *b == data[at] || *b == now[at],
            "view byte {at} is {b:#x}: neither the old {:#x} nor the backing's {:#x}",
            data[at],
            now[at]
        );
        assert_ne!(*b, 0, "view byte {at} was zeroed under the view");
    }
    drop(view);
    o.flush().map_err(|e| e.to_string())?;
    let mut b = vec![0u8; CB as usize];
    o.read_at(&mut b, CB).map_err(|e| e.to_string())?;
    assert_eq!(b, sim.volatile()[CB as usize..2 * CB as usize]);
    o.verify_mirror()
}

/// M4: in cache mode a write to a chunk not in RAM brings it into RAM when the budget has
/// room (the loader copies it, the write included), and never evicts to do so.
#[test]
fn writes_go_to_ram_when_there_is_room() -> Result<(), String> {
    use dhrd_engine::{ChunkIndex, ChunkState};
    const CB: u64 = 4096;
    let sim = Arc::new(SimBacking::from_bytes(vec![1u8; 16 * CB as usize], 5));
    let budget = RamBudget::new(2 * CB);
    let cache = CacheConfig {
        prefill: false,
        ..CacheConfig::default()
    };
    let o = open(&sim, CB, &budget, cache);
    let wait_loaded = |c: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while o.chunk_state(ChunkIndex(c)) != Some(ChunkState::Loaded) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        true
    };
    o.write_at(&[7; 100], 3 * CB + 5)
        .map_err(|e| e.to_string())?;
    assert!(wait_loaded(3), "the written chunk did not come into RAM");
    o.write_at(&[8; 100], 9 * CB).map_err(|e| e.to_string())?;
    assert!(wait_loaded(9));
    // The budget is full now: a third write does not evict.
    o.write_at(&[9; 100], 12 * CB).map_err(|e| e.to_string())?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(o.chunk_state(ChunkIndex(12)), Some(ChunkState::Unloaded));
    assert_eq!(o.stats().evictions, 0);
    let mut b = vec![0u8; 100];
    o.read_at(&mut b, 3 * CB + 5).map_err(|e| e.to_string())?;
    assert_eq!(b, vec![7; 100]);
    o.verify_mirror()
}

/// M3: with second-access admission a one-off miss is read from the backing and loads
/// nothing: the chunk stays Unloaded, RAM takes no byte and the bypass is counted. The
/// chunk's second miss admits it, and the read after that comes from RAM without the
/// backing (the control: the same object does load a chunk it is asked to).
#[test]
fn a_bypassed_miss_is_read_from_the_backing_and_loads_nothing() -> Result<(), String> {
    use dhrd_engine::{ChunkIndex, ChunkState, Served};
    use std::time::{Duration, Instant};
    const CB: u64 = 4096;
    let data: Vec<u8> = (0..16 * CB as usize).map(|i| (i % 253) as u8).collect();
    let sim = Arc::new(SimBacking::from_bytes(data.clone(), 6));
    let budget = RamBudget::new(8 * CB);
    let cache = CacheConfig {
        prefill: false,
        admission: Admission::SecondAccess,
        read_ahead: ReadAhead::None,
        ..CacheConfig::default()
    };
    let o = open(&sim, CB, &budget, cache);
    let mut b = vec![0u8; 100];
    let at = 5 * CB + 7;
    let reads = sim.stats().read_ops;
    let r = o.read_at(&mut b, at).map_err(|e| e.to_string())?;
    assert_eq!(r.served, Served::Backing);
    assert_eq!(b, data[at as usize..at as usize + 100]);
    assert!(
        sim.stats().read_ops > reads,
        "the miss did not read the backing"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(o.chunk_state(ChunkIndex(5)), Some(ChunkState::Unloaded));
    assert_eq!(
        o.progress().chunks_loaded,
        0,
        "a one-off miss loaded a chunk"
    );
    assert_eq!(budget.used_bytes(), 0, "a one-off miss took RAM");
    assert_eq!(o.stats().bypasses, 1);
    // The second miss admits the chunk; once loaded, its reads leave the backing alone.
    o.read_at(&mut b, at).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while o.chunk_state(ChunkIndex(5)) != Some(ChunkState::Loaded) {
        if Instant::now() > deadline {
            return Err("the second miss did not admit its chunk".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let reads = sim.stats().read_ops;
    let r = o.read_at(&mut b, at).map_err(|e| e.to_string())?;
    assert_eq!(r.served, Served::Ram);
    assert_eq!(b, data[at as usize..at as usize + 100]);
    assert_eq!(
        sim.stats().read_ops,
        reads,
        "a read of a Loaded chunk used the backing"
    );
    assert_eq!(o.progress().chunks_loaded, 1);
    o.verify_mirror()
}

/// A zero-copy view held for as long as a stalled consumer likes (an NBD client that
/// stopped reading its socket holds one while its reply is sent) must not stop loading:
/// misses of other chunks still evict and load while it lives, the view keeps showing its
/// bytes, and once it ends the RAM of every evicted chunk is given back (the budget holds
/// for the memory, not only for the accounting). Before, the first loader thread to
/// reclaim waited for the view, every other one queued behind it, and no load ran again
/// until the view ended.
#[test]
fn a_long_lived_view_does_not_stop_loading() -> Result<(), String> {
    use dhrd_engine::{ChunkIndex, ChunkState};
    use std::time::{Duration, Instant};
    const CB: u64 = 64 << 10;
    const CHUNKS: u64 = 12;
    const BUDGET_CHUNKS: u64 = 3;
    let data: Vec<u8> = (0..(CHUNKS * CB) as usize)
        .map(|i| (i % 253) as u8 | 1)
        .collect();
    let sim = Arc::new(SimBacking::from_bytes(data.clone(), 9));
    let budget = RamBudget::new(BUDGET_CHUNKS * CB);
    let cache = CacheConfig {
        policy: CachePolicy::Clock,
        admission: Admission::Always,
        read_ahead: ReadAhead::None,
        prefill: false,
        ..CacheConfig::default()
    };
    let o = open(&sim, CB, &budget, cache);
    // Liveness bound only: every wait below ends as soon as its condition holds.
    let eventually = |what: &str, cond: &dyn Fn() -> bool| -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            if Instant::now() > deadline {
                return Err(format!("{what}: {:?} {}", o.progress(), o.stats()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    };
    let miss = |c: u64| -> Result<(), String> {
        let mut b = vec![0u8; 100];
        o.read_at(&mut b, c * CB + 7).map_err(|e| e.to_string())?;
        assert_eq!(b, data[(c * CB + 7) as usize..(c * CB + 107) as usize]);
        eventually(&format!("chunk {c} was not loaded"), &|| {
            o.chunk_state(ChunkIndex(c)) == Some(ChunkState::Loaded)
        })
    };
    miss(0)?;
    let view = match o.view(0, CB as usize).map_err(|e| e.to_string())? {
        View::Ram(v) => v,
        _ => return Err("chunk 0 not in RAM after its load".into()),
    };
    // Each miss beyond the budget evicts a chunk whose RAM the view may still show. The
    // reads come from another thread: the thread holding a view must not call into its
    // object (`HybridObject::view`), as a frontend sending the view does not.
    std::thread::scope(|s| {
        s.spawn(|| (1..CHUNKS).try_for_each(&miss))
            .join()
            .unwrap_or_else(|_| Err("the reader thread panicked".into()))
    })?;
    assert!(
        o.stats().evictions >= CHUNKS - BUDGET_CHUNKS,
        "{}",
        o.stats()
    );
    assert!(budget.used_bytes() <= budget.limit_bytes());
    assert_eq!(
        &view[..],
        &data[..CB as usize],
        "bytes changed under the view"
    );
    drop(view);
    // Nothing else happens now: the RAM of the evicted chunks is given back anyway.
    eventually(
        "evicted chunks still hold RAM after the view ended",
        &|| o.progress().ram_resident_bytes <= BUDGET_CHUNKS * CB,
    )?;
    o.verify_mirror()
}
