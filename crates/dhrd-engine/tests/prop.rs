//! Property tests against a plain in-memory model:
//! - random single-threaded sequences of read/write/zero/set_len/flush/restart with the
//!   loader running at a random rate, chunk size and durability mode;
//! - random multi-threaded sequences: threads on disjoint regions plus a resizer thread
//!   that truncates and extends the tail, all while the loader runs.

mod common;

use common::{apply, Model, Op};
use dhrd_engine::{Durability, HybridObject, LoaderConfig, ObjectConfig};
use dhrd_io::{Durable, SimBacking, SplitMix64};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

type Obj = HybridObject<Arc<SimBacking>>;

#[derive(Debug, Clone)]
enum Step {
    Op(Op),
    Read {
        offset: u64,
        len: usize,
    },
    /// Clean restart: close and reopen on the same backing (the loader starts over).
    Restart,
}

fn step(max: u64) -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..max, 1..3 * 4096usize, any::<u8>()).prop_map(|(offset, len, b)| {
            Step::Op(Op::Write { offset, data: (0..len).map(|i| b.wrapping_add(i as u8) | 1).collect() })
        }),
        4 => (0..max, 1..3 * 4096usize).prop_map(|(offset, len)| Step::Read { offset, len }),
        1 => (0..max, 1..2 * 4096u64).prop_map(|(offset, len)| Step::Op(Op::Zero { offset, len })),
        1 => (0..max, 1..2 * 4096u64).prop_map(|(offset, len)| Step::Op(Op::ZeroAlloc { offset, len })),
        1 => (0..max).prop_map(|l| Step::Op(Op::SetLen(l))),
        1 => Just(Step::Op(Op::Flush)),
        1 => Just(Step::Restart),
    ]
}

fn open(sim: &Arc<SimBacking>, cb: u64, durability: Durability, rate: Option<u64>) -> Obj {
    let cfg = ObjectConfig {
        chunk_bytes: cb,
        durability,
        loader_config: LoaderConfig {
            threads: 2,
            rate_bytes_per_s: rate,
            ..Default::default()
        },
        name: "prop".into(),
        ..Default::default()
    };
    HybridObject::open(sim.clone(), cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_model(
        steps in prop::collection::vec(step(40_000), 1..60),
        cb_shift in 12u32..17,
        fsync in any::<bool>(),
        rate in prop_oneof![Just(None), (50_000u64..5_000_000).prop_map(Some)],
        initial_len in 0u64..50_000,
    ) {
        let cb = 1u64 << cb_shift;
        let durability = if fsync { Durability::Fsync } else { Durability::Sync };
        let init: Vec<u8> = (0..initial_len as usize).map(|i| (i % 241) as u8).collect();
        let sim = Arc::new(SimBacking::from_bytes(init.clone(), 9));
        let mut o = open(&sim, cb, durability, rate);
        let mut model = Model { data: init };
        for s in &steps {
            match s {
                Step::Op(op) => {
                    apply(&o, op).map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))?;
                    model.apply(op);
                    prop_assert_eq!(o.len(), model.data.len() as u64);
                }
                Step::Read { offset, len } => {
                    let mut buf = vec![0xEEu8; *len];
                    let r = o.read_at(&mut buf, *offset).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let start = (*offset as usize).min(model.data.len());
                    let end = (start + len).min(model.data.len());
                    prop_assert_eq!(r.bytes, end - start);
                    prop_assert_eq!(&buf[..r.bytes], &model.data[start..end]);
                }
                Step::Restart => {
                    o.close().map_err(|e| TestCaseError::fail(e.to_string()))?;
                    drop(o);
                    o = open(&sim, cb, durability, rate);
                }
            }
        }
        let mut all = vec![0u8; model.data.len()];
        o.read_at(&mut all, 0).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(all == model.data);
        if rate.is_none() {
            prop_assert!(o.wait_loaded(Some(Duration::from_secs(10))));
        }
        o.verify_mirror().map_err(TestCaseError::fail)?;
        prop_assert_eq!(sim.volatile(), model.data);
    }
}

const REGION: u64 = 3 * 4096 + 123;
const THREADS: u64 = 3;

/// Each worker owns `[i*REGION, (i+1)*REGION)`; the resizer owns everything past
/// `THREADS*REGION` and moves the length around inside its area.
#[test]
fn concurrent_threads_match_their_models() -> Result<(), String> {
    for seed in 0..6u64 {
        let base = THREADS * REGION;
        let sim = Arc::new(SimBacking::from_bytes(vec![0x5A; base as usize], seed));
        let rate = [None, Some(200_000), Some(2_000_000)][seed as usize % 3];
        let durability = if seed % 2 == 0 {
            Durability::Sync
        } else {
            Durability::Fsync
        };
        let o = open(&sim, 4096, durability, rate);
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let o = o.clone();
            handles.push(std::thread::spawn(move || -> Result<(), String> {
                let mut r = SplitMix64::new(seed * 100 + t);
                let start = t * REGION;
                let mut model = vec![0x5Au8; REGION as usize];
                for i in 0..400 {
                    let off = r.below(REGION);
                    let len = 1 + r.below(REGION - off);
                    match r.below(10) {
                        0..=3 => {
                            let mut d = vec![0u8; len as usize];
                            r.fill(&mut d);
                            o.write_at(&d, start + off).map_err(|e| e.to_string())?;
                            model[off as usize..(off + len) as usize].copy_from_slice(&d);
                        }
                        4 => {
                            o.zero_range(start + off, len).map_err(|e| e.to_string())?;
                            model[off as usize..(off + len) as usize].fill(0);
                        }
                        5 => o.flush().map_err(|e| e.to_string())?,
                        _ => {
                            let mut b = vec![0u8; len as usize];
                            o.read_at(&mut b, start + off).map_err(|e| e.to_string())?;
                            if b[..] != model[off as usize..(off + len) as usize] {
                                return Err(format!(
                                    "seed {seed} thread {t} step {i}: read mismatch at {}",
                                    start + off
                                ));
                            }
                        }
                    }
                }
                Ok(())
            }));
        }
        // The resizer: truncates and extends the tail while the workers run.
        let o2 = o.clone();
        let resizer = std::thread::spawn(move || -> Result<Vec<u8>, String> {
            let mut r = SplitMix64::new(seed ^ 0xABCD);
            let mut tail: Vec<u8> = Vec::new();
            for _ in 0..150 {
                if r.chance(1, 2) {
                    let nl = r.below(3 * 4096);
                    o2.set_len(base + nl).map_err(|e| e.to_string())?;
                    tail.resize(nl as usize, 0);
                } else {
                    let off = r.below(2 * 4096);
                    let mut d = vec![0u8; 1 + r.below(6000) as usize];
                    r.fill(&mut d);
                    o2.write_at(&d, base + off).map_err(|e| e.to_string())?;
                    if tail.len() < off as usize + d.len() {
                        tail.resize(off as usize + d.len(), 0);
                    }
                    tail[off as usize..off as usize + d.len()].copy_from_slice(&d);
                }
                let mut b = vec![0u8; tail.len()];
                let n = o2.read_at(&mut b, base).map_err(|e| e.to_string())?.bytes;
                if n != tail.len() || b != tail {
                    return Err(format!(
                        "seed {seed}: tail mismatch (len {n} vs {})",
                        tail.len()
                    ));
                }
            }
            Ok(tail)
        });
        for h in handles {
            h.join().map_err(|_| "worker panicked")??;
        }
        let tail = resizer.join().map_err(|_| "resizer panicked")??;
        assert_eq!(o.len(), base + tail.len() as u64);
        o.flush().map_err(|e| e.to_string())?;
        if rate.is_none() {
            assert!(o.wait_loaded(Some(Duration::from_secs(10))));
        }
        o.verify_mirror()?;
        assert_eq!(sim.len().map_err(|e| e.to_string())?, o.len());
    }
    Ok(())
}
