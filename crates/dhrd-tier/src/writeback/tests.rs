use super::*;
use crate::testutil::{check, read_all, same, seeds};
use dhrd_io::{SimBacking, SplitMix64};
use std::time::Instant;

const CB: u64 = 4096;
const CHUNKS: u64 = 8;
const SIZE: u64 = CB * CHUNKS;
const WAIT: Duration = Duration::from_secs(10);

fn slow_id() -> LowerIdentity {
    LowerIdentity::named("the simulated slow device")
}

fn initial() -> Vec<u8> {
    (0..SIZE as usize).map(|i| (i % 251) as u8 | 0x80).collect()
}

/// A write of a distinct non-zero pattern.
fn workload(seed: u64, n: usize) -> Vec<(u64, Vec<u8>)> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let off = r.below(SIZE);
            let len = 1 + r.below((SIZE - off).min(2 * CB + 100));
            let data = (0..len)
                .map(|j| ((i * 7 + j as usize) % 127) as u8 + 1)
                .collect();
            (off, data)
        })
        .collect()
}

#[test]
fn writes_read_back_and_reach_the_slow_device() -> io::Result<()> {
    let fast = Arc::new(SimBacking::new(1));
    let slow = Arc::new(SimBacking::from_bytes(initial(), 2));
    let wb = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 2)?;
    let mut model = initial();
    for (off, data) in workload(3, 50) {
        assert_eq!(wb.write_durably(&data, off)?, Persistence::Durable);
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        same(&read_all(&wb, SIZE), &model, "read back");
    }
    assert!(wb.drain(WAIT), "not drained: {:?}", wb.stats());
    same(&slow.volatile(), &model, "slow device");
    let st = wb.stats();
    assert_eq!(st.chunks_dirty, 0);
    assert!(st.chunks_written_back > 0 && st.fills > 0, "{st:?}");
    // Writes past the end are refused, the size is fixed.
    assert!(wb.write_at(b"x", SIZE).is_err());
    assert!(wb.set_len(SIZE + 1).is_err());
    Ok(())
}

#[test]
fn a_dead_slow_device_delays_write_back_but_loses_nothing() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let fast = Arc::new(SimBacking::new(1));
    let slow = Arc::new(SimBacking::from_bytes(initial(), 2));
    slow.inject(Fault {
        at_op: 0,
        kind: FaultKind::Eio,
        persist: true,
        reads: false,
    });
    let wb = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 1)?;
    let mut model = initial();
    for (off, data) in workload(9, 20) {
        wb.write_at(&data, off)?;
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    assert!(!wb.drain(Duration::from_millis(200)));
    assert!(wb.stats().writeback_failures > 0);
    same(&read_all(&wb, SIZE), &model, "read back");
    slow.clear_faults();
    assert!(wb.drain(WAIT), "{:?}", wb.stats());
    same(&slow.volatile(), &model, "slow device");
    Ok(())
}

#[test]
fn a_header_for_another_backing_is_refused_while_dirty() -> io::Result<()> {
    let fast = Arc::new(SimBacking::new(1));
    let slow = Arc::new(SimBacking::from_bytes(initial(), 2));
    {
        let wb = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 0)?;
        // No thread would write back with 0 threads? One is always started; stop it
        // before it runs by dropping right after the write.
        wb.write_at(&[1; 10], 0)?;
    }
    let img = fast.crash_image();
    let fast2 = Arc::new(SimBacking::from_image(img, 3));
    let other = Arc::new(SimBacking::from_bytes(vec![0; 2 * SIZE as usize], 4));
    match WriteBack::open(fast2.clone(), other, slow_id(), CB, 1) {
        Ok(w) if w.stats().chunks_dirty_at_open == 0 => {} // written back before the drop
        Ok(_) => panic!("opened dirty chunks against another backing"),
        Err(e) => assert!(e.to_string().contains("dirty chunks"), "{e}"),
    }
    Ok(())
}

/// Cuts power to the fast device at every mutating operation in turn (the slow device is
/// cut at the same moment), reopens both and checks every acknowledged write; then lets
/// the write-back finish and checks the slow device.
#[test]
fn crash_enumeration_on_the_fast_device() -> io::Result<()> {
    let mut points = 0;
    for seed in 0..seeds(40) {
        let ops = workload(seed, 24);
        for n in 0u64.. {
            let fast = Arc::new(SimBacking::new(seed * 1000 + n));
            let slow = Arc::new(SimBacking::from_bytes(initial(), seed * 1000 + n + 1));
            fast.crash_at_op(n);
            let Ok(wb) = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 1) else {
                points += 1;
                continue; // crashed while formatting: nothing acknowledged
            };
            let mut acked = initial();
            let mut inflight = None;
            for op in &ops {
                match wb.write_at(&op.1, op.0) {
                    Ok(()) => {
                        acked[op.0 as usize..op.0 as usize + op.1.len()].copy_from_slice(&op.1)
                    }
                    Err(_) => {
                        inflight = Some(op.clone());
                        break;
                    }
                }
            }
            let done = inflight.is_none() && fast.crashed_image().is_none();
            // Power is cut now for both: the fast device at its crash point (or now).
            let fimg = fast.crashed_image().unwrap_or_else(|| fast.crash_image());
            let simg = slow.crash_image();
            drop(wb);
            let wb = WriteBack::open(
                Arc::new(SimBacking::from_image(fimg, n + 7)),
                Arc::new(SimBacking::from_image(simg, n + 8)),
                slow_id(),
                CB,
                1,
            )?;
            let got = read_all(&wb, SIZE);
            check(
                &got,
                &acked,
                inflight.as_ref(),
                &format!("seed {seed} crash at {n}"),
            );
            assert!(wb.drain(WAIT));
            check(&read_all(&wb, SIZE), &got, None, "after write-back");
            same(
                &wb.slow().volatile(),
                &got,
                &format!("seed {seed} crash at {n}: slow device"),
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

/// The slow device dies at each of its operations in turn while writes go on; later the
/// power is cut. Nothing acknowledged is lost: what was not confirmed by the slow device
/// is still dirty on the fast one.
#[test]
fn crash_enumeration_on_the_slow_device() -> io::Result<()> {
    let mut points = 0;
    for seed in 0..seeds(40) {
        let ops = workload(seed + 10, 24);
        for n in 0u64..40 {
            let fast = Arc::new(SimBacking::new(seed * 1000 + n));
            let slow = Arc::new(SimBacking::from_bytes(initial(), seed * 1000 + n + 1));
            slow.crash_at_op(n);
            let wb = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 1)?;
            let mut acked = initial();
            let mut inflight = None;
            let started = Instant::now();
            for (i, op) in ops.iter().enumerate() {
                if wb.write_at(&op.1, op.0).is_err() {
                    // A partial write to a chunk not on the fast device needs the slow
                    // device's bytes: it fails (its earlier chunks may be written).
                    inflight = Some(op.clone());
                    break;
                }
                acked[op.0 as usize..op.0 as usize + op.1.len()].copy_from_slice(&op.1);
                if i % 4 == 0 {
                    // Give the write-back a chance to run between writes.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let _ = wb.drain(Duration::from_millis(20));
            let fimg = fast.crash_image();
            let simg = slow.crashed_image().unwrap_or_else(|| slow.crash_image());
            drop(wb);
            let wb = WriteBack::open(
                Arc::new(SimBacking::from_image(fimg, n + 7)),
                Arc::new(SimBacking::from_image(simg, n + 8)),
                slow_id(),
                CB,
                1,
            )?;
            let got = read_all(&wb, SIZE);
            check(
                &got,
                &acked,
                inflight.as_ref(),
                &format!("seed {seed} slow crash at {n}"),
            );
            assert!(wb.drain(WAIT));
            same(&wb.slow().volatile(), &got, "slow device after write-back");
            points += 1;
            assert!(started.elapsed() < Duration::from_secs(60));
        }
    }
    assert!(points >= 100);
    Ok(())
}

/// EIO or ENOSPC from either device at an operation, once or from then on, while the
/// write-back runs: a request that fails is not acknowledged, a failure of the fast device
/// refuses later writes (a failed sync may have dropped any write made before it, also
/// one another thread's later sync reports as done), and after a power cut of both
/// devices every acknowledged write is there.
#[test]
fn eio_and_enospc_on_either_device() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let mut r = SplitMix64::new(11);
    let mut cases = 0;
    for seed in 0..seeds(12) {
        let ops = workload(seed + 30, 30);
        for on_fast in [true, false] {
            for kind in [FaultKind::Eio, FaultKind::Enospc] {
                for at_op in (0..90).step_by(5) {
                    let persist = r.chance(1, 2);
                    let fast = Arc::new(SimBacking::new(seed * 100 + at_op));
                    let slow = Arc::new(SimBacking::from_bytes(initial(), seed * 100 + at_op + 1));
                    let wb = WriteBack::open(fast.clone(), slow.clone(), slow_id(), CB, 1)?;
                    let fault = Fault {
                        at_op,
                        kind,
                        persist,
                        reads: false,
                    };
                    if on_fast {
                        fast.inject(fault);
                    } else {
                        slow.inject(fault);
                    }
                    let what = format!(
                        "seed {seed} {} {kind:?} at {at_op} persist {persist}",
                        if on_fast { "fast" } else { "slow" }
                    );
                    let mut acked = initial();
                    let mut inflight = None;
                    for (off, data) in &ops {
                        match wb.write_at(data, *off) {
                            Ok(()) => acked[*off as usize..*off as usize + data.len()]
                                .copy_from_slice(data),
                            Err(_) => {
                                inflight = Some((*off, data.clone()));
                                break;
                            }
                        }
                    }
                    if on_fast && inflight.is_some() {
                        fast.clear_faults();
                        assert!(wb.write_at(&[1], 0).is_err(), "{what}: not sticky");
                    }
                    fast.clear_faults();
                    slow.clear_faults();
                    drop(wb);
                    let fimg = fast.crashed_image().unwrap_or_else(|| fast.crash_image());
                    let simg = slow.crashed_image().unwrap_or_else(|| slow.crash_image());
                    let wb = WriteBack::open(
                        Arc::new(SimBacking::from_image(fimg, at_op + 7)),
                        Arc::new(SimBacking::from_image(simg, at_op + 8)),
                        slow_id(),
                        CB,
                        1,
                    )?;
                    let got = read_all(&wb, SIZE);
                    check(&got, &acked, inflight.as_ref(), &what);
                    assert!(wb.drain(WAIT), "{what}: write-back did not finish");
                    same(&wb.slow().volatile(), &got, &format!("{what}: slow device"));
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 100, "only {cases} cases");
    Ok(())
}

#[test]
fn a_fast_device_serves_only_the_slow_device_it_was_made_for() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    use std::sync::atomic::{AtomicU64, Ordering};
    let stamp = Arc::new(AtomicU64::new(1));
    let named = |key: &str, adopt: bool| {
        let s = stamp.clone();
        LowerIdentity {
            key: key.into(),
            stamp: Some(Arc::new(move || Ok(s.load(Ordering::SeqCst)))),
            adopt,
            ..LowerIdentity::named(key)
        }
    };
    let fast = Arc::new(SimBacking::new(1));
    let a = Arc::new(SimBacking::from_bytes(initial(), 2));
    {
        // Over a: chunk 0 written back (clean), then chunk 1 written while a refuses.
        let wb = WriteBack::open(fast.clone(), a.clone(), named("a", false), CB, 1)?;
        wb.write_at(&[1; CB as usize], 0)?;
        assert!(wb.drain(WAIT));
        a.inject(Fault {
            at_op: 0,
            kind: FaultKind::Eio,
            persist: true,
            reads: false,
        });
        wb.write_at(&[2; CB as usize], CB)?;
    }
    let b_bytes = vec![0x11u8; SIZE as usize];
    let b = Arc::new(SimBacking::from_bytes(b_bytes.clone(), 3));
    let e = WriteBack::open(fast.clone(), b.clone(), named("b", false), CB, 1)
        .err()
        .ok_or_else(|| io::Error::other("opened over another slow device"))?;
    assert!(e.to_string().contains("made for a, not for b"), "{e}");
    same(&b.volatile(), &b_bytes, "b after the refusal");
    let mut want = b_bytes.clone();
    want[CB as usize..2 * CB as usize].fill(2);
    {
        let wb = WriteBack::open(fast.clone(), b.clone(), named("b", true), CB, 1)?;
        let s = wb.stats();
        assert_eq!((s.chunks_dropped_at_open, s.chunks_adopted_dirty), (1, 1));
        same(&read_all(&wb, SIZE), &want, "adopted over b");
        assert!(wb.drain(WAIT));
        same(&b.volatile(), &want, "b after the write-back");
    }
    // b changed by another writer after a clean close: its clean copies are dropped.
    b.write_at(&[9; 10], CB)?;
    want[CB as usize..CB as usize + 10].fill(9);
    stamp.store(2, Ordering::SeqCst);
    let wb = WriteBack::open(fast.clone(), b.clone(), named("b", false), CB, 1)?;
    assert!(wb
        .distrusted_at_open()
        .is_some_and(|w| w.contains("changed")));
    same(&read_all(&wb, SIZE), &want, "after the change");
    Ok(())
}

#[test]
fn a_panic_in_the_write_back_fails_the_layer_visibly() -> io::Result<()> {
    use crate::testutil::Panicky;
    let fast = Arc::new(SimBacking::new(1));
    let slow = Arc::new(SimBacking::from_bytes(initial(), 2));
    let panicky = Arc::new(Panicky {
        inner: slow.clone(),
        armed: std::sync::atomic::AtomicBool::new(true),
    });
    let mut want = initial();
    want[..10].fill(5);
    {
        let wb = WriteBack::open(fast.clone(), panicky.clone(), slow_id(), CB, 2)?;
        wb.write_at(&[5; 10], 0)?;
        assert!(!wb.drain(WAIT));
        let why = wb.failure().unwrap_or_default();
        assert!(why.contains("a test's broken invariant"), "{why}");
        assert!(wb.write_at(&[6; 10], CB).is_err());
        same(&read_all(&wb, SIZE), &want, "reads after the panic");
    }
    panicky
        .armed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let wb = WriteBack::open(fast, panicky, slow_id(), CB, 1)?;
    assert_eq!(wb.stats().chunks_dirty_at_open, 1);
    assert!(wb.drain(WAIT));
    same(&slow.volatile(), &want, "slow device after the reopen");
    Ok(())
}
