//! Tests of the tier over the lower tier it was made for, across opens: an SSD serves only
//! that lower tier, drops its clean copies of one that changed while detached, adopts
//! dirty chunks only when asked (and loses nothing if cut off meanwhile), and marks a
//! lower tier lacking data for its cache (`pairing.rs`).

use super::tests::{initial, CB, SIZE, SSD_BYTES, WAIT};
use super::*;
use crate::pairing::{self, CacheMark, LowerIdentity};
use crate::testutil::{read_all, same, seeds};
use dhrd_io::{Durable, SimBacking};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The tier of the pairing tests: 8 slots, write-back, one thread.
fn open(
    ssd: &Arc<SimBacking>,
    lower: &Arc<SimBacking>,
    id: LowerIdentity,
) -> io::Result<Tiered<Arc<SimBacking>, Arc<SimBacking>>> {
    Tiered::open(
        ssd.clone(),
        lower.clone(),
        id,
        SSD_BYTES,
        CB,
        TierMode::WriteBack,
        1,
    )
}

/// A lower tier named `key` whose stamp the test sets.
fn stamped(key: &str, stamp: &Arc<std::sync::atomic::AtomicU64>) -> LowerIdentity {
    let s = stamp.clone();
    LowerIdentity {
        stamp: Some(Arc::new(move || Ok(s.load(Ordering::SeqCst)))),
        ..LowerIdentity::named(key)
    }
}

fn adopting(mut id: LowerIdentity) -> LowerIdentity {
    id.adopt = true;
    id
}

#[test]
fn an_ssd_serves_only_the_lower_tier_it_was_made_for() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let ssd = Arc::new(SimBacking::new(1));
    let a = Arc::new(SimBacking::from_bytes(initial(), 2));
    let b_bytes = vec![0x11u8; SIZE as usize];
    let b = Arc::new(SimBacking::from_bytes(b_bytes.clone(), 3));
    let stamp = Arc::new(std::sync::atomic::AtomicU64::new(1));
    {
        // Over a: chunk 0 written and written back (a clean slot), then chunk 1 written
        // while a refuses writes (a dirty slot).
        let t = open(&ssd, &a, stamped("a", &stamp))?;
        t.write_at(&[1; CB as usize], 0)?;
        assert!(t.drain(WAIT));
        a.inject(Fault {
            at_op: 0,
            kind: FaultKind::Eio,
            persist: true,
            reads: false,
        });
        t.write_at(&[2; CB as usize], CB)?;
        assert_eq!(t.stats().slots_dirty, 1);
    }
    // Over b the dirty chunk is refused, and b is not touched.
    let e = open(&ssd, &b, LowerIdentity::named("b"))
        .err()
        .ok_or_else(|| io::Error::other("opened over another lower tier"))?;
    assert!(e.to_string().contains("made for a, not for b"), "{e}");
    same(&b.volatile(), &b_bytes, "b after the refusal");
    // A clean close recorded a's stamp (as after an unfinished drain); a changed since.
    let c = pairing::check(&*ssd, &stamped("a", &stamp))?;
    let id = c.cache_id.unwrap_or_default();
    pairing::detach(&*ssd, &stamped("a", &stamp), c.next_seq, id)?;
    stamp.store(2, Ordering::SeqCst);
    let e = open(&ssd, &a, stamped("a", &stamp))
        .err()
        .ok_or_else(|| io::Error::other("opened over a changed lower tier"))?;
    assert!(e.to_string().contains("was changed"), "{e}");
    // Adopted over b: the dirty chunk is served and written back to b, the clean one is
    // dropped (b's own bytes are served there).
    let mut want = b_bytes.clone();
    want[CB as usize..2 * CB as usize].fill(2);
    {
        let t = open(&ssd, &b, adopting(LowerIdentity::named("b")))?;
        let s = t.stats();
        assert_eq!((s.dropped_at_open, s.adopted_dirty), (1, 1), "{s:?}");
        assert!(t.distrusted_at_open().is_some());
        same(&read_all(&t, SIZE), &want, "adopted over b");
        assert!(t.drain(WAIT));
        same(&b.volatile(), &want, "b after the write-back");
    }
    // From then on the SSD is b's.
    let t = open(&ssd, &b, LowerIdentity::named("b"))?;
    assert_eq!(t.distrusted_at_open(), None);
    same(&read_all(&t, SIZE), &want, "reopened over b");
    Ok(())
}

#[test]
fn clean_copies_of_a_lower_tier_changed_while_detached_are_dropped() -> io::Result<()> {
    let ssd = Arc::new(SimBacking::new(1));
    let a = Arc::new(SimBacking::from_bytes(initial(), 2));
    let stamp = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut want = initial();
    for c in 0..4u64 {
        want[(c * CB) as usize..((c + 1) * CB) as usize].fill(c as u8 + 1);
    }
    {
        let t = open(&ssd, &a, stamped("a", &stamp))?;
        for c in 0..4u64 {
            t.write_at(&[c as u8 + 1; CB as usize], c * CB)?;
        }
        assert!(t.drain(WAIT));
    }
    // Unchanged: trusted, the four chunks still cached.
    {
        let t = open(&ssd, &a, stamped("a", &stamp))?;
        assert_eq!((t.distrusted_at_open(), t.stats().slots_used), (None, 4));
    }
    // Another writer changes a while no tier is attached.
    a.write_at(&[9; 100], CB)?;
    a.sync()?;
    want[CB as usize..CB as usize + 100].fill(9);
    stamp.store(2, Ordering::SeqCst);
    let t = open(&ssd, &a, stamped("a", &stamp))?;
    let s = t.stats();
    assert_eq!((s.dropped_at_open, s.slots_used), (4, 0), "{s:?}");
    same(&read_all(&t, SIZE), &want, "after the change");
    Ok(())
}

/// Power cut at every SSD operation of an open that adopts another lower tier's dirty
/// chunk: the next open still serves it, never the dropped clean chunk.
#[test]
fn a_crash_while_adopting_loses_nothing() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let ssd = Arc::new(SimBacking::new(1));
    let a = Arc::new(SimBacking::from_bytes(initial(), 2));
    {
        let t = open(&ssd, &a, LowerIdentity::named("a"))?;
        t.write_at(&[1; CB as usize], 0)?;
        assert!(t.drain(WAIT));
        a.inject(Fault {
            at_op: 0,
            kind: FaultKind::Eio,
            persist: true,
            reads: false,
        });
        t.write_at(&[2; CB as usize], CB)?;
    }
    let base = ssd.crash_image();
    let b_bytes = vec![0x11u8; SIZE as usize];
    let mut want = b_bytes.clone();
    want[CB as usize..2 * CB as usize].fill(2);
    let b_id = || adopting(LowerIdentity::named("b"));
    // A crash keeps each unsynced sector or not at random: many seeds per point (cheap).
    for seed in 0..seeds(64).max(16) {
        for n in 0u64.. {
            let sim_seed = seed * 1000 + n * 4;
            let ssd = Arc::new(SimBacking::from_image(base.clone(), sim_seed));
            let b = Arc::new(SimBacking::from_bytes(b_bytes.clone(), sim_seed + 1));
            ssd.crash_at_op(n);
            let first = open(&ssd, &b, b_id());
            let finished = first.is_ok() && ssd.crashed_image().is_none();
            drop(first);
            let simg = ssd.crashed_image().unwrap_or_else(|| ssd.crash_image());
            let t = open(
                &Arc::new(SimBacking::from_image(simg, sim_seed + 2)),
                &Arc::new(SimBacking::from_image(b.crash_image(), sim_seed + 3)),
                b_id(),
            )?;
            let what = format!("seed {seed}, crash at {n}");
            same(&read_all(&t, SIZE), &want, &what);
            assert!(t.drain(WAIT));
            same(&t.lower().volatile(), &want, &format!("{what}: b"));
            if finished {
                assert!(n >= 3, "the adopting open took only {n} operations");
                break;
            }
        }
    }
    Ok(())
}

/// A mark kept in memory, as a file's extended attribute would be.
#[derive(Default)]
struct MemMark(parking_lot::Mutex<Option<String>>);

impl CacheMark for MemMark {
    fn get(&self) -> io::Result<Option<String>> {
        Ok(self.0.lock().clone())
    }
    fn set(&self, text: &str) -> io::Result<()> {
        *self.0.lock() = Some(text.into());
        Ok(())
    }
    fn clear(&self) -> io::Result<()> {
        *self.0.lock() = None;
        Ok(())
    }
}

/// While the SSD holds data the lower tier lacks, the lower tier is marked: a start with
/// another (here: a new) SSD is refused until the operator drops the mark, and a clean
/// stop with nothing dirty removes it.
#[test]
fn a_lower_tier_lacking_data_is_marked_for_its_cache() -> io::Result<()> {
    use dhrd_io::{Fault, FaultKind};
    let mark = Arc::new(MemMark::default());
    let id = |ignore_mark| LowerIdentity {
        mark: Some(mark.clone() as Arc<dyn CacheMark>),
        ignore_mark,
        ..LowerIdentity::named("a")
    };
    let ssd = Arc::new(SimBacking::new(1));
    let a = Arc::new(SimBacking::from_bytes(initial(), 2));
    {
        let t = open(&ssd, &a, id(false))?;
        assert!(mark.get()?.is_some(), "not marked while attached");
        a.inject(Fault {
            at_op: 0,
            kind: FaultKind::Eio,
            persist: true,
            reads: false,
        });
        t.write_at(&[2; CB as usize], 0)?;
    }
    a.clear_faults();
    let text = mark.get()?.unwrap_or_default();
    assert!(text.starts_with("dhrd cache "), "{text}");
    // A new SSD over the marked lower tier: refused, the mark and both devices untouched.
    let fresh = Arc::new(SimBacking::new(3));
    let e = open(&fresh, &a, id(false))
        .err()
        .ok_or_else(|| io::Error::other("a second cache took a marked lower tier"))?;
    assert!(e.to_string().contains("--drop-cache-mark"), "{e}");
    assert_eq!(mark.get()?, Some(text.clone()));
    assert_eq!(fresh.stats().ops, 0, "the refused SSD was written");
    // The SSD that marked it is welcome, writes its chunk back and, stopped cleanly with
    // nothing dirty, removes the mark.
    {
        let t = open(&ssd, &a, id(false))?;
        assert!(t.drain(WAIT));
    }
    assert_eq!(mark.get()?, None);
    // Dropping a mark on purpose: the new cache's mark replaces it.
    mark.set(&text)?;
    drop(open(&fresh, &a, id(true))?);
    assert_eq!(mark.get()?, None);
    Ok(())
}
