//! The paper's request cases during initialization (I1-I6), driven deterministically
//! with the loader gate, plus basic behaviour on a real file.

mod common;

use common::SlowReads;
use dhrd_engine::{
    ChunkIndex, ChunkState, Durability, HybridObject, LoadGate, LoaderConfig, ObjectConfig,
    RamBudget, Served, View,
};
use dhrd_io::{Durable, FileBacking, FileOptions, SimBacking};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::Arc;
use std::time::Duration;

const CB: u64 = 4096;
const WAIT: Duration = Duration::from_secs(10);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// One loader thread, so a paused chunk stops the whole sequential pass.
fn cfg(gate: Option<Arc<LoadGate>>) -> ObjectConfig {
    let loader_config = LoaderConfig {
        threads: 1,
        ..Default::default()
    };
    ObjectConfig {
        chunk_bytes: CB,
        gate,
        loader_config,
        name: "test".into(),
        ..Default::default()
    }
}

type Obj = HybridObject<Arc<SimBacking>>;

fn sim_with(data: Vec<u8>) -> Arc<SimBacking> {
    Arc::new(SimBacking::from_bytes(data, 42))
}

#[test]
fn loads_in_background_and_serves_from_ram() -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(10 * CB as usize + 100, 1);
    let sim = sim_with(data.clone());
    let o: Obj = HybridObject::open(sim.clone(), cfg(None))?;
    assert!(o.wait_loaded(Some(WAIT)));
    assert_eq!(o.progress().chunks_loaded, 11);
    let reads_before = sim.stats().reads;
    let mut buf = vec![0u8; 5000];
    let r = o.read_at(&mut buf, 123)?;
    assert_eq!(r.served, Served::Ram);
    assert_eq!(&buf[..], &data[123..5123]);
    assert_eq!(
        sim.stats().reads,
        reads_before,
        "C2: a Loaded read touched the backing"
    );
    // Reads past the end are short, at the end empty.
    let r = o.read_at(&mut buf, data.len() as u64 - 10)?;
    assert_eq!(r.bytes, 10);
    assert_eq!(o.read_at(&mut buf, data.len() as u64)?.served, Served::Eof);
    o.verify_mirror()?;
    Ok(())
}

/// I5 and the Linux md 2024 case: while a chunk is Loading (and before), reads of it come
/// from the backing, never from RAM; once Loaded, from RAM.
#[test]
fn reads_of_loading_and_unloaded_chunks_come_from_backing() -> Result<(), Box<dyn std::error::Error>>
{
    let data = pattern(4 * CB as usize, 2);
    let sim = sim_with(data.clone());
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(1));
    let o: Obj = HybridObject::open(sim.clone(), cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(1), WAIT));
    assert_eq!(o.chunk_state(ChunkIndex(1)), Some(ChunkState::Loading));
    assert_eq!(o.chunk_state(ChunkIndex(0)), Some(ChunkState::Loaded));
    let mut buf = vec![0u8; CB as usize];
    let before = sim.stats().reads;
    let r = o.read_at(&mut buf, CB)?;
    assert_eq!(
        r.served,
        Served::Backing,
        "I5: Loading chunk answered from RAM"
    );
    assert_eq!(&buf[..], &data[CB as usize..2 * CB as usize]);
    assert!(sim.stats().reads > before);
    // Chunks 2 and 3 are still Unloaded (the loader is stopped at 1): backing too.
    assert_eq!(o.read_at(&mut buf, 3 * CB)?.served, Served::Backing);
    // A read spanning Loaded chunk 0 and Loading chunk 1 is split (I6).
    let mut two = vec![0u8; 2 * CB as usize];
    assert_eq!(o.read_at(&mut two, 100)?.served, Served::Mixed);
    assert_eq!(&two[..], &data[100..100 + 2 * CB as usize]);
    assert!(matches!(o.view(CB, 10)?, View::NotLoaded(ChunkIndex(1))));
    gate.release(ChunkIndex(1));
    assert!(o.wait_loaded(Some(WAIT)));
    assert_eq!(o.read_at(&mut buf, CB)?.served, Served::Ram);
    match o.view(CB, 16)? {
        View::Ram(v) => assert_eq!(&v[..], &data[CB as usize..CB as usize + 16]),
        _ => return Err("view of a loaded range failed".into()),
    }
    o.verify_mirror()?;
    Ok(())
}

/// I1: a write to a chunk being loaded blocks until the load completes, then goes to both.
#[test]
fn write_to_loading_chunk_waits_for_the_load() -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(3 * CB as usize, 3);
    let sim = sim_with(data.clone());
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(1));
    let o: Obj = HybridObject::open(sim.clone(), cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(1), WAIT));
    let o2 = o.clone();
    let writer = std::thread::spawn(move || o2.write_at(b"NEWDATA", CB + 10));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !writer.is_finished(),
        "I1: write to a Loading chunk did not wait"
    );
    assert_eq!(
        sim.stats().writes,
        0,
        "the blocked write reached the backing early"
    );
    gate.release(ChunkIndex(1));
    writer.join().map_err(|_| "writer panicked")??;
    assert_eq!(o.chunk_state(ChunkIndex(1)), Some(ChunkState::Loaded));
    assert!(o.stats().write_waits_on_load >= 1);
    let mut buf = [0u8; 7];
    assert_eq!(o.read_at(&mut buf, CB + 10)?.served, Served::Ram);
    assert_eq!(&buf, b"NEWDATA");
    assert!(o.wait_loaded(Some(WAIT)));
    o.verify_mirror()?;
    Ok(())
}

/// A backing whose writes block until released, to hold a writer inside its chunk lock.
struct HoldWrites {
    inner: SimBacking,
    held: Mutex<bool>,
    cv: Condvar,
    /// Writers currently inside `write_at`.
    inside: Mutex<u32>,
}

impl HoldWrites {
    fn release(&self) {
        *self.held.lock() = false;
        self.cv.notify_all();
    }
    fn wait_inside(&self) {
        self.wait_inside_n(1);
    }
    fn wait_inside_n(&self, n: u32) -> bool {
        let deadline = std::time::Instant::now() + WAIT;
        while *self.inside.lock() < n {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

impl Durable for HoldWrites {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        *self.inside.lock() += 1;
        let mut g = self.held.lock();
        while *g {
            self.cv.wait(&mut g);
        }
        drop(g);
        let r = self.inner.write_at(buf, offset);
        *self.inside.lock() -= 1;
        r
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

/// I3: a write to an Unloaded chunk goes to the backing only while holding the chunk lock;
/// the loader reaching that chunk waits, and the loaded copy includes the write.
#[test]
fn write_to_unloaded_chunk_goes_to_backing_and_loader_waits(
) -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(3 * CB as usize, 4);
    let back = Arc::new(HoldWrites {
        inner: SimBacking::from_bytes(data.clone(), 5),
        held: Mutex::new(true),
        cv: Condvar::new(),
        inside: Mutex::new(0),
    });
    // Load nothing until the writer is inside: pause chunk 0 so the loader waits there.
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(0));
    let o = HybridObject::open(back.clone(), cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(0), WAIT));
    assert_eq!(o.chunk_state(ChunkIndex(2)), Some(ChunkState::Unloaded));
    let o2 = o.clone();
    let writer = std::thread::spawn(move || o2.write_at(b"I3-WRITE", 2 * CB + 5));
    back.wait_inside(); // the writer holds chunk 2's lock inside the backing write
    gate.release(ChunkIndex(0)); // the loader proceeds to 1, then blocks on chunk 2's lock
    std::thread::sleep(Duration::from_millis(100));
    assert_ne!(
        o.chunk_state(ChunkIndex(2)),
        Some(ChunkState::Loaded),
        "loader did not wait for the writer"
    );
    back.release();
    writer.join().map_err(|_| "writer panicked")??;
    assert!(o.wait_loaded(Some(WAIT)));
    assert_eq!(o.stats().write_pieces_backing_only, 1);
    let mut buf = [0u8; 8];
    assert_eq!(o.read_at(&mut buf, 2 * CB + 5)?.served, Served::Ram);
    assert_eq!(&buf, b"I3-WRITE", "the loaded copy lost the write");
    o.verify_mirror()?;
    Ok(())
}

/// I2 and I6: a write spanning a Loaded and an Unloaded chunk is split by case.
#[test]
fn spanning_write_follows_each_chunks_case() -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(4 * CB as usize, 6);
    let sim = sim_with(data.clone());
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(2));
    let o: Obj = HybridObject::open(sim.clone(), cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(2), WAIT));
    // Chunk 0 and 1 Loaded, 2 Loading (skip), 3 Unloaded. Write across 0|1.
    let w = pattern(CB as usize, 99);
    o.write_at(&w, CB / 2)?;
    let mut buf = vec![0u8; CB as usize];
    assert_eq!(o.read_at(&mut buf, CB / 2)?.served, Served::Ram);
    assert_eq!(buf, w);
    assert_eq!(
        &sim.durable()[CB as usize / 2..CB as usize * 3 / 2],
        &w[..],
        "write not durable in sync mode"
    );
    gate.release(ChunkIndex(2));
    assert!(o.wait_loaded(Some(WAIT)));
    o.verify_mirror()?;
    Ok(())
}

#[test]
fn file_backing_roundtrip_extend_truncate() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("obj");
    std::fs::write(&path, pattern(100_000, 7))?;
    let f = FileBacking::open(&path, &FileOptions::default())?;
    let o = HybridObject::open(f, cfg(None))?;
    assert!(o.wait_loaded(Some(WAIT)));
    o.write_at(b"tail", 200_000)?; // extends with a hole
    assert_eq!(o.len(), 200_004);
    let mut buf = [1u8; 8];
    o.read_at(&mut buf, 150_000)?;
    assert_eq!(buf, [0u8; 8]);
    o.set_len(50_000)?;
    assert_eq!(o.len(), 50_000);
    assert_eq!(std::fs::metadata(&path)?.len(), 50_000);
    o.set_len(60_000)?;
    o.read_at(&mut buf, 50_000)?;
    assert_eq!(
        buf, [0u8; 8],
        "bytes past a truncate must read as zeros after extending"
    );
    o.zero_range(10, 100)?;
    o.read_at(&mut buf, 20)?;
    assert_eq!(buf, [0u8; 8]);
    assert!(o.wait_loaded(Some(WAIT)));
    o.verify_mirror()?;
    // The RAM tier's memfd mirrors the file exactly (size and bytes).
    let mut from_fd = vec![0u8; 60_000];
    let n = nix_pread(o.ram_fd(), &mut from_fd, 0)?;
    assert_eq!(n, 60_000);
    assert_eq!(from_fd, std::fs::read(&path)?);
    o.close()?;
    Ok(())
}

fn nix_pread(fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8], off: i64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: pread into our own buffer from a valid descriptor.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// I9: a chunk whose load fails stays Unloaded, is served from the backing, is retried
/// with back-off and reported; after the last attempt it is reported as failed.
#[test]
fn failed_loads_are_retried_then_reported() -> Result<(), Box<dyn std::error::Error>> {
    use dhrd_io::{Fault, FaultKind};
    let data = pattern(4 * CB as usize, 8);
    // Transient: the first two reads fail, then the disk recovers.
    let sim = sim_with(data.clone());
    sim.inject(Fault {
        at_op: 0,
        kind: FaultKind::Eio,
        persist: false,
        reads: true,
    });
    sim.inject(Fault {
        at_op: 1,
        kind: FaultKind::Eio,
        persist: false,
        reads: true,
    });
    let mut c = cfg(None);
    c.loader_config.retry_base = Duration::from_millis(5);
    let o: Obj = HybridObject::open(sim.clone(), c.clone())?;
    assert!(
        o.wait_loaded(Some(WAIT)),
        "transient load failures were not retried"
    );
    assert_eq!(o.progress().chunks_failed, 0);
    o.verify_mirror()?;

    // Permanent: every read of chunk 2 fails. It must end as failed, not loop forever,
    // and the rest must load.
    struct BadChunk(SimBacking);
    impl Durable for BadChunk {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            if offset < 3 * CB && offset + buf.len() as u64 > 2 * CB {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_at(buf, offset)
        }
        fn sync(&self) -> io::Result<()> {
            self.0.sync()
        }
        fn len(&self) -> io::Result<u64> {
            self.0.len()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0.set_len(len)
        }
    }
    c.loader_config.retry_attempts_max = 3;
    let o = HybridObject::open(BadChunk(SimBacking::from_bytes(data.clone(), 1)), c)?;
    assert!(!o.wait_loaded(Some(WAIT)));
    let p = o.progress();
    assert_eq!((p.chunks_loaded, p.chunks_failed), (3, 1), "{p:?}");
    assert_eq!(o.chunk_state(ChunkIndex(2)), Some(ChunkState::Unloaded));
    // Its neighbours are served from RAM; the bad chunk's read reports the error.
    let mut buf = vec![0u8; CB as usize];
    assert_eq!(o.read_at(&mut buf, 3 * CB)?.served, Served::Ram);
    assert!(o.read_at(&mut buf, 2 * CB).is_err());
    Ok(())
}

/// I10: a chunk read while unloaded is loaded ahead of the sequential order.
#[test]
fn demanded_chunks_load_first() -> Result<(), Box<dyn std::error::Error>> {
    let sim = sim_with(pattern(8 * CB as usize, 9));
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(0));
    gate.pause(ChunkIndex(1));
    let o: Obj = HybridObject::open(sim, cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(0), WAIT));
    let mut buf = [0u8; 16];
    assert_eq!(o.read_at(&mut buf, 6 * CB)?.served, Served::Backing);
    gate.release(ChunkIndex(0));
    assert!(gate.wait_reached(ChunkIndex(1), WAIT));
    assert_eq!(
        o.chunk_state(ChunkIndex(6)),
        Some(ChunkState::Loaded),
        "demand was not served first"
    );
    assert_eq!(o.chunk_state(ChunkIndex(2)), Some(ChunkState::Unloaded));
    gate.release(ChunkIndex(1));
    assert!(o.wait_loaded(Some(WAIT)));
    assert_eq!(o.read_at(&mut buf, 6 * CB)?.served, Served::Ram);
    Ok(())
}

/// I11: with a RAM budget smaller than the data and no cache policy, chunks past it stay
/// Unloaded, are served from the backing (correctly) and are reported; a shared budget
/// spans objects.
#[test]
fn ram_budget_limits_loading() -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(8 * CB as usize, 10);
    let budget = RamBudget::new(5 * CB);
    let mut c = cfg(None);
    c.budget = Some(budget.clone());
    c.cache.policy = dhrd_engine::CachePolicy::Off;
    let o: Obj = HybridObject::open(sim_with(data.clone()), c.clone())?;
    assert!(!o.wait_loaded(Some(WAIT)));
    // wait_loaded gives up at the first chunk over budget; the loader goes on to the rest.
    let deadline = std::time::Instant::now() + WAIT;
    while o.progress().chunks_over_budget < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let p = o.progress();
    assert_eq!((p.chunks_loaded, p.chunks_over_budget), (5, 3), "{p:?}");
    assert_eq!(budget.used_bytes(), 5 * CB);
    let mut all = vec![0u8; data.len()];
    assert_eq!(o.read_at(&mut all, 0)?.served, Served::Mixed);
    assert_eq!(all, data);
    o.write_at(b"over budget", 7 * CB + 1)?; // backing only
    o.read_at(&mut all, 0)?;
    assert_eq!(
        &all[7 * CB as usize + 1..7 * CB as usize + 12],
        b"over budget"
    );
    o.verify_mirror()?;
    // A second object on the same budget gets nothing; dropping the first frees it all.
    let o2: Obj = HybridObject::open(sim_with(data.clone()), c)?;
    assert!(!o2.wait_loaded(Some(WAIT)));
    let deadline = std::time::Instant::now() + WAIT;
    while o2.progress().chunks_over_budget < 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(o2.progress().chunks_loaded, 0);
    drop(o);
    // A loader thread may hold the last reference for a moment; the release follows.
    let deadline = std::time::Instant::now() + WAIT;
    while budget.used_bytes() != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(budget.used_bytes(), 0);
    Ok(())
}

/// I8: the loader's rate limit holds (a lower bound on time, never an upper one).
#[test]
fn loader_rate_limit_is_respected() -> Result<(), Box<dyn std::error::Error>> {
    let mut c = cfg(None);
    c.loader_config.rate_bytes_per_s = Some(40 * CB); // 10 chunks at 40 chunks/s: >= 0.2 s
    let t = std::time::Instant::now();
    let o: Obj = HybridObject::open(sim_with(pattern(10 * CB as usize, 11)), c)?;
    assert!(o.wait_loaded(Some(WAIT)));
    assert!(
        t.elapsed() >= Duration::from_millis(180),
        "loaded in {:?}",
        t.elapsed()
    );
    let p = o.progress();
    assert!(p.rate_bytes_per_s <= 50.0 * CB as f64, "{p:?}");
    Ok(())
}

/// Writers of disjoint ranges of one chunk proceed together (and can share a sync);
/// an overlapping writer waits, so RAM sees overlapping writes in backing order.
#[test]
fn disjoint_writers_share_a_chunk_overlapping_ones_queue() -> Result<(), Box<dyn std::error::Error>>
{
    let back = Arc::new(HoldWrites {
        inner: SimBacking::from_bytes(pattern(2 * CB as usize, 12), 5),
        held: Mutex::new(true),
        cv: Condvar::new(),
        inside: Mutex::new(0),
    });
    let o = HybridObject::open(back.clone(), cfg(None))?;
    assert!(o.wait_loaded(Some(WAIT)));
    let o1 = o.clone();
    let a = std::thread::spawn(move || o1.write_at(&[1u8; 100], 0)); // held in the backing
    back.wait_inside();
    // B writes a disjoint range of the same chunk; its backing write is held too, but it
    // gets in (a second writer inside the backing) rather than waiting for A.
    let o2 = o.clone();
    let b = std::thread::spawn(move || o2.write_at(&[2u8; 100], 200));
    assert!(
        back.wait_inside_n(2),
        "a disjoint writer of the same chunk did not get in"
    );
    let o3 = o.clone();
    let c = std::thread::spawn(move || o3.write_at(&[3u8; 100], 50)); // overlaps A
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(*back.inside.lock(), 2, "an overlapping writer got in");
    back.release();
    a.join().map_err(|_| "A panicked")??;
    b.join().map_err(|_| "B panicked")??;
    c.join().map_err(|_| "C panicked")??;
    let mut buf = [0u8; 300];
    o.read_at(&mut buf, 0)?;
    assert!(buf[..50].iter().all(|b| *b == 1));
    assert!(
        buf[50..150].iter().all(|b| *b == 3),
        "the overlapping writer did not go after A"
    );
    assert!(buf[200..300].iter().all(|b| *b == 2));
    o.verify_mirror()?;
    Ok(())
}

/// `discard` (an unlinked, closed file) drops the object without the sync that `close` and
/// the drop of a dirty object do in the fsync modes; `close` still syncs.
#[test]
fn discard_skips_the_flush_that_close_does() -> Result<(), Box<dyn std::error::Error>> {
    for discard in [false, true] {
        let sim = sim_with(pattern(2 * CB as usize, 3));
        let o: Obj = HybridObject::open(
            sim.clone(),
            ObjectConfig {
                durability: Durability::Fsync,
                ..cfg(None)
            },
        )?;
        assert!(o.wait_loaded(Some(WAIT)));
        // Open already synced once (the first flush after open always syncs).
        o.flush()?;
        o.write_at(&pattern(4096, 9), 100)?;
        let syncs = sim.stats().syncs;
        if discard {
            o.discard();
        } else {
            o.close()?;
        }
        drop(o);
        let added = sim.stats().syncs - syncs;
        if discard {
            assert_eq!(added, 0, "a discarded object was synced");
        } else {
            assert_eq!(
                added, 1,
                "close of a dirty fsync-mode object must sync once"
            );
        }
    }
    Ok(())
}

/// A small object is loaded by `open` itself: fully Loaded when `open` returns, without a
/// loader thread (the loader is disabled here, so only the inline load can have done it).
#[test]
fn small_objects_load_inline_at_open() -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(3 * CB as usize + 7, 5);
    let sim = sim_with(data.clone());
    let c = ObjectConfig {
        inline_load_bytes_max: 4 * CB,
        ..cfg(None)
    };
    let o: Obj = HybridObject::open(sim.clone(), c.clone())?;
    assert!(o.is_fully_loaded(), "not loaded when open returned");
    o.verify_mirror()?;
    let mut buf = vec![0u8; data.len()];
    assert_eq!(o.read_at(&mut buf, 0)?.served, Served::Ram);
    assert_eq!(buf, data);
    // One byte more than the limit: left to the loader, as before.
    let big = pattern(4 * CB as usize + 1, 6);
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(0));
    let o2: Obj = HybridObject::open(
        sim_with(big),
        ObjectConfig {
            gate: Some(gate.clone()),
            ..c
        },
    )?;
    assert!(!o2.is_fully_loaded());
    gate.release(ChunkIndex(0));
    assert!(o2.wait_loaded(Some(WAIT)));
    Ok(())
}

/// The last chunk of a file that ends inside it is charged by the pages it holds, not a
/// whole chunk, and the charge follows the length: growth within the chunk and into the
/// next one, a shrink, a hole past the end, and the close.
#[test]
fn a_partial_last_chunk_is_charged_by_its_pages() -> Result<(), Box<dyn std::error::Error>> {
    const BIG: u64 = 64 << 10;
    const PAGE: u64 = 4096;
    let budget = RamBudget::new(1 << 30);
    let c = ObjectConfig {
        chunk_bytes: BIG,
        budget: Some(budget.clone()),
        load_disabled: true,
        ..cfg(None)
    };
    let o: Obj = HybridObject::open(sim_with(pattern(1000, 5)), c)?;
    while !matches!(o.load_step(), dhrd_engine::LoadStep::Idle) {}
    assert!(o.is_fully_loaded());
    assert_eq!(budget.used_bytes(), PAGE, "a 1000-byte file");
    o.write_at(&[7; 5000], 1000)?;
    assert_eq!(budget.used_bytes(), 2 * PAGE, "grown to 6000 bytes");
    // A write into the next chunk: the first is whole now, the new one holds a page.
    o.write_at(b"x", BIG + 10)?;
    assert_eq!(budget.used_bytes(), BIG + PAGE);
    o.verify_mirror()?;
    o.set_len(100)?;
    assert_eq!(budget.used_bytes(), PAGE, "shrunk to 100 bytes");
    // Grown by a hole: the new last chunks are not loaded, so the first is charged whole.
    o.set_len(3 * BIG + 5)?;
    assert_eq!(budget.used_bytes(), BIG);
    while !matches!(o.load_step(), dhrd_engine::LoadStep::Idle) {}
    assert!(o.is_fully_loaded());
    assert_eq!(budget.used_bytes(), 3 * BIG + PAGE);
    o.verify_mirror()?;
    let mut buf = vec![0u8; 3 * BIG as usize + 5];
    o.read_at(&mut buf, 0)?;
    assert_eq!(&buf[..100], &pattern(1000, 5)[..100]);
    assert!(buf[100..].iter().all(|b| *b == 0));
    drop(o);
    assert_eq!(budget.used_bytes(), 0);
    Ok(())
}

/// Writes of 64 KiB and more reach RAM through the memfd (pwrite) instead of the mapping:
/// RAM must still mirror the backing afterwards, over loaded chunks, into chunks that were
/// never loaded, unaligned, and past the old end.
#[test]
fn large_writes_keep_ram_and_backing_equal() -> Result<(), Box<dyn std::error::Error>> {
    // Chunks of 1 MiB, so one write's piece of a chunk can reach the pwrite size.
    let c = ObjectConfig {
        chunk_bytes: 1 << 20,
        ..cfg(None)
    };
    let data = pattern((2 << 20) + 100, 9);
    let o: Obj = HybridObject::open(sim_with(data.clone()), c)?;
    assert!(o.wait_loaded(Some(WAIT)));
    let mut want = data;
    for (offset, len, seed) in [
        (4096 + 7, 200_000usize, 1u8),
        (100, 70_000, 2),
        (want.len() as u64 - 30, 300_000, 3),
    ] {
        let buf = pattern(len, seed);
        o.write_at(&buf, offset)?;
        let end = offset as usize + len;
        if want.len() < end {
            want.resize(end, 0);
        }
        want[offset as usize..end].copy_from_slice(&buf);
        o.verify_mirror()?;
    }
    let mut got = vec![0u8; want.len()];
    o.read_at(&mut got, 0)?;
    assert_eq!(got, want);
    Ok(())
}

/// On a backing whose whole aligned blocks are durable on return (O_DIRECT with RWF_DSYNC),
/// an unaligned write inside the length goes out as the blocks around it, durable without
/// a sync: the bytes around it come from RAM for a Loaded chunk and from the backing
/// otherwise. A write that would grow the backing to a block boundary is not widened.
#[test]
fn unaligned_writes_go_out_as_whole_blocks() -> Result<(), Box<dyn std::error::Error>> {
    const BLOCK: u64 = 512;
    let data = pattern(4 * CB as usize + 100, 11);
    let sim = sim_with(data.clone());
    sim.set_direct_dsync(Some(BLOCK));
    // Three chunks fit: the fourth (and the partial fifth) stay Unloaded.
    let mut c = cfg(None);
    c.budget = Some(RamBudget::new(3 * CB));
    c.cache.policy = dhrd_engine::CachePolicy::Off;
    let o: Obj = HybridObject::open(sim.clone(), c)?;
    let deadline = std::time::Instant::now() + WAIT;
    while o.progress().chunks_over_budget < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(o.progress().chunks_loaded, 3);
    let mut want = data;
    let put = |o: &Obj, want: &mut Vec<u8>, offset: u64, buf: &[u8]| -> dhrd_engine::Result<()> {
        o.write_at(buf, offset)?;
        want[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    };
    let syncs = sim.stats().syncs;
    let reads = sim.stats().reads;
    // A Loaded chunk: the bytes around come from RAM, no backing read.
    put(&o, &mut want, 700, &pattern(10, 1))?;
    assert_eq!(
        sim.stats().reads,
        reads,
        "edges of a Loaded chunk read the backing"
    );
    // Across a chunk boundary, both chunks Loaded.
    put(&o, &mut want, CB - 5, &pattern(17, 2))?;
    // An Unloaded chunk: the bytes around come from the backing.
    put(&o, &mut want, 3 * CB + 999, &pattern(3, 3))?;
    assert!(
        sim.stats().reads > reads,
        "edges of an Unloaded chunk came from nowhere"
    );
    assert_eq!(o.stats().writes_widened, 3);
    assert_eq!(sim.stats().syncs, syncs, "a widened write needed a sync");
    // Durable on return: the simulated media hold every byte already.
    assert_eq!(sim.durable(), want);
    // Past the last whole block of the length: written as it is, and synced.
    let len = o.len();
    put(&o, &mut want, len - 20, &pattern(7, 4))?;
    assert_eq!(o.stats().writes_widened, 3);
    assert_eq!(sim.stats().syncs, syncs + 1);
    assert_eq!(sim.durable(), want);
    o.verify_mirror()?;
    let mut got = vec![0u8; want.len()];
    o.read_at(&mut got, 0)?;
    assert_eq!(got, want);
    Ok(())
}

/// Writers of disjoint bytes of one block must not undo each other: each widened write
/// holds the whole block, so the bytes it copies around its own are current.
#[test]
fn widened_writers_of_one_block_keep_each_others_bytes() -> Result<(), Box<dyn std::error::Error>> {
    const BLOCK: u64 = 512;
    const WRITERS: u64 = 8;
    const ROUNDS: u8 = 50;
    let sim = sim_with(vec![0u8; 2 * CB as usize]);
    sim.set_direct_dsync(Some(BLOCK));
    let o: Obj = HybridObject::open(sim.clone(), cfg(None))?;
    assert!(o.wait_loaded(Some(WAIT)));
    let slot = BLOCK / WRITERS;
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let o = o.clone();
            s.spawn(move || {
                for round in 1..=ROUNDS {
                    let buf = vec![round; (slot - 1) as usize];
                    if let Err(e) = o.write_at(&buf, CB + w * slot + 1) {
                        panic!("writer {w}: {e}");
                    }
                }
            });
        }
    });
    let mut got = vec![0u8; BLOCK as usize];
    o.read_at(&mut got, CB)?;
    for w in 0..WRITERS {
        let part = &got[(w * slot) as usize..((w + 1) * slot) as usize];
        assert_eq!(part[0], 0, "writer {w}: a byte no one wrote changed");
        assert!(
            part[1..].iter().all(|b| *b == ROUNDS),
            "writer {w} lost a write: {part:?}"
        );
    }
    assert_eq!(&sim.durable()[CB as usize..(CB + BLOCK) as usize], &got[..]);
    o.verify_mirror()?;
    Ok(())
}

/// D6: writes of any offset and length are taken as they are: on a backing that takes any
/// byte range, a few bytes at an odd offset read nothing from the backing (no
/// read-modify-write of a block, in RAM or on the backing), hand the backing exactly those
/// bytes, and change only them, on a Loaded chunk and on an Unloaded one. (A backing that
/// is durable only in whole blocks gets the blocks around the write instead, with no RAM
/// block rewritten: `unaligned_writes_go_out_as_whole_blocks`.)
#[test]
fn small_unaligned_writes_read_nothing_and_write_only_their_bytes(
) -> Result<(), Box<dyn std::error::Error>> {
    let data = pattern(4 * CB as usize, 13);
    let sim = sim_with(data.clone());
    let gate = LoadGate::new();
    gate.pause(ChunkIndex(2));
    let o: Obj = HybridObject::open(sim.clone(), cfg(Some(gate.clone())))?;
    assert!(gate.wait_reached(ChunkIndex(2), WAIT));
    assert_eq!(o.chunk_state(ChunkIndex(0)), Some(ChunkState::Loaded));
    assert_eq!(o.chunk_state(ChunkIndex(3)), Some(ChunkState::Unloaded));
    let mut want = data;
    for (offset, len) in [(1u64, 1usize), (CB - 3, 7), (3 * CB + 1001, 3)] {
        let before = sim.stats();
        let bytes = pattern(len, offset as u8 ^ 0x5a);
        o.write_at(&bytes, offset)?;
        let after = sim.stats();
        assert_eq!(
            after.bytes_read, before.bytes_read,
            "a {len}-byte write at {offset} read the backing"
        );
        assert_eq!(
            after.bytes_written - before.bytes_written,
            len as u64,
            "a {len}-byte write at {offset} wrote more than its bytes"
        );
        want[offset as usize..offset as usize + len].copy_from_slice(&bytes);
        assert_eq!(sim.volatile(), want, "write of {len} at {offset}");
    }
    gate.release(ChunkIndex(2));
    assert!(o.wait_loaded(Some(WAIT)));
    let mut got = vec![0u8; want.len()];
    assert_eq!(o.read_at(&mut got, 0)?.served, Served::Ram);
    assert_eq!(got, want);
    o.verify_mirror()?;
    Ok(())
}

/// `close` returns only once no background job uses the backing any more, so that the
/// handle's drop lets go of it at once (its file, its single-writer lock): a reopen right
/// after a close must not find the backing still held by a load in flight.
#[test]
fn close_waits_for_the_load_in_flight() -> Result<(), Box<dyn std::error::Error>> {
    let b = Arc::new(SlowReads::new(
        SimBacking::from_bytes(pattern(16 * CB as usize, 12), 7),
        Duration::from_millis(50),
    ));
    let o = HybridObject::open(b.clone(), cfg(None))?;
    let deadline = std::time::Instant::now() + WAIT;
    while b.in_flight() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the loader never read"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    o.close()?;
    assert_eq!(b.in_flight(), 0, "close returned during a load");
    assert!(!o.is_fully_loaded(), "the load went on after close");
    Ok(())
}
