//! RAM accesses racing size changes: readers (`read_at`, zero-copy `view`), the loader and
//! writers against a `set_len` that shrinks the object and grows it back.
//!
//! The RAM tier is a memfd whose size follows the object's length; a copy from the mapping
//! past the memfd's size raises SIGBUS and kills the whole process (for the FUSE mount:
//! the daemon, and every application using the mount with it). A reader that read the
//! length before taking the layout lock could copy below a length a concurrent truncate
//! had just shrunk. These tests die of SIGBUS if any access to the mapping can again
//! outlive the size it was checked against.
//!
//! Each round's requests come from a seed (`DHRD_SEED=<seed>` runs one round, `DHRD_SOAK=1`
//! many more); the interleaving is the scheduler's, so a seed reproduces the requests, not
//! the race.
//!
//! What is checked besides survival: every byte a read returns is either the pattern's byte
//! at that position or zero (the object only ever holds the pattern, zeros past a shrink,
//! and pattern bytes written back), never more bytes than the largest length, and at the
//! end RAM equals the backing (`verify_mirror`).

use dhrd_engine::{Durability, HybridObject, ObjectConfig, View};
use dhrd_io::{SimBacking, SplitMix64};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const CHUNK_BYTES: u64 = 64 << 10;
const OBJECT_BYTES: u64 = 32 * CHUNK_BYTES;
/// Largest read or view, as large as a FUSE read.
const READ_BYTES_MAX: u64 = 1 << 20;
const RESIZES_PER_ROUND: usize = 1_500;
const ROUNDS_DEFAULT: u64 = 4;
const ROUNDS_SOAK: u64 = 200;
const LOAD_WAIT: Duration = Duration::from_secs(30);

type Obj = HybridObject<Arc<SimBacking>>;

/// The byte every position holds unless it was cut off by a shrink: never zero, so a zero
/// is always "past a shrink" and any other value a torn or misplaced copy.
fn pattern_byte(pos: u64) -> u8 {
    ((pos.wrapping_mul(0x9E37_79B9) >> 13) as u8) | 1
}

fn pattern(offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len).map(pattern_byte).collect()
}

fn check_bytes(what: &str, offset: u64, got: &[u8]) {
    assert!(
        offset + got.len() as u64 <= OBJECT_BYTES,
        "{what} at {offset} returned {} bytes, past the largest length {OBJECT_BYTES}",
        got.len()
    );
    for (i, &b) in got.iter().enumerate() {
        let pos = offset + i as u64;
        assert!(
            b == 0 || b == pattern_byte(pos),
            "{what} at {offset}: byte {pos} is {b:#x}, neither the pattern's {:#x} nor zero",
            pattern_byte(pos)
        );
    }
}

fn open(seed: u64, durability: Durability) -> Obj {
    let sim = Arc::new(SimBacking::from_bytes(pattern(0, OBJECT_BYTES), seed));
    let cfg = ObjectConfig {
        chunk_bytes: CHUNK_BYTES,
        durability,
        name: "races".into(),
        ..Default::default()
    };
    HybridObject::open(sim, cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

fn random_range(r: &mut SplitMix64) -> (u64, u64) {
    // Offsets anywhere up to the largest length, often near the shrunk end.
    let offset = if r.chance(1, 3) {
        r.below(2 * CHUNK_BYTES)
    } else {
        r.below(OBJECT_BYTES)
    };
    (offset, 1 + r.below(READ_BYTES_MAX))
}

fn reader(o: Obj, seed: u64, stop: Arc<AtomicBool>) {
    let mut r = SplitMix64::new(seed);
    let mut buf = vec![0u8; READ_BYTES_MAX as usize];
    while !stop.load(Ordering::Acquire) {
        let (offset, len) = random_range(&mut r);
        let dst = &mut buf[..len as usize];
        let out = o
            .read_at(dst, offset)
            .unwrap_or_else(|e| panic!("read_at: {e}"));
        check_bytes("read_at", offset, &dst[..out.bytes]);
    }
}

fn viewer(o: Obj, seed: u64, stop: Arc<AtomicBool>) {
    let mut r = SplitMix64::new(seed);
    while !stop.load(Ordering::Acquire) {
        let (offset, len) = random_range(&mut r);
        match o.view(offset, len as usize) {
            Ok(View::Ram(v)) => check_bytes("view", offset, &v),
            Ok(View::NotLoaded(_) | View::Eof) => {}
            Err(e) => panic!("view: {e}"),
        }
        // A view holds the layout's read lock. Taken back to back, the next one can get in
        // between a waiting resize being woken and it running, so on two CPUs a resize
        // could starve for minutes (docs/design.md, "Layout lock fairness"). Real clients
        // send a view before asking for the next; the pause stands for that.
    }
}

/// Writes pattern bytes back (extending the object at times), so writers, the loader
/// and readers share chunks with the resizer.
fn writer(o: Obj, seed: u64, stop: Arc<AtomicBool>) {
    let mut r = SplitMix64::new(seed);
    while !stop.load(Ordering::Acquire) {
        let offset = r.below(OBJECT_BYTES - 1);
        let len = (1 + r.below(2 * CHUNK_BYTES)).min(OBJECT_BYTES - offset);
        o.write_at(&pattern(offset, len), offset)
            .unwrap_or_else(|e| panic!("write_at: {e}"));
    }
}

fn round(seed: u64, durability: Durability) {
    let o = open(seed, durability);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (i, f) in [reader, reader, viewer, writer].into_iter().enumerate() {
        let (o, stop) = (o.clone(), stop.clone());
        threads.push(thread::spawn(move || f(o, seed * 16 + i as u64, stop)));
    }
    let mut r = SplitMix64::new(seed ^ 0x5EED);
    for _ in 0..RESIZES_PER_ROUND {
        // Shrink to a page, to inside a chunk or to a chunk boundary, then grow back.
        let short = match r.below(3) {
            0 => 4096,
            1 => r.below(OBJECT_BYTES),
            _ => r.below(32) * CHUNK_BYTES,
        };
        o.set_len(short).unwrap_or_else(|e| panic!("shrink: {e}"));
        o.set_len(OBJECT_BYTES)
            .unwrap_or_else(|e| panic!("grow: {e}"));
    }
    stop.store(true, Ordering::Release);
    for t in threads {
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
    assert!(o.wait_loaded(Some(LOAD_WAIT)), "not loaded after the race");
    o.verify_mirror()
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
}

fn rounds() -> Vec<u64> {
    if let Some(seed) = std::env::var("DHRD_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let n = if std::env::var_os("DHRD_SOAK").is_some() {
        ROUNDS_SOAK
    } else {
        ROUNDS_DEFAULT
    };
    (0..n).collect()
}

#[test]
fn reads_views_loads_and_writes_survive_shrink_and_grow_sync() {
    for seed in rounds() {
        round(seed, Durability::Sync);
    }
}

#[test]
fn reads_views_loads_and_writes_survive_shrink_and_grow_fsync() {
    for seed in rounds() {
        round(seed, Durability::Fsync);
    }
}
