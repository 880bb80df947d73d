//! Fault injection at every mutating backing operation: EIO (C4) and ENOSPC (C5).
//! After every request RAM must mirror the backing; after EIO the object is read-only for
//! good with the cause kept; after ENOSPC only that request fails.

mod common;

use common::{apply, workload, Model, Op};
use dhrd_engine::{BackingOp, Durability, Error, HybridObject, LoaderConfig, ObjectConfig, Served};
use dhrd_io::{Fault, FaultKind, SimBacking};
use std::sync::Arc;

const CB: u64 = 4096;
const SIZE: u64 = 6 * CB;
const OPS: usize = 30;

type Obj = HybridObject<Arc<SimBacking>>;

fn open(sim: &Arc<SimBacking>, durability: Durability) -> Obj {
    let cfg = ObjectConfig {
        chunk_bytes: CB,
        durability,
        loader_config: LoaderConfig {
            threads: 1,
            ..Default::default()
        },
        name: "faults".into(),
        ..Default::default()
    };
    HybridObject::open(sim.clone(), cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

fn content(o: &Obj) -> Vec<u8> {
    let mut v = vec![0u8; o.len() as usize];
    let r = o.read_at(&mut v, 0);
    assert!(r.is_ok(), "reads must keep working after a fault: {r:?}");
    v
}

/// Bytes a failed op may have left: old or new at each position.
fn check_uncertain(before: &Model, op: &Op, got: &[u8]) -> Result<(), String> {
    let mut after = before.clone();
    after.apply(op);
    let max = before.data.len().max(after.data.len());
    if got.len() > max {
        return Err(format!(
            "length {} past both {} and {}",
            got.len(),
            before.data.len(),
            after.data.len()
        ));
    }
    for (i, b) in got.iter().enumerate() {
        let old = before.data.get(i).copied().unwrap_or(0);
        let new = after.data.get(i).copied().unwrap_or(0);
        if *b != old && *b != new {
            return Err(format!("byte {i} is {b}: neither old {old} nor new {new}"));
        }
    }
    Ok(())
}

fn run(kind: FaultKind, durability: Durability, seed: u64) -> Result<u64, String> {
    let ops = workload(seed, OPS, SIZE, CB);
    let init: Vec<u8> = (0..SIZE as usize).map(|i| (i % 253) as u8 | 0x40).collect();
    for n in 0u64.. {
        let sim = Arc::new(SimBacking::from_bytes(init.clone(), seed * 7919 + n));
        sim.inject(Fault {
            at_op: n,
            kind,
            persist: false,
            reads: false,
        });
        let o = open(&sim, durability);
        let mut model = Model { data: init.clone() };
        let mut fired = false;
        let mut read_only = false;
        for (i, op) in ops.iter().enumerate() {
            let r = apply(&o, op);
            let ctx =
                format!("{kind:?} {durability} seed {seed} fault at op {n}, request {i} {op:?}");
            match (r, read_only) {
                (Ok(()), false) => model.apply(op),
                (Ok(()), true) if matches!(op, Op::Flush) && durability == Durability::Sync => {}
                (Ok(()), true) => return Err(format!("{ctx}: succeeded on a read-only object")),
                (Err(Error::ReadOnly(cause)), true) => {
                    if o.failure().as_ref() != Some(&cause) {
                        return Err(format!("{ctx}: cause changed"));
                    }
                }
                (Err(e), true) => return Err(format!("{ctx}: read-only object failed with {e}")),
                (Err(e), false) => {
                    fired = true;
                    let got = content(&o);
                    check_uncertain(&model, op, &got).map_err(|m| format!("{ctx}: {m}"))?;
                    model.data = got;
                    match kind {
                        FaultKind::Enospc => {
                            if e.errno() != libc::ENOSPC {
                                return Err(format!("{ctx}: ENOSPC reported as {e}"));
                            }
                            // ENOSPC from a write fails only that request (C5); from a
                            // sync it may have cost accepted bytes, so it is sticky.
                            let from_sync = o.failure().is_some_and(|c| c.op == BackingOp::Sync);
                            if o.is_read_only() != from_sync {
                                return Err(format!(
                                    "{ctx}: read-only {} after ENOSPC",
                                    o.is_read_only()
                                ));
                            }
                            read_only = from_sync;
                        }
                        FaultKind::Eio => {
                            if e.errno() != libc::EIO {
                                return Err(format!("{ctx}: EIO reported as {e}"));
                            }
                            if !o.is_read_only() || o.failure().is_none() {
                                return Err(format!(
                                    "{ctx}: EIO did not make the object read-only"
                                ));
                            }
                            read_only = true;
                        }
                    }
                }
            }
            if std::env::var_os("DHRD_DEBUG").is_some() {
                let p = o.progress();
                eprintln!(
                    "{ctx}: len {} loaded {}/{}",
                    o.len(),
                    p.chunks_loaded,
                    p.chunks_total
                );
            }
            let got = content(&o);
            if got != model.data {
                return Err(format!("{ctx}: content differs from the model"));
            }
            o.verify_mirror()
                .map_err(|m| format!("{ctx}: RAM and backing diverged: {m}"))?;
        }
        if !fired && sim.stats().ops <= n {
            return Ok(n);
        }
        // The loader finishes (failed chunks come back from the backing) and still mirrors.
        if !o.wait_loaded(Some(std::time::Duration::from_secs(10))) {
            return Err(format!(
                "fault at {n}: the load did not complete: {:?}",
                o.progress()
            ));
        }
        o.verify_mirror()
            .map_err(|m| format!("fault at {n}: after load: {m}"))?;
        let _ = o.close();
    }
    unreachable!()
}

#[test]
fn eio_at_every_operation_is_sticky_and_keeps_the_mirror() -> Result<(), String> {
    for seed in 1..=3 {
        assert!(run(FaultKind::Eio, Durability::Sync, seed)? > 20);
        assert!(run(FaultKind::Eio, Durability::Fsync, seed)? > 10);
    }
    Ok(())
}

#[test]
fn enospc_at_every_operation_fails_only_that_request() -> Result<(), String> {
    for seed in 1..=3 {
        assert!(run(FaultKind::Enospc, Durability::Sync, seed)? > 20);
        assert!(run(FaultKind::Enospc, Durability::Fsync, seed)? > 10);
    }
    Ok(())
}

/// A full disk: writes that would grow the backing past its capacity get ENOSPC, RAM is
/// unchanged, the object stays writable, and freeing space (truncate) lets writes succeed.
#[test]
fn full_disk_returns_enospc_and_stays_writable() -> Result<(), String> {
    let sim = Arc::new(SimBacking::from_bytes(vec![7u8; 2 * CB as usize], 1));
    sim.set_capacity(Some(3 * CB));
    let o = open(&sim, Durability::Sync);
    let e = o
        .write_at(&[1u8; 3 * CB as usize], CB)
        .err()
        .ok_or("write past capacity succeeded")?;
    assert_eq!(e.errno(), libc::ENOSPC);
    assert!(!o.is_read_only());
    assert_eq!(o.len(), 2 * CB);
    o.verify_mirror()?;
    o.write_at(&[2u8; 100], 0).map_err(|e| e.to_string())?;
    let mut b = [0u8; 100];
    o.read_at(&mut b, 0).map_err(|e| e.to_string())?;
    assert_eq!(b, [2u8; 100]);
    o.write_at(&[3u8; CB as usize], 2 * CB)
        .map_err(|e| e.to_string())?;
    assert_eq!(o.len(), 3 * CB);
    o.verify_mirror()?;
    Ok(())
}

/// A dead disk (EIO on every write, sync and read from some point on): the failing write
/// gets EIO and the object turns read-only (C4), and reads keep being served from RAM with
/// the last acknowledged bytes, although the backing now fails every read.
#[test]
fn after_a_sticky_failure_reads_come_from_ram_with_the_acknowledged_bytes() -> Result<(), String> {
    for durability in [Durability::Sync, Durability::Fsync] {
        let sim = Arc::new(SimBacking::from_bytes(vec![7u8; 4 * CB as usize], 5));
        let o = open(&sim, durability);
        assert!(o.wait_loaded(Some(std::time::Duration::from_secs(10))));
        o.write_at(&[1u8; 4096], 4096).map_err(|e| e.to_string())?;
        o.flush().map_err(|e| e.to_string())?;
        // One fault for the mutating operations, one for the reads (numbered apart).
        sim.inject(Fault {
            at_op: sim.stats().ops,
            kind: FaultKind::Eio,
            persist: true,
            reads: false,
        });
        sim.inject(Fault {
            at_op: sim.stats().read_ops,
            kind: FaultKind::Eio,
            persist: true,
            reads: true,
        });
        let e = o
            .write_at(&[2u8; 4096], 8192)
            .err()
            .ok_or("a write to a dead disk succeeded")?;
        assert_eq!(e.errno(), libc::EIO, "{durability:?}");
        if durability == Durability::Fsync {
            // fsync mode reports the failure at the flush.
            let _ = o.flush();
        }
        assert!(o.is_read_only(), "{durability:?}: not read-only after EIO");
        let mut b = vec![0u8; 3 * 4096];
        let r = o.read_at(&mut b, 0).map_err(|e| e.to_string())?;
        assert_eq!(r.served, Served::Ram, "{durability:?}");
        assert!(b[..4096].iter().all(|&x| x == 7));
        assert!(
            b[4096..8192].iter().all(|&x| x == 1),
            "acknowledged write lost"
        );
        if durability == Durability::Sync {
            // Never acknowledged and never applied to RAM (C3/C4).
            assert!(b[8192..].iter().all(|&x| x == 7), "failed write visible");
        }
        // With the disk readable again, every chunk but the diverged one mirrors it.
        sim.clear_faults();
        o.verify_mirror()?;
    }
    Ok(())
}
