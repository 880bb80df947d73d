//! The ways `rehypar-io` writes its files: each by its own synchronous write at the place
//! a first-fit allocator gives it (or written there and made durable by a sync shared with
//! the writers that wrote meanwhile: group commit), or packed into ReHypar extents held in
//! memory and written whole.
//!
//! Invariants of the packed writer: `State::open` holds exactly the extents ReHypar still
//! offers for reuse (checked after every placement); an extent leaves it once, when it is
//! full or sealed, and is then written once by whoever took it out; a file's writer waits
//! for that write's outcome, so it never reports a file whose bytes are not durable; no
//! file is ever placed in an extent already written (checked: with no deletes ReHypar never
//! offers one again).

use super::{file_bytes, RunResult, BLOCK_BYTES};
use anyhow::{anyhow, bail, Context, Result};
use dhrd_alloc::{
    AllocOutcome, BlockCount, Extent, ExtentAllocator, FitPolicy, ReHypar, ReHyparConfig,
    SpaceAllocator,
};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The timer looks for expired extents at least this often.
const TIMER_TICK_MAX: Duration = Duration::from_millis(1);

/// Writes all of `buf` at `offset`, durable on return (`pwritev2` with `RWF_DSYNC`: the
/// write and a sync of its range, one synchronous write as a file system issues it).
fn write_dsync(f: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = &buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let at = i64::try_from(offset + done as u64).map_err(io::Error::other)?;
        // SAFETY: one iovec over `rest`, which outlives the call; the descriptor is open.
        let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev2 wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

fn device_blocks(device_mib: u64) -> BlockCount {
    BlockCount((device_mib << 20) / BLOCK_BYTES)
}

/// Device writes and their bytes, and extents written because their window expired.
#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    bytes: AtomicU64,
    expired: AtomicU64,
}

impl Counters {
    fn wrote(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Where one file went.
pub enum Placed {
    /// Its first block; the file is durable.
    At(u64),
    /// The allocator had no room: the run stops taking files (ReHypar with few writers
    /// seals extents holding one file each, and can fill the device that way).
    NoSpace,
}

/// `placed` value of a file that was not written.
pub const NOT_WRITTEN: u64 = u64::MAX;

/// Runs `threads` writers over the files (each takes the next file index) with `one`
/// writing file `i` and saying where it went; collects the latencies. Stops taking files
/// at the first `NoSpace` (the result then has fewer files, and `placed` says which).
fn drive(
    sizes: &[u64],
    threads: usize,
    one: &(dyn Fn(usize) -> Result<Placed> + Sync),
) -> Result<(f64, Vec<u64>, Vec<f64>, bool)> {
    let cursor = AtomicU64::new(0);
    let placed: Vec<AtomicU64> = sizes.iter().map(|_| AtomicU64::new(NOT_WRITTEN)).collect();
    let failed = AtomicBool::new(false);
    let full = AtomicBool::new(false);
    let t0 = Instant::now();
    let lats: Vec<Result<Vec<f64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<Vec<f64>> {
                    let mut lat = Vec::new();
                    loop {
                        let i = cursor.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= sizes.len()
                            || failed.load(Ordering::Relaxed)
                            || full.load(Ordering::Relaxed)
                        {
                            return Ok(lat);
                        }
                        let t = Instant::now();
                        match one(i) {
                            Ok(Placed::At(block)) => placed[i].store(block, Ordering::Relaxed),
                            Ok(Placed::NoSpace) => {
                                full.store(true, Ordering::Relaxed);
                                continue;
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a writer panicked")))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for l in lats {
        all.extend(l?);
    }
    let placed = placed.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    Ok((secs, placed, all, full.load(Ordering::Relaxed)))
}

fn result(
    (secs, placed, mut lats, full): (f64, Vec<u64>, Vec<f64>, bool),
    sizes: &[u64],
    held_blocks: BlockCount,
    c: &Counters,
) -> (RunResult, Vec<u64>) {
    lats.sort_by(f64::total_cmp);
    let written = placed.iter().filter(|&&p| p != NOT_WRITTEN).count() as u64;
    let file_bytes: u64 = sizes
        .iter()
        .zip(&placed)
        .filter(|(_, &p)| p != NOT_WRITTEN)
        .map(|(s, _)| s)
        .sum();
    let p99 = lats
        .get((lats.len() * 99 / 100).min(lats.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let r = RunResult {
        secs,
        files: written,
        out_of_space: full,
        file_bytes,
        device_writes: c.writes.load(Ordering::Relaxed),
        device_bytes: c.bytes.load(Ordering::Relaxed),
        utilisation: file_bytes as f64 / (held_blocks.0 * BLOCK_BYTES).max(1) as f64,
        expired: c.expired.load(Ordering::Relaxed),
        latency_mean_us: lats.iter().sum::<f64>() / lats.len().max(1) as f64,
        latency_p99_us: p99,
    };
    (r, placed)
}

fn blocks_of(bytes: u64) -> BlockCount {
    BlockCount(bytes.div_ceil(BLOCK_BYTES))
}

/// One fdatasync shared by every writer that wrote before it began (group commit): a write
/// is durable once a sync that started after it finished. A failed sync fails every later
/// caller too (a failed fdatasync may have dropped other writers' pages).
#[derive(Default)]
struct GroupSync {
    state: Mutex<SyncState>,
    cv: Condvar,
}

#[derive(Default)]
struct SyncState {
    started: u64,
    finished: u64,
    running: bool,
    failed: bool,
}

impl GroupSync {
    fn after_write(&self, f: &File) -> io::Result<()> {
        let mut g = self.state.lock();
        // The next sync to start covers this caller's write, which came before the lock.
        let target = g.started + 1;
        loop {
            if g.failed {
                return Err(io::Error::other("an earlier shared fdatasync failed"));
            }
            if g.finished >= target {
                return Ok(());
            }
            if g.running {
                self.cv.wait(&mut g);
                continue;
            }
            g.running = true;
            g.started += 1;
            let me = g.started;
            drop(g);
            let r = f.sync_data();
            g = self.state.lock();
            g.running = false;
            g.finished = me;
            g.failed |= r.is_err();
            self.cv.notify_all();
            r?;
        }
    }
}

/// Every file at the place first-fit gives it, by its own synchronous write, or with
/// `group` by a plain write and a shared fdatasync. Returns the result and each file's
/// first block.
pub fn first_fit(
    f: &File,
    device_mib: u64,
    sizes: &[u64],
    threads: usize,
    group: bool,
) -> Result<(RunResult, Vec<u64>)> {
    let alloc = Mutex::new(ExtentAllocator::new(
        device_blocks(device_mib),
        FitPolicy::FirstFit,
    )?);
    let c = Counters::default();
    let gs = GroupSync::default();
    let one = |i: usize| -> Result<Placed> {
        let data = file_bytes(i as u64, sizes[i]);
        let Some(e) = alloc.lock().allocate(blocks_of(sizes[i]), None) else {
            return Ok(Placed::NoSpace);
        };
        let at = e.start.0 * BLOCK_BYTES;
        let r = if group {
            f.write_all_at(&data, at).and_then(|()| gs.after_write(f))
        } else {
            write_dsync(f, &data, at)
        };
        r.with_context(|| format!("first-fit: writing file {i}"))?;
        c.wrote(data.len());
        Ok(Placed::At(e.start.0))
    };
    let run = drive(sizes, threads, &one)?;
    let held = alloc.lock().stats().held_blocks();
    Ok(result(run, sizes, held, &c))
}

/// The outcome of an extent's write, which the writers of its files wait for.
#[derive(Default)]
struct Done {
    outcome: Mutex<Option<Result<(), String>>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, r: Result<(), String>) {
        *self.outcome.lock() = Some(r);
        self.cv.notify_all();
    }

    fn wait(&self) -> Result<()> {
        let mut g = self.outcome.lock();
        while g.is_none() {
            self.cv.wait(&mut g);
        }
        match g.as_ref() {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(anyhow!("{e}")),
            None => unreachable!("woken without an outcome"),
        }
    }
}

/// An extent being filled in memory.
struct Open {
    extent: Extent,
    buf: Vec<u8>,
    /// Bytes from the extent's start up to the end of its last file.
    filled: usize,
    since: Instant,
    done: Arc<Done>,
}

impl Open {
    fn write(self, f: &File, c: &Counters) {
        let data = &self.buf[..self.filled];
        let r = write_dsync(f, data, self.extent.start.0 * BLOCK_BYTES)
            .map_err(|e| format!("writing the extent at block {}: {e}", self.extent.start.0));
        if r.is_ok() {
            c.wrote(data.len());
        }
        self.done.set(r);
    }
}

struct State {
    alloc: ReHypar,
    /// Extents ReHypar still offers for reuse, by first block.
    open: HashMap<u64, Open>,
    /// Extents written (sealed): no file may land in one again.
    written: HashSet<u64>,
}

/// Where a file was copied: its first block, what to wait for, and the extent to write
/// now when the placement closed it.
type Copied = (u64, Arc<Done>, Option<Open>);

/// Places file `i` and copies it into its extent's buffer; `None` when there is no room.
fn place(st: &mut State, i: usize, data: &[u8]) -> Result<Option<Copied>> {
    let len = blocks_of(data.len() as u64);
    let at = match st.alloc.place(len, None) {
        AllocOutcome::Placed { extent, .. } => extent,
        AllocOutcome::NoSpace => return Ok(None),
        AllocOutcome::Invalid => bail!("rehypar: file {i} of {len:?} is not a valid request"),
    };
    let Some((whole, still_open)) = st.alloc.extent_at(at.start) else {
        bail!("rehypar: file {i} placed at {at} outside a resident extent");
    };
    if at.end() > whole.end() {
        bail!("rehypar: file {i} spans extents ({at} in {whole}); only small files are modelled");
    }
    if st.written.contains(&whole.start.0) {
        bail!("rehypar: file {i} placed in extent {whole}, which was written already");
    }
    let ext_bytes = (whole.len.0 * BLOCK_BYTES) as usize;
    let e = st.open.entry(whole.start.0).or_insert_with(|| Open {
        extent: whole,
        buf: vec![0u8; ext_bytes],
        filled: 0,
        since: Instant::now(),
        done: Arc::new(Done::default()),
    });
    let off = ((at.start.0 - whole.start.0) * BLOCK_BYTES) as usize;
    e.buf[off..off + data.len()].copy_from_slice(data);
    e.filled = e.filled.max(off + data.len());
    let done = e.done.clone();
    let closed = if still_open {
        None
    } else {
        st.written.insert(whole.start.0);
        st.open.remove(&whole.start.0)
    };
    Ok(Some((at.start.0, done, closed)))
}

/// Seals and takes out every extent that has been in memory for `window`.
fn expired(st: &mut State, window: Duration) -> Vec<Open> {
    let now = Instant::now();
    let old: Vec<u64> = st
        .open
        .iter()
        .filter(|(_, e)| now.duration_since(e.since) >= window)
        .map(|(k, _)| *k)
        .collect();
    let mut out = Vec::with_capacity(old.len());
    for k in old {
        if let Some(e) = st.open.remove(&k) {
            let was_open = st.alloc.seal(e.extent.start);
            debug_assert!(was_open, "an extent in `open` was not open in ReHypar");
            st.written.insert(k);
            out.push(e);
        }
    }
    out
}

/// Every file packed into ReHypar extents (the paper's sections, threshold `v`), each
/// extent written whole once full or after `window` in memory. Returns the result and each
/// file's first block.
pub fn packed(
    f: &File,
    device_mib: u64,
    sizes: &[u64],
    threads: usize,
    v: u64,
    window: Duration,
) -> Result<(RunResult, Vec<u64>)> {
    let mut cfg = ReHyparConfig::paper(device_blocks(device_mib));
    cfg.threshold_blocks = BlockCount(v);
    let state = Mutex::new(State {
        alloc: ReHypar::new(cfg)?,
        open: HashMap::new(),
        written: HashSet::new(),
    });
    let c = Counters::default();
    let stop = AtomicBool::new(false);
    let tick = (window / 4).clamp(Duration::from_micros(50), TIMER_TICK_MAX);
    let one = |i: usize| -> Result<Placed> {
        let data = file_bytes(i as u64, sizes[i]);
        let Some((block, done, closed)) = place(&mut state.lock(), i, &data)? else {
            return Ok(Placed::NoSpace);
        };
        if let Some(e) = closed {
            e.write(f, &c);
        }
        done.wait()
            .with_context(|| format!("rehypar: file {i} not durable"))?;
        Ok(Placed::At(block))
    };
    let run = std::thread::scope(|s| {
        s.spawn(|| {
            // The paper's expiry: an extent in memory longer than the window is written.
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                let old = expired(&mut state.lock(), window);
                for e in old {
                    c.expired.fetch_add(1, Ordering::Relaxed);
                    e.write(f, &c);
                }
            }
        });
        let r = drive(sizes, threads, &one);
        stop.store(true, Ordering::Relaxed);
        r
    })?;
    let st = state.lock();
    if !st.open.is_empty() {
        bail!("rehypar: {} extents left unwritten", st.open.len());
    }
    let held = st.alloc.stats().held_blocks();
    Ok(result(run, sizes, held, &c))
}
