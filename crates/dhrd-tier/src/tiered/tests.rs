use super::*;
use crate::testutil::{check, read_all, same, seeds};
use dhrd_io::{SimBacking, SplitMix64};

const CB: u64 = 4096;
const CHUNKS: u64 = 32;
const SIZE: u64 = CB * CHUNKS;
/// Room for 8 slots: a quarter of the lower tier.
const SSD_BYTES: u64 = 2 * HEADER_BYTES + 8 * (CB + ENTRY_BYTES);
const WAIT: Duration = Duration::from_secs(10);

fn initial() -> Vec<u8> {
    (0..SIZE as usize).map(|i| (i % 251) as u8 | 0x80).collect()
}

/// Mixed reads (hot chunks twice, so they are promoted) and writes.
#[derive(Clone, Debug)]
enum Op {
    Read(u64, u64),
    Write(u64, Vec<u8>),
}

fn workload(seed: u64, n: usize) -> Vec<Op> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            // Half the accesses go to 6 hot chunks.
            let chunk = if r.chance(1, 2) {
                r.below(6)
            } else {
                r.below(CHUNKS)
            };
            let off = chunk * CB + r.below(CB);
            let len = 1 + r.below((SIZE - off).min(CB + 200));
            if r.chance(1, 2) {
                Op::Read(off, len)
            } else {
                Op::Write(
                    off,
                    (0..len)
                        .map(|j| ((i * 5 + j as usize) % 127) as u8 + 1)
                        .collect(),
                )
            }
        })
        .collect()
}

#[test]
fn reads_and_writes_match_the_model_in_both_modes() -> io::Result<()> {
    for mode in [TierMode::WriteBack, TierMode::WriteThrough] {
        let ssd = Arc::new(SimBacking::new(1));
        let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
        let t = Tiered::open(ssd.clone(), lower.clone(), SSD_BYTES, CB, mode, 2)?;
        let mut model = initial();
        for op in workload(5, 400) {
            match op {
                Op::Read(off, len) => {
                    let mut b = vec![0u8; len as usize];
                    t.read_at(&mut b, off)?;
                    same(&b, &model[off as usize..(off + len) as usize], "read");
                }
                Op::Write(off, d) => {
                    assert_eq!(t.write_durably(&d, off)?, Persistence::Durable);
                    model[off as usize..off as usize + d.len()].copy_from_slice(&d);
                }
            }
        }
        same(&read_all(&t, SIZE), &model, "all");
        let st = t.stats();
        assert!(st.promotions > 0 && st.reads_ssd > 0, "{mode}: {st:?}");
        assert!(st.slots_used <= st.slots);
        assert!(t.drain(WAIT), "{st:?}");
        same(&lower.volatile(), &model, "lower tier after write-back");
        if mode == TierMode::WriteThrough {
            assert_eq!(st.slots_dirty, 0);
        } else {
            assert!(st.evictions > 0, "{st:?}");
        }
    }
    Ok(())
}

/// Power cut at every SSD operation in turn (the lower tier at the same moment); reopen
/// and check every acknowledged write; let the write-back finish and check the lower tier.
#[test]
fn crash_enumeration() -> io::Result<()> {
    let mut points = 0;
    let only: Option<(u64, u64)> = std::env::var("DHRD_TIER_CASE").ok().and_then(|v| {
        let (a, b) = v.split_once(',')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    });
    for seed in 0..seeds(30) {
        if only.is_some_and(|(s, _)| s != seed) {
            continue;
        }
        let ops = workload(seed + 20, 60);
        for n in 0u64.. {
            if only.is_some_and(|(_, c)| c != n) {
                if n > 1000 {
                    break;
                }
                continue;
            }
            let ssd = Arc::new(SimBacking::new(seed * 1000 + n));
            let lower = Arc::new(SimBacking::from_bytes(initial(), seed * 1000 + n + 1));
            ssd.crash_at_op(n);
            let Ok(t) = Tiered::open(
                ssd.clone(),
                lower.clone(),
                SSD_BYTES,
                CB,
                TierMode::WriteBack,
                1,
            ) else {
                points += 1;
                continue;
            };
            let mut acked = initial();
            let mut inflight = None;
            for op in &ops {
                match op {
                    Op::Read(off, len) => {
                        let mut b = vec![0u8; *len as usize];
                        if t.read_at(&mut b, *off).is_err() {
                            break;
                        }
                        check(
                            &b,
                            &acked[*off as usize..(off + len) as usize],
                            None,
                            "read before crash",
                        );
                    }
                    Op::Write(off, d) => match t.write_at(d, *off) {
                        Ok(()) => acked[*off as usize..*off as usize + d.len()].copy_from_slice(d),
                        Err(_) => {
                            inflight = Some((*off, d.clone()));
                            break;
                        }
                    },
                }
            }
            let done = ssd.crashed_image().is_none();
            let simg = ssd.crashed_image().unwrap_or_else(|| ssd.crash_image());
            let limg = lower.crash_image();
            drop(t);
            let t = Tiered::open(
                Arc::new(SimBacking::from_image(simg, n + 7)),
                Arc::new(SimBacking::from_image(limg, n + 8)),
                SSD_BYTES,
                CB,
                TierMode::WriteBack,
                1,
            )?;
            let got = read_all(&t, SIZE);
            check(
                &got,
                &acked,
                inflight.as_ref(),
                &format!("seed {seed} crash at {n}"),
            );
            assert!(t.drain(WAIT));
            same(&read_all(&t, SIZE), &got, "after write-back");
            same(
                &t.lower().volatile(),
                &got,
                &format!("seed {seed} crash at {n}: lower tier"),
            );
            points += 1;
            if done {
                break;
            }
        }
    }
    assert!(points > 50, "only {points} crash points");
    Ok(())
}

#[test]
fn a_full_ssd_of_dirty_slots_writes_through() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let ssd = Arc::new(SimBacking::new(1));
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    // The lower tier refuses writes at first: write-back cannot clean any slot.
    lower.inject(Fault {
        at_op: 0,
        kind: FaultKind::Eio,
        persist: true,
        reads: false,
    });
    let t = Tiered::open(ssd, lower.clone(), SSD_BYTES, CB, TierMode::WriteBack, 1)?;
    let mut model = initial();
    for c in 0..8u64 {
        let d = vec![c as u8 + 1; CB as usize];
        t.write_at(&d, c * CB)?;
        model[(c * CB) as usize..((c + 1) * CB) as usize].copy_from_slice(&d);
    }
    assert_eq!(t.stats().slots_dirty, 8);
    // A ninth chunk finds no clean slot: it goes to the (failing) lower tier and fails.
    assert!(t.write_at(&[9; 10], 8 * CB).is_err());
    lower.clear_faults();
    t.write_at(&[9; 10], 8 * CB)?;
    model[(8 * CB) as usize..(8 * CB + 10) as usize].fill(9);
    assert!(t.stats().writes_bypassed >= 1);
    same(&read_all(&t, SIZE), &model, "read back");
    assert!(t.drain(WAIT));
    same(&lower.volatile(), &model, "lower tier");
    Ok(())
}
