//! Forced interleavings of two threads on the tier: each test holds one thread at a device
//! operation (a gate of `testutil::gate`) while another request runs to its end, then lets
//! the first go on, so the race happens every run and not by luck. Plus a torn slot-table
//! write followed by a power cut, every outcome of it.

use super::*;
use crate::pairing::LowerIdentity;
use crate::testutil::gate::{GatedDev, Gates, Kind, Point, Power, When};
use crate::testutil::same;
use dhrd_io::{Durable, Fault, FaultKind, SimBacking};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;
use std::time::Duration;

const CB: u64 = 4096;
const CHUNKS: u64 = 16;
const SIZE: u64 = CB * CHUNKS;
const WAIT: Duration = Duration::from_secs(10);

type Dev = Arc<GatedDev<Arc<SimBacking>>>;

fn initial() -> Vec<u8> {
    (0..SIZE as usize).map(|i| (i % 251) as u8 | 0x80).collect()
}

fn lower_id() -> LowerIdentity {
    LowerIdentity::named("the simulated lower tier")
}

/// A tier over gated simulated devices.
struct Rig {
    ssd: Arc<SimBacking>,
    lower: Arc<SimBacking>,
    ssd_gates: Arc<Gates>,
    lower_gates: Arc<Gates>,
    power: Arc<Power>,
    t: Tiered<Dev, Dev>,
}

impl Rig {
    /// Opens a tier of `slots` slots over `ssd` and `lower`; `arm` arms gates before the
    /// write-back threads start.
    fn open(
        ssd: &Arc<SimBacking>,
        lower: &Arc<SimBacking>,
        slots: u64,
        mode: TierMode,
        arm: impl FnOnce(&Gates, &Gates),
    ) -> io::Result<Self> {
        let (ssd_gates, lower_gates) = (Arc::new(Gates::default()), Arc::new(Gates::default()));
        arm(&ssd_gates, &lower_gates);
        let power = Arc::new(Power::default());
        let dev = |d: &Arc<SimBacking>, g: &Arc<Gates>| {
            Arc::new(GatedDev::new(d.clone(), g.clone(), power.clone()))
        };
        let t = Tiered::open(
            dev(ssd, &ssd_gates),
            dev(lower, &lower_gates),
            lower_id(),
            ssd_bytes_for(slots, CB),
            CB,
            mode,
            1,
        )?;
        Ok(Self {
            ssd: ssd.clone(),
            lower: lower.clone(),
            ssd_gates,
            lower_gates,
            power,
            t,
        })
    }

    fn read(&self, off: u64, len: u64) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; len as usize];
        self.t.read_at(&mut b, off)?;
        Ok(b)
    }

    /// Checks the whole device against `model`, then the same after a power cut of both
    /// devices (this tier stops there) and a restart, then that the write-back brings the
    /// lower tier to it.
    fn check_all(&self, model: &[u8], what: &str) -> io::Result<()> {
        same(&self.read(0, SIZE)?, model, what);
        let (simg, limg) = self
            .power
            .cut(|| (self.ssd.crash_image(), self.lower.crash_image()));
        let lower = Arc::new(SimBacking::from_image(limg, 12));
        let t = Tiered::open(
            Arc::new(SimBacking::from_image(simg, 11)),
            lower.clone(),
            lower_id(),
            self.ssd.len()?,
            CB,
            TierMode::WriteBack,
            1,
        )?;
        let mut b = vec![0u8; SIZE as usize];
        t.read_at(&mut b, 0)?;
        same(&b, model, &format!("{what}, after a power cut"));
        assert!(t.drain(WAIT), "{what}: the write-back did not finish");
        same(&lower.volatile(), model, &format!("{what}, the lower tier"));
        Ok(())
    }
}

/// A failed check must not leave a thread held at a gate: the tier's drop joins its
/// write-back threads, and a thread scope joins its threads, before the panic is reported.
impl Drop for Rig {
    fn drop(&mut self) {
        self.ssd_gates.release_all();
        self.lower_gates.release_all();
    }
}

/// Runs `body` in a thread scope. When it fails or panics, every gate is released before
/// the scope joins its threads, one of which may be held at a gate.
fn scoped<'e>(
    rig: &'e Rig,
    body: impl for<'s> FnOnce(&'s std::thread::Scope<'s, 'e>) -> io::Result<()>,
) -> io::Result<()> {
    struct Release<'a>(&'a Rig, bool);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            if !self.1 {
                self.0.ssd_gates.release_all();
                self.0.lower_gates.release_all();
            }
        }
    }
    std::thread::scope(|s| {
        let mut release = Release(rig, false);
        let r = body(s);
        release.1 = r.is_ok();
        r
    })
}

/// Runs `f` on a thread named `name` inside `scope`.
fn spawn<'s, 'e, T: Send + 's>(
    scope: &'s std::thread::Scope<'s, 'e>,
    name: &str,
    f: impl FnOnce() -> T + Send + 's,
) -> std::thread::ScopedJoinHandle<'s, T> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(scope, f)
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"))
}

fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Defect: a read misses chunk 2 and reads it from the lower tier; before its promotion
/// names the slot, a write-through write of chunk 2 reaches the lower tier and is
/// acknowledged (no slot held the chunk). The promotion must not install the old bytes.
#[test]
fn a_promotion_never_installs_bytes_a_write_through_replaced() -> io::Result<()> {
    let ssd = Arc::new(SimBacking::new(1));
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    let rig = Rig::open(&ssd, &lower, 4, TierMode::WriteThrough, |_, _| {})?;
    let mut model = initial();
    // The first miss only counts; the second is admitted and promotes.
    rig.read(2 * CB, CB)?;
    let gate = rig.lower_gates.arm(
        Point::new(Kind::Read, When::After)
            .by("reader")
            .bytes(2 * CB, 3 * CB),
    );
    scoped(&rig, |s| {
        let reader = spawn(s, "reader", || rig.read(2 * CB, CB));
        rig.lower_gates.wait_held(gate);
        rig.t.write_at(&[0xab; 100], 2 * CB + 100)?;
        model[(2 * CB + 100) as usize..(2 * CB + 200) as usize].fill(0xab);
        rig.lower_gates.release(gate);
        joined(reader)?;
        Ok(())
    })?;
    rig.check_all(&model, "after the promotion")
}

/// Defect, in write-back mode: the read of chunk 2 that will promote it is held after its
/// lower-tier read; meanwhile a write caches chunk 2, the write-back cleans it and another
/// write evicts it (one slot). The promotion must not install the bytes it read.
#[test]
fn a_promotion_never_installs_bytes_written_back_meanwhile() -> io::Result<()> {
    let ssd = Arc::new(SimBacking::new(1));
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    let rig = Rig::open(&ssd, &lower, 1, TierMode::WriteBack, |_, _| {})?;
    let mut model = initial();
    rig.read(2 * CB, CB)?;
    let gate = rig.lower_gates.arm(
        Point::new(Kind::Read, When::After)
            .by("reader")
            .bytes(2 * CB, 3 * CB),
    );
    scoped(&rig, |s| {
        let reader = spawn(s, "reader", || rig.read(2 * CB, CB));
        rig.lower_gates.wait_held(gate);
        for (c, v) in [(2u64, 0xabu8), (5, 0xcd)] {
            rig.t.write_at(&vec![v; CB as usize], c * CB)?;
            model[(c * CB) as usize..((c + 1) * CB) as usize].fill(v);
            assert!(rig.t.drain(WAIT));
        }
        rig.lower_gates.release(gate);
        joined(reader)?;
        Ok(())
    })?;
    rig.check_all(&model, "after the promotion")
}

/// Defect: a write that takes a slot for chunk 3 fills the rest of the part it covers
/// partly from the lower tier; before it names the slot, a write to those bytes finds no
/// slot (the other one is dirty and being written back) and goes to the lower tier, and is
/// acknowledged. The slot must not shadow it with the bytes the fill read before it.
#[test]
fn an_edge_fill_never_shadows_a_bypassing_write() -> io::Result<()> {
    let ssd = Arc::new(SimBacking::new(1));
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    let mut wb_gate = None;
    let rig = Rig::open(&ssd, &lower, 2, TierMode::WriteBack, |_, l| {
        wb_gate = Some(l.arm(Point::new(Kind::Write, When::Before).by("dhrd-tier-wb")));
    })?;
    let wb_gate = wb_gate.unwrap_or_else(|| unreachable!());
    let mut model = initial();
    // Chunk 0 fills one slot, dirty; the write-back holds it (busy) before its lower write.
    rig.t.write_at(&[0x11; CB as usize], 0)?;
    model[..CB as usize].fill(0x11);
    rig.lower_gates.wait_held(wb_gate);
    let edge = rig.lower_gates.arm(
        Point::new(Kind::Read, When::After)
            .by("edge")
            .bytes(3 * CB, 4 * CB),
    );
    scoped(&rig, |s| {
        // 600..700 of the part 512..1024: the edges 512..600 and 700..1024 come from below.
        let writer = spawn(s, "edge", || rig.t.write_at(&[0x22; 100], 3 * CB + 600));
        let held = rig.lower_gates.wait_held(edge);
        assert_eq!((held.offset, held.len), (3 * CB + 512, 88), "{held:?}");
        rig.t.write_at(&[0x33; 20], 3 * CB + 520)?;
        model[(3 * CB + 520) as usize..(3 * CB + 540) as usize].fill(0x33);
        assert_eq!(rig.t.stats().writes_bypassed, 1);
        rig.lower_gates.release(edge);
        joined(writer)?;
        model[(3 * CB + 600) as usize..(3 * CB + 700) as usize].fill(0x22);
        Ok(())
    })?;
    rig.lower_gates.release(wb_gate);
    same(
        &rig.read(3 * CB, CB)?,
        &model[(3 * CB) as usize..(4 * CB) as usize],
        "chunk 3",
    );
    assert!(rig.t.drain(WAIT));
    rig.check_all(&model, "after the edge fill")
}

/// The SSD of a write-back tier whose lower tier refused writes: chunk 4 is dirty on it
/// with `0x11`. Returns the SSD, the lower tier and the model.
fn dirty_ssd() -> io::Result<(Arc<SimBacking>, Arc<SimBacking>, Vec<u8>)> {
    let ssd = Arc::new(SimBacking::new(1));
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    lower.inject(Fault {
        at_op: 0,
        kind: FaultKind::Eio,
        persist: true,
        reads: false,
    });
    let mut model = initial();
    {
        let rig = Rig::open(&ssd, &lower, 4, TierMode::WriteBack, |_, _| {})?;
        rig.t.write_at(&[0x11; CB as usize], 4 * CB)?;
        model[(4 * CB) as usize..(5 * CB) as usize].fill(0x11);
        assert_eq!(rig.t.stats().slots_dirty, 1);
    }
    lower.clear_faults();
    Ok((ssd, lower, model))
}

/// Defect: the tier is opened in write-through mode over a dirty slot. Its write-back has
/// read the slot when a write of the chunk, which goes into the dirty slot, is
/// acknowledged; the write-back must not then mark the slot clean, or the lower tier
/// lacks that write and dropping the clean slot loses it.
#[test]
fn a_write_into_a_dirty_slot_keeps_it_dirty_in_write_through_mode() -> io::Result<()> {
    let (ssd, lower, mut model) = dirty_ssd()?;
    let mut gate = None;
    let rig = Rig::open(&ssd, &lower, 4, TierMode::WriteThrough, |_, l| {
        gate = Some(l.arm(Point::new(Kind::Write, When::Before).by("dhrd-tier-wb")));
    })?;
    let gate = gate.unwrap_or_else(|| unreachable!());
    assert_eq!(rig.t.stats().dirty_at_open, 1);
    // The write-back read the slot (0x11) and holds before writing it below.
    let held = rig.lower_gates.wait_held(gate);
    assert_eq!(held.offset, 4 * CB, "{held:?}");
    rig.t.write_at(&[0x22; 100], 4 * CB)?;
    model[(4 * CB) as usize..(4 * CB + 100) as usize].fill(0x22);
    rig.lower_gates.release(gate);
    assert!(rig.t.drain(WAIT));
    same(
        &lower.volatile(),
        &model,
        "the lower tier once nothing is dirty",
    );
    // A write-through write drops the chunk's clean slot: what the slot held beyond this
    // write is read from the lower tier from then on.
    rig.t.write_at(&[0x33; 10], 4 * CB + 2000)?;
    model[(4 * CB + 2000) as usize..(4 * CB + 2010) as usize].fill(0x33);
    rig.check_all(&model, "after the slot was dropped")
}

/// A device that fails one armed write (EIO, nothing written) and remembers it.
struct FailOnce {
    inner: Arc<SimBacking>,
    at: Mutex<Option<u64>>,
    failed: Mutex<Option<(u64, Vec<u8>)>>,
}

impl Durable for FailOnce {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if *self.at.lock() == Some(offset) {
            *self.at.lock() = None;
            *self.failed.lock() = Some((offset, buf.to_vec()));
            return Err(io::Error::other("injected EIO"));
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// Defect: a one-slot SSD promotes chunk 2 (CLEAN, entry 1 in table copy 1), evicts it for
/// chunk 9 (FREE, entry 2 in copy 0, synced), promotes chunk 9 (CLEAN, entry 3 in copy 1,
/// not synced). A write of chunk 9 then rewrites copy 0 (entry 4), and that write fails
/// torn; power is cut before anything else is synced. Every outcome of the cut: the unsynced
/// entry 3 kept or lost, each prefix of the torn entry. Chunk 2 must never be served from
/// the slot that now holds chunk 9's bytes (nor chunk 9 from anything but its own bytes).
#[test]
fn a_torn_table_write_never_resurrects_an_older_owner() -> io::Result<()> {
    let g = layout::Geometry {
        chunk_bytes: CB,
        slots: 1,
        lower_bytes: SIZE,
    };
    let copy0 = g.entry_offset(0, 0);
    let mut cases = 0;
    for keep_unsynced in [false, true] {
        for torn in [1usize, 8, 32, 63, 64] {
            let sim = Arc::new(SimBacking::new(1));
            let ssd = Arc::new(FailOnce {
                inner: sim.clone(),
                at: Mutex::new(None),
                failed: Mutex::new(None),
            });
            let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
            let t = Tiered::open(
                ssd.clone(),
                lower.clone(),
                lower_id(),
                g.ssd_bytes(),
                CB,
                TierMode::WriteBack,
                1,
            )?;
            let mut b = vec![0u8; CB as usize];
            for c in [2u64, 2, 9, 9] {
                t.read_at(&mut b, c * CB)?;
            }
            assert_eq!((t.stats().promotions, t.stats().evictions), (2, 1));
            *ssd.at.lock() = Some(copy0);
            assert!(t.write_at(&[0x44; 10], 9 * CB).is_err());
            let (off, bytes) = ssd.failed.lock().take().unwrap_or_else(|| {
                panic!("the write of chunk 9 wrote no entry to copy 0 of the table")
            });
            // The cut: synced writes stay; the unsynced ones are kept or lost as the case
            // says; the failed entry write left a prefix behind.
            let mut img = if keep_unsynced {
                sim.volatile()
            } else {
                sim.durable()
            };
            img[off as usize..off as usize + torn].copy_from_slice(&bytes[..torn]);
            drop(t);
            let t = Tiered::open(
                Arc::new(SimBacking::from_bytes(img, 3)),
                Arc::new(SimBacking::from_image(lower.crash_image(), 4)),
                lower_id(),
                g.ssd_bytes(),
                CB,
                TierMode::WriteBack,
                1,
            )?;
            let what = format!("unsynced entry kept {keep_unsynced}, {torn} bytes torn");
            let mut got = vec![0u8; SIZE as usize];
            t.read_at(&mut got, 0)?;
            let want = initial();
            for c in 0..CHUNKS {
                let r = (c * CB) as usize..((c + 1) * CB) as usize;
                same(&got[r.clone()], &want[r], &format!("{what}: chunk {c}"));
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 10);
    Ok(())
}

/// Found by the simulation: a write-through write of chunk 3 drops its clean slot, and the
/// FREE entry that drops it fails (nothing reaches the table). A second write, of chunks 2
/// and 3, had begun before (it passed the failure check) and is held after its write of
/// chunk 2; it then finds no slot for chunk 3 in memory and must not be acknowledged: after
/// a power cut the table still names chunk 3 in the slot, with bytes older than it.
///
/// The same look-up misses a FREE entry that is written but not yet synced (a power cut
/// before that sync); there the second write has to wait for that sync, which a gate
/// cannot show without holding the SSD's sync lock the write waits for, so that case is
/// left to the simulation.
#[test]
fn a_write_to_the_lower_tier_is_not_acknowledged_while_a_dropped_entry_may_return() -> io::Result<()>
{
    let sim = Arc::new(SimBacking::new(1));
    let ssd = Arc::new(FailOnce {
        inner: sim.clone(),
        at: Mutex::new(None),
        failed: Mutex::new(None),
    });
    let lower = Arc::new(SimBacking::from_bytes(initial(), 2));
    let gates = Arc::new(Gates::default());
    let gated = Arc::new(GatedDev::new(
        lower.clone(),
        gates.clone(),
        Arc::new(Power::default()),
    ));
    let t = Tiered::open(
        ssd.clone(),
        gated,
        lower_id(),
        ssd_bytes_for(4, CB),
        CB,
        TierMode::WriteThrough,
        1,
    )?;
    let mut b = vec![0u8; CB as usize];
    t.read_at(&mut b, 3 * CB)?;
    t.read_at(&mut b, 3 * CB)?;
    assert_eq!(t.stats().promotions, 1);
    let g = layout::Geometry {
        chunk_bytes: CB,
        slots: 4,
        lower_bytes: SIZE,
    };
    // The promotion's CLEAN entry is the slot's first (copy 1); the FREE is its second.
    let free_at = g.entry_offset(0, 2);
    let gate = gates.arm(
        Point::new(Kind::Write, When::After)
            .by("both")
            .bytes(2 * CB, 3 * CB),
    );
    let (off, len) = (3 * CB - 100, 200u64);
    let second = std::thread::scope(|s| -> io::Result<io::Result<()>> {
        let both = spawn(s, "both", || t.write_at(&vec![0x55; len as usize], off));
        gates.wait_held(gate);
        *ssd.at.lock() = Some(free_at);
        let first = t.write_at(&[0x66; 10], 3 * CB + 1000);
        assert!(first.is_err(), "the FREE entry did not fail");
        assert!(ssd.failed.lock().is_some());
        gates.release(gate);
        Ok(joined(both))
    })?;
    // The power cut keeps everything that was written (the FREE never was).
    let img = sim.volatile();
    drop(t);
    let t = Tiered::open(
        Arc::new(SimBacking::from_bytes(img, 3)),
        Arc::new(SimBacking::from_image(lower.crash_image(), 4)),
        lower_id(),
        ssd_bytes_for(4, CB),
        CB,
        TierMode::WriteBack,
        1,
    )?;
    let mut got = vec![0u8; len as usize];
    t.read_at(&mut got, off)?;
    let old = &initial()[off as usize..(off + len) as usize];
    match second {
        Ok(()) => same(
            &got,
            &[0x55; 200],
            "the acknowledged write after a power cut",
        ),
        Err(_) => {
            for (i, g) in got.iter().enumerate() {
                assert!(*g == old[i] || *g == 0x55, "byte {i}: neither old nor new");
            }
        }
    }
    Ok(())
}
