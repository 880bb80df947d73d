//! Deterministic simulation: one seed drives a single-threaded interleaving of foreground
//! requests, loader steps (`load_step`, the loader threads are off), injected EIO/ENOSPC,
//! clean restarts and power cuts on the simulated disk, with a small RAM budget at times.
//! Every run with the same seed makes the same choices, so a failure reproduces with
//! `DHRD_SEED=<seed> cargo test -p dhrd-engine --test sim`. `DHRD_SOAK=1` runs many more.
//!
//! A third of the seeds run on a backing that makes whole aligned blocks durable on return
//! (O_DIRECT with RWF_DSYNC), where the engine sends unaligned writes as whole blocks.
//!
//! Every `CONCURRENT_READER_EVERY`th seed also runs a second thread that reads the current
//! object (`read_at` and `view` at random offsets) while the world resizes, writes, loads,
//! fails and reopens it: RAM accesses racing size changes must never fault (a read past
//! the memfd's size kills the process with SIGBUS). That thread's timing is the
//! scheduler's, so on those seeds the load order may vary between runs (its reads of
//! unloaded chunks ask for them first); the world's requests and checks do not.
//! `races.rs` has the dedicated race tests.

mod common;

use common::{apply, CrashOracle, Model, Op};
use dhrd_engine::{Durability, HybridObject, LoadStep, ObjectConfig, RamBudget};
use dhrd_io::{Fault, FaultKind, SimBacking, SplitMix64};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SEEDS_DEFAULT: u64 = 300;
const SEEDS_SOAK: u64 = 20_000;
const STEPS: usize = 300;
const CONCURRENT_READER_EVERY: u64 = 4;

type Obj = HybridObject<Arc<SimBacking>>;

struct World {
    r: SplitMix64,
    cb: u64,
    durability: Durability,
    budget_chunks: Option<u64>,
    /// The backing makes whole blocks of this size durable on return (O_DIRECT with
    /// RWF_DSYNC), so the engine widens unaligned writes; None: every write needs a sync.
    direct_block_bytes: Option<u64>,
    sim: Arc<SimBacking>,
    obj: Obj,
    /// The current object, for the concurrent reader: it reads only while holding the
    /// lock, so a reopen (which swaps it under the lock) never leaves a clone alive.
    shared: Arc<Mutex<Obj>>,
    /// The object's RAM budget: every reservation must come back when it is dropped.
    budget: Arc<RamBudget>,
    /// What reads must return now.
    model: Model,
    /// Known durable content.
    durable: Model,
    /// Operations that may or may not survive a crash, in order.
    uncertain: Vec<Op>,
    read_only: bool,
}

fn open(
    sim: &Arc<SimBacking>,
    cb: u64,
    durability: Durability,
    budget_chunks: Option<u64>,
) -> (Obj, Arc<RamBudget>) {
    let budget = budget_chunks.map_or_else(RamBudget::unlimited, |n| RamBudget::new(n * cb));
    let cfg = ObjectConfig {
        chunk_bytes: cb,
        durability,
        load_disabled: true,
        budget: Some(budget.clone()),
        name: "sim".into(),
        ..Default::default()
    };
    let obj = HybridObject::open(sim.clone(), cfg).unwrap_or_else(|e| panic!("open: {e}"));
    (obj, budget)
}

impl World {
    fn new(seed: u64) -> Self {
        let mut r = SplitMix64::new(seed);
        let cb = 4096 << r.below(3);
        let size = r.below(12) * cb + r.below(cb);
        let mut init = vec![0u8; size as usize];
        r.fill(&mut init);
        let durability = if r.chance(1, 2) {
            Durability::Sync
        } else {
            Durability::Fsync
        };
        let budget_chunks = r.chance(1, 4).then(|| r.below(6));
        let direct_block_bytes = r.chance(1, 3).then(|| 512 << (2 * r.below(2)));
        let sim = Arc::new(SimBacking::from_bytes(init.clone(), seed));
        sim.set_direct_dsync(direct_block_bytes);
        let (obj, budget) = open(&sim, cb, durability, budget_chunks);
        Self {
            r,
            cb,
            durability,
            budget_chunks,
            direct_block_bytes,
            sim,
            shared: Arc::new(Mutex::new(obj.clone())),
            obj,
            budget,
            model: Model { data: init.clone() },
            durable: Model { data: init },
            uncertain: Vec::new(),
            read_only: false,
        }
    }

    fn random_op(&mut self) -> Op {
        let len = self.model.data.len() as u64;
        let r = &mut self.r;
        match r.below(10) {
            0..=5 => {
                let off = r.below(len + self.cb);
                let mut data = vec![0u8; 1 + r.below(3 * self.cb) as usize];
                r.fill(&mut data);
                Op::Write { offset: off, data }
            }
            6 => {
                let (offset, len) = (r.below(len + 1), 1 + r.below(2 * self.cb));
                if r.chance(1, 2) {
                    Op::Zero { offset, len }
                } else {
                    Op::ZeroAlloc { offset, len }
                }
            }
            7 => Op::SetLen(r.below(len + 3 * self.cb)),
            _ => Op::Flush,
        }
    }

    fn foreground(&mut self, ctx: &str) -> Result<(), String> {
        let op = self.random_op();
        if std::env::var_os("DHRD_TRACE").is_some() {
            eprintln!("{ctx}: {op:?}");
        }
        let r = apply(&self.obj, &op);
        if std::env::var_os("DHRD_TRACE").is_some() {
            eprintln!("{ctx}:   -> {:?}", r.as_ref().map_err(|e| e.to_string()));
        }
        match r {
            Ok(()) if self.read_only && !matches!(op, Op::Flush) => {
                Err(format!("{ctx}: {op:?} succeeded on a read-only object"))
            }
            Ok(()) => {
                self.model.apply(&op);
                match (self.durability, &op) {
                    (Durability::Sync, _) => self.durable.apply(&op),
                    (_, Op::Flush) => {
                        self.durable = self.model.clone();
                        self.uncertain.clear();
                    }
                    _ => self.uncertain.push(op),
                }
                Ok(())
            }
            Err(e) => {
                if self.read_only {
                    return Ok(()); // refused, as it must be
                }
                // The op may have happened in part: accept the device's word, and treat
                // the op as uncertain for crashes from now on.
                let mut got = vec![0u8; self.obj.len() as usize];
                self.obj
                    .read_at(&mut got, 0)
                    .map_err(|e| format!("{ctx}: read after fault: {e}"))?;
                let before = self.model.clone();
                let mut after = before.clone();
                after.apply(&op);
                for (i, b) in got.iter().enumerate() {
                    let old = before.data.get(i).copied().unwrap_or(0);
                    let new = after.data.get(i).copied().unwrap_or(0);
                    if *b != old && *b != new {
                        return Err(format!(
                            "{ctx}: after failed {op:?} ({e}) byte {i} is neither old nor new"
                        ));
                    }
                }
                self.model.data = got;
                self.uncertain.push(op);
                if e.errno() == libc::EIO {
                    if !self.obj.is_read_only() {
                        return Err(format!("{ctx}: EIO without read-only"));
                    }
                    self.read_only = true;
                }
                Ok(())
            }
        }
    }

    fn read(&mut self, ctx: &str) -> Result<(), String> {
        let len = self.model.data.len() as u64;
        let off = self.r.below(len + 2);
        let n = 1 + self.r.below(3 * self.cb) as usize;
        let mut buf = vec![0u8; n];
        let got = self
            .obj
            .read_at(&mut buf, off)
            .map_err(|e| format!("{ctx}: read: {e}"))?;
        let s = (off as usize).min(self.model.data.len());
        let e = (s + n).min(self.model.data.len());
        if got.bytes != e - s || buf[..got.bytes] != self.model.data[s..e] {
            let at = buf
                .iter()
                .zip(&self.model.data[s..e])
                .position(|(a, b)| a != b);
            return Err(format!(
                "{ctx}: read at {off}+{n} ({:?}, {} of {} bytes) differs at +{at:?} ({:?} vs model {:?}); cb {} {}",
                got.served,
                got.bytes,
                e - s,
                at.map(|a| buf[a]),
                at.map(|a| self.model.data[s + a]),
                self.cb,
                self.durability
            ));
        }
        Ok(())
    }

    fn crash(&mut self, seed: u64, ctx: &str) -> Result<(), String> {
        let image = self.sim.crash_image();
        let oracle = CrashOracle::new(&self.durable, &self.uncertain);
        self.sim = Arc::new(SimBacking::from_image(image, seed ^ self.r.next_u64()));
        self.sim.set_direct_dsync(self.direct_block_bytes);
        self.reopen(ctx)?;
        let mut got = vec![0u8; self.obj.len() as usize];
        self.obj
            .read_at(&mut got, 0)
            .map_err(|e| format!("{ctx}: read after crash: {e}"))?;
        oracle
            .check(&got)
            .map_err(|e| format!("{ctx}: after crash: {e}"))?;
        self.model.data = got;
        self.durable = self.model.clone();
        self.uncertain.clear();
        self.read_only = false;
        Ok(())
    }

    /// A clean restart: the object reloads what the device holds (the engine drops the
    /// backing's cache at open), so bytes lost to a failed sync may vanish now; everything
    /// else must be exactly as before.
    /// A one-off fault on one of the next few mutating backing operations.
    fn inject_soon(&mut self, kind: FaultKind) {
        let at = self.sim.stats().ops + self.r.below(4);
        self.sim.inject(Fault {
            at_op: at,
            kind,
            persist: false,
            reads: false,
        });
    }

    /// Replaces the object with a new one over `self.sim`; the old one's budget must be
    /// wholly given back once it is dropped.
    fn reopen(&mut self, ctx: &str) -> Result<(), String> {
        let (obj, budget) = open(&self.sim, self.cb, self.durability, self.budget_chunks);
        let old = std::mem::replace(&mut self.budget, budget);
        *self.shared.lock() = obj.clone();
        self.obj = obj;
        if old.used_bytes() != 0 {
            return Err(format!(
                "{ctx}: {} bytes of RAM budget still reserved after the object was dropped",
                old.used_bytes()
            ));
        }
        Ok(())
    }

    fn restart(&mut self, ctx: &str) -> Result<(), String> {
        let _ = self.obj.close();
        self.reopen(ctx)?;
        self.read_only = false;
        let mut got = vec![0u8; self.obj.len() as usize];
        self.obj
            .read_at(&mut got, 0)
            .map_err(|e| format!("{ctx}: read after restart: {e}"))?;
        let oracle = CrashOracle::new(&self.durable, &self.uncertain);
        oracle
            .check(&got)
            .map_err(|e| format!("{ctx}: after restart: {e}"))?;
        if self.uncertain.is_empty() && got != self.model.data {
            return Err(format!("{ctx}: content changed across a clean restart"));
        }
        self.model.data = got;
        Ok(())
    }
}

/// Reads the world's current object until `stop`: any offset (often past the end), any
/// length; results are not checked (the world's own reads check content), only that no
/// access faults or panics.
fn concurrent_reader(shared: Arc<Mutex<Obj>>, seed: u64, stop: Arc<AtomicBool>) {
    let mut r = SplitMix64::new(seed ^ 0xC0FFEE);
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Acquire) {
        let o = shared.lock();
        let len = o.len();
        let off = r.below(len + len / 4 + 1);
        let n = 1 + r.below(buf.len() as u64) as usize;
        if r.chance(1, 2) {
            if let Ok(got) = o.read_at(&mut buf[..n], off) {
                assert!(got.bytes <= n);
            }
        } else if let Ok(dhrd_engine::View::Ram(v)) = o.view(off, n) {
            assert!(v.len() <= n);
            std::hint::black_box(v.iter().fold(0u8, |a, b| a ^ b));
        }
    }
}

fn simulate(seed: u64) -> Result<(), String> {
    let mut w = World::new(seed);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = seed.is_multiple_of(CONCURRENT_READER_EVERY).then(|| {
        let (shared, stop) = (w.shared.clone(), stop.clone());
        std::thread::spawn(move || concurrent_reader(shared, seed, stop))
    });
    let r = simulate_steps(&mut w, seed);
    stop.store(true, Ordering::Release);
    if let Some(t) = reader {
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
    r
}

fn simulate_steps(w: &mut World, seed: u64) -> Result<(), String> {
    for step in 0..STEPS {
        let ctx = format!("seed {seed} step {step}");
        match w.r.below(100) {
            0..=34 => w.foreground(&ctx)?,
            35..=59 => w.read(&ctx)?,
            60..=84 => {
                let st = w.obj.load_step();
                if std::env::var_os("DHRD_TRACE").is_some() {
                    eprintln!("{ctx}: load {st:?}");
                }
            }
            85..=87 => {
                if std::env::var_os("DHRD_TRACE").is_some() {
                    eprintln!("{ctx}: crash, uncertain {:?}", w.uncertain);
                }
                w.crash(seed, &ctx)?
            }
            88..=89 => w.restart(&ctx)?,
            90..=93 => w.obj.verify_mirror().map_err(|e| format!("{ctx}: {e}"))?,
            94..=96 => {
                if std::env::var_os("DHRD_TRACE").is_some() {
                    eprintln!("{ctx}: enospc soon");
                }
                w.inject_soon(FaultKind::Enospc);
            }
            _ => {
                if w.r.chance(1, 3) {
                    w.inject_soon(FaultKind::Eio);
                }
            }
        }
    }
    // Drain the loader and check the end state.
    for _ in 0..100_000 {
        match w.obj.load_step() {
            LoadStep::Idle | LoadStep::Waiting(_) => break,
            _ => {}
        }
    }
    w.obj
        .verify_mirror()
        .map_err(|e| format!("seed {seed} end: {e}"))?;
    if w.budget_chunks.is_none() && !w.obj.is_fully_loaded() {
        return Err(format!(
            "seed {seed}: not fully loaded after draining: {:?}",
            w.obj.progress()
        ));
    }
    let mut got = vec![0u8; w.obj.len() as usize];
    w.obj.read_at(&mut got, 0).map_err(|e| e.to_string())?;
    if got != w.model.data {
        return Err(format!("seed {seed}: final content differs from the model"));
    }
    Ok(())
}

#[test]
fn deterministic_simulation() -> Result<(), String> {
    if let Some(seed) = std::env::var("DHRD_SEED").ok().and_then(|s| s.parse().ok()) {
        return simulate(seed);
    }
    let n = if std::env::var_os("DHRD_SOAK").is_some() {
        SEEDS_SOAK
    } else {
        SEEDS_DEFAULT
    };
    for seed in 0..n {
        simulate(seed)?;
    }
    Ok(())
}
