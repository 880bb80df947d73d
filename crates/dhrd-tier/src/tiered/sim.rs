//! Concurrent simulation of the tier: seeded schedules of readers, writers and the
//! write-back on real threads, with restarts (in either mode), power cuts of both devices
//! and injected EIO, against an oracle of the acknowledged bytes.
//!
//! A run is a sequence of rounds. A round holds one thread at a device operation (a gate of
//! `testutil::gate`): a reader or writer of the round, or a write-back thread. Once it is
//! held, one or two more requests run, aimed mostly at the bytes the held operation
//! touches, and finish (or, after a short wait, are taken to wait for a lock the held
//! thread has); then the power may be cut; then the held thread goes on. So the
//! interleavings a single thread cannot make (a request entirely inside another's window)
//! are made on purpose, every run, and only the order of the steps that no gate holds is
//! left to the scheduler.
//!
//! The oracle: before a round every byte has the value of the last acknowledged write, or
//! one of the values of failed writes since (a failed write may have happened or not).
//! Writers of a round write disjoint bytes. A read may return a byte's value from before the
//! round, or a round writer's value if that write began before the read ended, and must
//! return the writer's value if that write was acknowledged before the read began. After
//! every round the bytes it touched are read back; every few rounds, after a restart or a
//! power cut, and at the end, the whole device. At the end the write-back must drain and
//! the lower tier must then hold exactly what the tier serves.
//!
//! `DHRD_SEED=<n>` runs one seed, `DHRD_SOAK=1` many more; `DHRD_TRACE=1` prints each round.
//! The choices are the seed's; where a request waits for a lock the held thread has, the
//! moment the round gives up waiting for it is the scheduler's, so a failing seed may need a
//! few runs to fail again.

use super::*;
use crate::pairing::LowerIdentity;
use crate::testutil::gate::{GateId, GatedDev, Gates, Held, Kind, Point, Power, When};
use dhrd_io::{Durable, Fault, FaultKind, SimBacking, SplitMix64};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEEDS_DEFAULT: u64 = 24;
const SEEDS_SOAK: u64 = 2_000;
const ROUNDS: usize = 80;
/// How long a round waits for its other requests before it takes them to be waiting for a
/// lock the held thread has, and lets that thread go on. Not a timing assertion: a longer
/// or shorter wait only changes which interleaving the round makes.
const STALL_WAIT: Duration = Duration::from_millis(4);
/// How long a round waits for a write-back thread to reach its gate.
const WRITEBACK_WAIT: Duration = Duration::from_millis(4);
const DRAIN_WAIT: Duration = Duration::from_secs(20);
/// Rounds described in a failure's message.
const TRACE_ROUNDS: usize = 12;

type Dev = Arc<GatedDev<Arc<SimBacking>>>;
type Tier = Tiered<Dev, Dev>;

/// One request of a round.
#[derive(Debug, Clone)]
enum Req {
    Read { off: u64, len: u64 },
    Write { off: u64, data: Vec<u8> },
}

impl Req {
    fn describe(&self) -> String {
        match self {
            Req::Read { off, len } => format!("read {off}+{len}"),
            Req::Write { off, data } => format!("write {off}+{}", data.len()),
        }
    }

    fn range(&self) -> (u64, u64) {
        match self {
            Req::Read { off, len } => (*off, off + len),
            Req::Write { off, data } => (*off, off + data.len() as u64),
        }
    }
}

/// What a request did: its clock stamps when it began and ended, and its outcome (the
/// bytes read, for a read).
struct Done {
    req: Req,
    began: u64,
    ended: u64,
    out: Result<Option<Vec<u8>>, String>,
}

/// The thread a round holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The round's first request.
    First,
    WriteBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Ssd,
    Lower,
}

/// A round's plan.
struct Plan {
    first: Req,
    who: Who,
    /// The device of the gate, and the gate.
    on: On,
    gate: GateId,
    /// Requests started once `who` is held.
    extra: usize,
    /// The chunk the round aims at.
    chunk: u64,
    /// Whether the power is cut while `who` is held.
    cut: bool,
}

struct World {
    seed: u64,
    r: SplitMix64,
    cb: u64,
    size: u64,
    slots: u64,
    threads: usize,
    hot: Vec<u64>,
    mode: TierMode,
    ssd: Arc<SimBacking>,
    lower: Arc<SimBacking>,
    ssd_gates: Arc<Gates>,
    lower_gates: Arc<Gates>,
    power: Arc<Power>,
    tier: Option<Tier>,
    /// A write-back gate armed before the tier was opened: the next round holds it.
    opening_gate: Option<(On, GateId)>,
    /// Acknowledged bytes, and for each byte the values of failed writes since.
    acked: Vec<u8>,
    alts: Vec<Vec<u8>>,
    /// Rounds left of a lower tier that refuses writes.
    outage: u32,
    clock: Arc<AtomicU64>,
    trace: VecDeque<String>,
}

impl World {
    fn new(seed: u64) -> Result<Self, String> {
        let mut r = SplitMix64::new(seed);
        let cb = 2048 << r.below(2);
        let chunks = 6 + r.below(10);
        let size = chunks * cb - r.below(2) * r.below(cb);
        let slots = 1 + r.below(4);
        let threads = 1 + r.below(2) as usize;
        let hot = (0..3).map(|_| r.below(chunks)).collect();
        let mut init = vec![0u8; size as usize];
        r.fill(&mut init);
        let mode = if r.chance(1, 2) {
            TierMode::WriteBack
        } else {
            TierMode::WriteThrough
        };
        let mut w = Self {
            seed,
            cb,
            size,
            slots,
            threads,
            hot,
            mode,
            ssd: Arc::new(SimBacking::new(seed ^ 0x55)),
            lower: Arc::new(SimBacking::from_bytes(init.clone(), seed ^ 0xaa)),
            ssd_gates: Arc::new(Gates::default()),
            lower_gates: Arc::new(Gates::default()),
            power: Arc::new(Power::default()),
            tier: None,
            opening_gate: None,
            acked: init,
            alts: vec![Vec::new(); size as usize],
            outage: 0,
            clock: Arc::new(AtomicU64::new(0)),
            trace: VecDeque::new(),
            r,
        };
        w.note(format!(
            "seed {seed}: {chunks} chunks of {cb} ({size} bytes), {slots} slots, {threads} \
             write-back threads, {mode}"
        ));
        w.open()?;
        Ok(w)
    }

    fn note(&mut self, what: String) {
        if std::env::var_os("DHRD_TRACE").is_some() {
            eprintln!("{what}");
        }
        self.trace.push_back(what);
        if self.trace.len() > TRACE_ROUNDS {
            self.trace.pop_front();
        }
    }

    fn fail(&self, what: String) -> String {
        let trace: Vec<&str> = self.trace.iter().map(|s| s.as_str()).collect();
        format!(
            "seed {}: {what}\nlast steps:\n  {}",
            self.seed,
            trace.join("\n  ")
        )
    }

    fn tier(&self) -> &Tier {
        self.tier
            .as_ref()
            .unwrap_or_else(|| panic!("seed {}: no tier open", self.seed))
    }

    /// Opens the tier over the current devices (new gates and power switch), in a mode
    /// chosen anew; sometimes with a write-back thread held at its first operation of a
    /// kind, so that the first round races requests against the write-back of the slots
    /// found dirty.
    fn open(&mut self) -> Result<(), String> {
        self.mode = if self.r.chance(1, 2) {
            TierMode::WriteBack
        } else {
            TierMode::WriteThrough
        };
        self.ssd_gates = Arc::new(Gates::default());
        self.lower_gates = Arc::new(Gates::default());
        self.power = Arc::new(Power::default());
        self.opening_gate = None;
        if self.r.chance(1, 2) {
            let (on, point) = self.writeback_point();
            let gates = match on {
                On::Ssd => &self.ssd_gates,
                On::Lower => &self.lower_gates,
            };
            self.opening_gate = Some((on, gates.arm(point)));
        }
        let dev = |d: &Arc<SimBacking>, g: &Arc<Gates>| {
            Arc::new(GatedDev::new(d.clone(), g.clone(), self.power.clone()))
        };
        let t = Tiered::open(
            dev(&self.ssd, &self.ssd_gates),
            dev(&self.lower, &self.lower_gates),
            LowerIdentity::named("the simulated lower tier"),
            ssd_bytes_for(self.slots, self.cb),
            self.cb,
            self.mode,
            self.threads,
        )
        .map_err(|e| self.fail(format!("open: {e}")))?;
        let dirty = t.stats().dirty_at_open;
        self.tier = Some(t);
        self.note(format!(
            "open {} with {dirty} dirty, gate {:?}",
            self.mode, self.opening_gate
        ));
        Ok(())
    }

    /// Where a write-back thread is held: mostly right before it writes the lower tier
    /// (after it read the slot) or after it read the lower tier (to complete a slot).
    fn writeback_point(&mut self) -> (On, Point) {
        let (on, kind, when) = match self.r.below(6) {
            0..=2 => (On::Lower, Kind::Write, When::Before),
            3 => (On::Lower, Kind::Read, When::After),
            4 => (On::Lower, Kind::Sync, When::After),
            _ => (On::Ssd, Kind::Sync, When::After),
        };
        (on, Point::new(kind, when).by("dhrd-tier-wb"))
    }

    fn gates(&self, on: On) -> &Arc<Gates> {
        match on {
            On::Ssd => &self.ssd_gates,
            On::Lower => &self.lower_gates,
        }
    }

    /// A chunk to aim at: mostly one of a few hot ones, so that chunks are missed twice,
    /// promoted, evicted and written back while other requests touch them.
    fn chunk(&mut self) -> u64 {
        let chunks = self.size.div_ceil(self.cb);
        if self.r.chance(3, 4) {
            self.hot[self.r.below(self.hot.len() as u64) as usize]
        } else {
            self.r.below(chunks)
        }
    }

    /// A request aimed at chunk `c` (or, when `near` is given, at those bytes), whose
    /// bytes, if it writes, miss `taken`.
    fn request(&mut self, c: u64, near: Option<(u64, u64)>, taken: &[(u64, u64)]) -> Req {
        for _ in 0..16 {
            let (mut off, end_max) = match near {
                Some((a, b)) if self.r.chance(3, 4) => {
                    let a = a.saturating_sub(self.r.below(64));
                    (a + self.r.below((b - a).max(1)), self.size)
                }
                _ => (c * self.cb + self.r.below(self.cb), self.size),
            };
            off = off.min(self.size - 1);
            let len = 1 + self.r.below((self.cb + self.cb / 2).min(end_max - off));
            if self.r.chance(1, 2) {
                return Req::Read { off, len };
            }
            if taken.iter().any(|&(a, b)| off < b && a < off + len) {
                continue;
            }
            let mut data = vec![0u8; len as usize];
            self.r.fill(&mut data);
            return Req::Write { off, data };
        }
        Req::Read { off: 0, len: 1 }
    }

    /// Where the round's first request is held.
    fn request_point(&mut self, req: &Req) -> (On, Point) {
        let (kind, when, on) = match (req, self.r.below(8)) {
            // A read's promotion: after it read the chunk from the lower tier.
            (Req::Read { .. }, 0..=4) => (Kind::Read, When::After, On::Lower),
            (Req::Read { .. }, 5..=6) => (Kind::Write, When::Before, On::Ssd),
            (Req::Read { .. }, _) => (Kind::Sync, When::Before, On::Ssd),
            // A write's edge fill, its bypass of the SSD, its slot write and sync.
            (Req::Write { .. }, 0..=2) => (Kind::Read, When::After, On::Lower),
            (Req::Write { .. }, 3..=4) => (Kind::Write, When::After, On::Lower),
            (Req::Write { .. }, 5) => (Kind::Write, When::Before, On::Ssd),
            (Req::Write { .. }, _) => (Kind::Sync, When::After, On::Ssd),
        };
        let mut p = Point::new(kind, when).by("sim-r0");
        if self.r.chance(1, 4) {
            p = p.skip(1);
        }
        (on, p)
    }

    /// The bytes a read of `off..off + len` may return, byte by byte, given the round's
    /// writes `done`: see the module documentation.
    fn check_read(&self, read: &Done, got: &[u8], done: &[Done]) -> Result<(), String> {
        let (a, _) = read.req.range();
        for (k, g) in got.iter().enumerate() {
            let i = a as usize + k;
            let mut before = true;
            let mut ok = false;
            for w in done {
                let Req::Write { off, data } = &w.req else {
                    continue;
                };
                let (wa, wb) = (*off as usize, *off as usize + data.len());
                if i < wa || i >= wb {
                    continue;
                }
                if w.began < read.ended && data[i - wa] == *g {
                    ok = true;
                }
                if w.out.is_ok() && w.ended < read.began {
                    before = false;
                }
            }
            if before && (self.acked[i] == *g || self.alts[i].contains(g)) {
                ok = true;
            }
            if !ok {
                return Err(format!(
                    "read {:?} (stamps {}..{}): byte {i} is {g:#x}; acknowledged {:#x}, failed \
                     writes {:x?}",
                    read.req.range(),
                    read.began,
                    read.ended,
                    self.acked[i],
                    self.alts[i]
                ));
            }
        }
        Ok(())
    }

    /// Folds the round's writes into the oracle.
    fn apply(&mut self, done: &[Done]) {
        for w in done {
            let Req::Write { off, data } = &w.req else {
                continue;
            };
            for (k, v) in data.iter().enumerate() {
                let i = *off as usize + k;
                if w.out.is_ok() {
                    self.acked[i] = *v;
                    self.alts[i].clear();
                } else if self.acked[i] != *v && !self.alts[i].contains(v) {
                    self.alts[i].push(*v);
                }
            }
        }
    }

    /// Reads `off..off + len` with no request running and checks it against the oracle.
    fn check_range(&self, off: u64, len: u64, what: &str) -> Result<(), String> {
        let mut got = vec![0u8; len as usize];
        self.tier()
            .read_at(&mut got, off)
            .map_err(|e| self.fail(format!("{what}: read {off}+{len}: {e}")))?;
        for (k, g) in got.iter().enumerate() {
            let i = off as usize + k;
            if self.acked[i] != *g && !self.alts[i].contains(g) {
                return Err(self.fail(format!(
                    "{what}: byte {i} is {g:#x}; acknowledged {:#x}, failed writes {:x?}",
                    self.acked[i], self.alts[i]
                )));
            }
        }
        Ok(())
    }

    fn check_all(&self, what: &str) -> Result<(), String> {
        self.check_range(0, self.size, what)
    }

    /// Cuts the power of both devices at one instant, lets every held thread go on (its
    /// operations now fail), drops the tier and opens a new one on what survived.
    fn power_cut_images(&self) -> (dhrd_io::CrashImage, dhrd_io::CrashImage) {
        self.power
            .cut(|| (self.ssd.crash_image(), self.lower.crash_image()))
    }

    fn restart_from(&mut self, images: Option<(dhrd_io::CrashImage, dhrd_io::CrashImage)>) {
        self.ssd_gates.release_all();
        self.lower_gates.release_all();
        self.tier = None;
        // An EIO still due on the SSD was meant for the tier that is gone.
        self.ssd.clear_faults();
        if let Some((s, l)) = images {
            let n = self.r.next_u64();
            self.ssd = Arc::new(SimBacking::from_image(s, n));
            self.lower = Arc::new(SimBacking::from_image(l, n ^ 1));
            self.outage = 0;
        }
    }

    /// A power cut between rounds or a clean restart, then a check of every byte.
    fn reopen(&mut self, cut: bool) -> Result<(), String> {
        let images = cut.then(|| self.power_cut_images());
        self.note(if cut { "power cut" } else { "restart" }.into());
        self.restart_from(images);
        self.open()?;
        self.check_all(if cut {
            "after a power cut"
        } else {
            "after a restart"
        })
    }

    /// Sometimes: a one-off EIO on one of the SSD's next operations (the tier then refuses
    /// writes until it is opened again), or a lower tier that refuses writes for a while.
    fn faults(&mut self) {
        if self.outage > 0 {
            self.outage -= 1;
            if self.outage == 0 {
                self.lower.clear_faults();
                self.note("the lower tier takes writes again".into());
            }
        }
        if self.r.chance(1, 40) {
            let at = self.ssd.stats().ops + self.r.below(6);
            self.ssd.inject(Fault {
                at_op: at,
                kind: FaultKind::Eio,
                persist: false,
                reads: false,
            });
            self.note(format!("EIO at SSD operation {at}"));
        } else if self.outage == 0 && self.r.chance(1, 30) {
            self.outage = 1 + self.r.below(8) as u32;
            self.lower.inject(Fault {
                at_op: 0,
                kind: FaultKind::Eio,
                persist: true,
                reads: false,
            });
            self.note(format!(
                "the lower tier refuses writes for {} rounds",
                self.outage
            ));
        }
    }

    fn round(&mut self, n: usize) -> Result<(), String> {
        self.faults();
        if self.tier().failure().is_some() {
            // Nothing is acknowledged any more: a failed SSD comes back by a restart.
            return self.reopen(true);
        }
        match self.r.below(40) {
            0 => return self.reopen(true),
            1 => return self.reopen(false),
            _ => {}
        }
        let c = self.chunk();
        let first = self.request(c, None, &[]);
        let (who, on, point) = match self.opening_gate {
            Some((on, _)) => (Who::WriteBack, on, None),
            None if self.r.chance(1, 4) => {
                let (on, p) = self.writeback_point();
                (Who::WriteBack, on, Some(p))
            }
            None => {
                let (on, p) = self.request_point(&first);
                (Who::First, on, Some(p))
            }
        };
        let gate = match (self.opening_gate.take(), point) {
            (Some((_, g)), _) => g,
            (None, Some(p)) => self.gates(on).arm(p),
            (None, None) => unreachable!("a round holds a thread"),
        };
        self.note(format!(
            "round {n} ({}): {} first, holding {who:?} on the {on:?} device, chunk {c}",
            self.mode,
            first.describe()
        ));
        let plan = Plan {
            first,
            who,
            on,
            gate,
            extra: 1 + self.r.below(2) as usize,
            chunk: c,
            cut: self.r.chance(1, 25),
        };
        let (done, held, images) = self.run_round(plan);
        let held = match held {
            Some(h) => format!("{} held at {:?} {}+{}", h.thread, h.kind, h.offset, h.len),
            None => "nothing held".into(),
        };
        self.note(format!(
            "  {held}; {}",
            done.iter()
                .map(|d| format!(
                    "{} {}..{} {}",
                    d.req.describe(),
                    d.began,
                    d.ended,
                    if d.out.is_ok() { "ok" } else { "failed" }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for d in &done {
            if let (Req::Read { .. }, Ok(Some(got))) = (&d.req, &d.out) {
                self.check_read(d, got, &done).map_err(|e| self.fail(e))?;
            }
        }
        self.apply(&done);
        if let Some(images) = images {
            self.note("power cut during the round".into());
            self.restart_from(Some(images));
            self.open()?;
            return self.check_all("after a power cut during a round");
        }
        for d in &done {
            let (a, b) = d.req.range();
            let (ca, cb) = (a / self.cb * self.cb, b.div_ceil(self.cb) * self.cb);
            self.check_range(ca, cb.min(self.size) - ca, &format!("after round {n}"))?;
        }
        if n % 10 == 9 {
            self.check_all(&format!("after round {n}"))?;
        }
        Ok(())
    }

    /// Runs a round's requests on threads: holds the planned thread at its gate, runs more
    /// requests aimed at what it holds, maybe cuts the power, lets it go.
    fn run_round(
        &mut self,
        plan: Plan,
    ) -> (
        Vec<Done>,
        Option<Held>,
        Option<(dhrd_io::CrashImage, dhrd_io::CrashImage)>,
    ) {
        let Plan {
            first,
            who,
            on,
            gate,
            extra,
            chunk,
            cut,
        } = plan;
        let gates = self.gates(on).clone();
        let tier = self.tier.take().unwrap_or_else(|| unreachable!());
        let clock = self.clock.clone();
        let (t, k) = (&tier, &*clock);
        let (done, held, images) = std::thread::scope(|s| {
            let mut handles = Vec::new();
            let mut taken = Vec::new();
            if let Req::Write { .. } = &first {
                taken.push(first.range());
            }
            let held = match who {
                Who::First => {
                    handles.push(spawn_request(s, "sim-r0".into(), t, k, first.clone()));
                    let h0 = &handles[0];
                    gates.wait_held_or(gate, || h0.is_finished())
                }
                Who::WriteBack => {
                    let since = Instant::now();
                    let t = &tier;
                    gates.wait_held_or(gate, || {
                        t.stats().slots_dirty == 0 || since.elapsed() > WRITEBACK_WAIT
                    })
                }
            };
            let near = held.as_ref().map(|h| (h.offset, h.offset + h.len.max(1)));
            let near = match (near, on) {
                (Some(r), On::Lower) => Some(r),
                _ => None,
            };
            let mut reqs = Vec::new();
            if who == Who::WriteBack {
                reqs.push(first.clone());
            }
            for _ in 0..extra {
                let req = self.request(chunk, near, &taken);
                if let Req::Write { .. } = &req {
                    taken.push(req.range());
                }
                reqs.push(req);
            }
            let base = handles.len();
            for (n, req) in reqs.into_iter().enumerate() {
                let name = format!("sim-r{}", base + n);
                handles.push(spawn_request(s, name, t, k, req));
            }
            let since = Instant::now();
            while !handles[base..].iter().all(|h| h.is_finished()) && since.elapsed() < STALL_WAIT {
                std::thread::yield_now();
            }
            let images = cut.then(|| self.power_cut_images());
            gates.release(gate);
            let done: Vec<Done> = handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect();
            (done, held, images)
        });
        self.tier = Some(tier);
        (done, held, images)
    }

    /// The end: no failure left, the write-back drains, the lower tier then holds exactly
    /// what the tier serves, and so does a restart.
    fn finish(&mut self) -> Result<(), String> {
        if self.outage > 0 {
            self.lower.clear_faults();
            self.outage = 0;
        }
        self.ssd.clear_faults();
        self.ssd_gates.release_all();
        self.lower_gates.release_all();
        if self.tier().failure().is_some() {
            self.reopen(true)?;
            self.ssd_gates.release_all();
            self.lower_gates.release_all();
        }
        if !self.tier().drain(DRAIN_WAIT) {
            return Err(self.fail(format!(
                "the write-back did not drain: {:?}",
                self.tier().stats()
            )));
        }
        self.check_all("at the end")?;
        let mut served = vec![0u8; self.size as usize];
        self.tier()
            .read_at(&mut served, 0)
            .map_err(|e| self.fail(format!("read at the end: {e}")))?;
        let lower = self.lower.volatile();
        if let Some(i) = served.iter().zip(&lower).position(|(a, b)| a != b) {
            return Err(self.fail(format!(
                "nothing is dirty, but the lower tier's byte {i} is {:#x} where the tier \
                 serves {:#x}",
                lower[i], served[i]
            )));
        }
        self.reopen(false)
    }
}

/// Runs `req` on `tier` on a thread named `name` in scope `s`.
fn spawn_request<'s, 'e: 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    name: String,
    tier: &'e Tier,
    clock: &'e AtomicU64,
    req: Req,
) -> std::thread::ScopedJoinHandle<'s, Done> {
    std::thread::Builder::new()
        .name(name)
        .spawn_scoped(s, move || execute(tier, clock, req))
        .unwrap_or_else(|e| panic!("spawn: {e}"))
}

/// Runs `req` on `tier`, stamped with `clock` before and after.
fn execute(tier: &Tier, clock: &AtomicU64, req: Req) -> Done {
    let began = clock.fetch_add(1, Ordering::SeqCst);
    let out = match &req {
        Req::Read { off, len } => {
            let mut b = vec![0u8; *len as usize];
            tier.read_at(&mut b, *off)
                .map(|_| Some(b))
                .map_err(|e| e.to_string())
        }
        Req::Write { off, data } => tier
            .write_at(data, *off)
            .map(|()| None)
            .map_err(|e| e.to_string()),
    };
    let ended = clock.fetch_add(1, Ordering::SeqCst);
    Done {
        req,
        began,
        ended,
        out,
    }
}

fn simulate(seed: u64) -> Result<(), String> {
    let mut w = World::new(seed)?;
    for n in 0..ROUNDS {
        w.round(n)?;
    }
    w.finish()
}

#[test]
fn concurrent_simulation() {
    if let Some(seed) = std::env::var("DHRD_SEED").ok().and_then(|s| s.parse().ok()) {
        if let Err(e) = simulate(seed) {
            panic!("{e}");
        }
        return;
    }
    let n = if std::env::var_os("DHRD_SOAK").is_some() {
        SEEDS_SOAK
    } else {
        SEEDS_DEFAULT
    };
    // DHRD_SIM_ALL=1: every seed, then the list of those that failed.
    let all = std::env::var_os("DHRD_SIM_ALL").is_some();
    let mut failed = Vec::new();
    for seed in 0..n {
        if let Err(e) = simulate(seed) {
            if !all {
                panic!("{e}");
            }
            eprintln!("{e}\n");
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {n} seeds failed: {failed:?}",
        failed.len()
    );
}
