//! `dhrd-bench fileserver`: a reimplementation of Filebench's fileserver personality
//! (`fileserver.f`) for any directory: a dhrd FUSE mount, tmpfs, ext4, ...
//!
//! What it measures: T threads loop over eleven flowops on a fileset of N entries:
//! createfile + writewholefile + closefile, openfile + appendfilerand + closefile,
//! openfile + readwholefile + closefile, deletefile, statfile. Every flowop counts as one
//! op, as in Filebench; the result is ops/s over the timed phase, per-flowop counts and
//! latencies, and MiB/s read and written.
//!
//! The fileset: entry `i` lives at `ROOT/d../d../f<i % width>`, where the directory digits
//! are `i / width` written in base `width` (every directory holds at most `width`
//! entries; all but the top level and the last directory of a level hold exactly that).
//! Paths are computed from the index, so an entry costs 8 bytes (its size and its slot in
//! a shard list), which keeps 500k-entry filesets cheap. Each entry's size is drawn once
//! from a gamma distribution (mean `--mean-file-bytes`, shape 1.5), and createfile always
//! rewrites that size, as Filebench does.
//!
//! Invariants:
//! - Every entry is in exactly one place at any time: the `exists` or the `absent` list
//!   of its shard, or held (busy) by the one thread operating on it. A thread takes an
//!   entry out of a list before touching its file and puts it back afterwards, so no two
//!   threads ever work on the same file: create never meets an existing file (it uses
//!   O_EXCL to prove it) and open, stat and unlink never meet a missing one. Any I/O error
//!   is therefore a real error and aborts the run, naming the flowop and the path.
//! - Shards are picked at random and locked only to take or put one entry, so threads
//!   contend on a lock only when they pick the same shard (there are at least
//!   `SHARDS_PER_THREAD` shards per thread).
//! - When the run ends, `files_end == prealloc_files + createfile1 - deletefile1`, and
//!   cleanup unlinks exactly the entries the lists say exist (an ENOENT there would be an
//!   accounting bug and aborts).
//!
//! Differences from Filebench: directory widths are fixed rather than drawn from a
//! distribution; picks are random over shards rather than Filebench's own order; an op
//! that finds no entry of the kind it needs is counted as skipped rather than retried;
//! with `--fsync` the fsync is part of the writewholefile/appendfilerand latency (so the
//! op count per loop stays eleven); after preallocation the file system is synced with
//! syncfs so the timed phase does not pay for the setup's writeback.

use crate::fileio::{
    close_checked, emit, fsync, latency_histogram, parse_size, r3, r6, record_ns, syncfs, MIB,
};
use anyhow::{bail, ensure, Context};
use dhrd_io::SplitMix64;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::json;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The fileset goes into this directory under `--dir`; it must not exist.
const ROOT_NAME: &str = "dhrd-fileserver";
/// Filebench's `gamma:1.5` for the file size distribution.
const GAMMA_SHAPE: f64 = 1.5;
/// Bounds of the parameters.
const FILES_MAX: u64 = 100_000_000;
const THREADS_MAX: usize = 1024;
const SECS_MAX: f64 = 7.0 * 86_400.0;
const DIR_WIDTH_MIN: u64 = 2;
const DIR_WIDTH_MAX: u64 = 1_000_000;
const IOSIZE_MAX: u64 = 64 * MIB;
const MEAN_FILE_BYTES_MAX: u64 = 256 * MIB;
const MEAN_APPEND_BYTES_MAX: u64 = 64 * MIB;
/// A drawn file size is clamped to this (the gamma tail is long; sizes are stored as u32).
const FILE_BYTES_MAX: u64 = 4 * MEAN_FILE_BYTES_MAX;
/// Preallocation and cleanup threads (at most; never more than `--threads`).
const SETUP_THREADS_MAX: usize = 16;
/// Entry shards per worker thread, and in all.
const SHARDS_PER_THREAD: usize = 4;
const SHARDS_MAX: usize = 4096;

const _: () = assert!(FILES_MAX <= u32::MAX as u64);
const _: () = assert!(FILE_BYTES_MAX <= u32::MAX as u64);
const _: () = assert!(DIR_WIDTH_MIN >= 2);

#[derive(clap::Args)]
pub struct FileserverArgs {
    /// Directory to run in (any file system); the fileset is created in
    /// DIR/dhrd-fileserver, which must not exist.
    #[arg(long)]
    pub dir: PathBuf,
    /// Entries in the fileset (Filebench's nfiles).
    #[arg(long)]
    pub files: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 50)]
    pub threads: usize,
    /// Length of the timed phase in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub secs: f64,
    /// Mean file size (gamma distribution, shape 1.5).
    #[arg(long, default_value = "131072", value_parser = parse_size)]
    pub mean_file_bytes: u64,
    /// Entries per directory (Filebench's meandirwidth).
    #[arg(long, default_value_t = 20)]
    pub dir_width: u64,
    /// Size of each write of writewholefile and each read of readwholefile.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub iosize: u64,
    /// Mean size of appendfilerand (uniform in 1..=2*mean).
    #[arg(long, default_value = "16K", value_parser = parse_size)]
    pub mean_append_bytes: u64,
    /// Percentage of entries created and filled before the timed phase.
    #[arg(long, default_value_t = 80)]
    pub prealloc_percent: u64,
    /// fsync after writewholefile and appendfilerand (timed as part of them).
    #[arg(long)]
    pub fsync: bool,
    /// Seed of file sizes, preallocated entries, picks and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave the fileset in place after the run (default: remove it, timed).
    #[arg(long)]
    pub keep: bool,
}

/// The eleven flowops of one loop, in order; names as in `fileserver.f`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flow {
    Create,
    WriteWhole,
    Close1,
    Open1,
    Append,
    Close2,
    Open2,
    ReadWhole,
    Close3,
    Delete,
    Stat,
}

const FLOWS: [Flow; 11] = [
    Flow::Create,
    Flow::WriteWhole,
    Flow::Close1,
    Flow::Open1,
    Flow::Append,
    Flow::Close2,
    Flow::Open2,
    Flow::ReadWhole,
    Flow::Close3,
    Flow::Delete,
    Flow::Stat,
];

impl Flow {
    /// (flowop name in fileserver.f, flowop type)
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Flow::Create => ("createfile1", "createfile"),
            Flow::WriteWhole => ("wrtfile1", "writewholefile"),
            Flow::Close1 => ("closefile1", "closefile"),
            Flow::Open1 => ("openfile1", "openfile"),
            Flow::Append => ("appendfilerand1", "appendfilerand"),
            Flow::Close2 => ("closefile2", "closefile"),
            Flow::Open2 => ("openfile2", "openfile"),
            Flow::ReadWhole => ("readfile1", "readwholefile"),
            Flow::Close3 => ("closefile3", "closefile"),
            Flow::Delete => ("deletefile1", "deletefile"),
            Flow::Stat => ("statfile1", "statfile"),
        }
    }
}

/// Groups of flowops that need an entry, for the skipped counts.
const GROUPS: [&str; 5] = ["create", "append", "read", "delete", "stat"];

/// Maps entry indices to paths (see the module header).
struct Layout {
    root: PathBuf,
    width: u64,
    /// Directory levels between the root and the files.
    levels: u32,
    leaves: u64,
}

impl Layout {
    fn new(root: PathBuf, entries: u64, width: u64) -> Self {
        let leaves = entries.div_ceil(width).max(1);
        let (mut levels, mut cap) = (0u32, 1u64);
        while cap < leaves {
            cap = cap.saturating_mul(width);
            levels += 1;
        }
        Self {
            root,
            width,
            levels,
            leaves,
        }
    }

    /// Writes the directory of leaf `leaf`, down to `depth` levels, into `out`.
    fn dir_path(&self, leaf: u64, depth: u32, out: &mut OsString, num: &mut String) {
        out.clear();
        out.push(self.root.as_os_str());
        for l in (self.levels - depth..self.levels).rev() {
            let digit = (leaf / self.width.pow(l)) % self.width;
            num.clear();
            let _ = write!(num, "/d{digit}");
            out.push(&*num);
        }
    }

    fn entry_path(&self, entry: u32, out: &mut OsString, num: &mut String) {
        let e = u64::from(entry);
        self.dir_path(e / self.width, self.levels, out, num);
        num.clear();
        let _ = write!(num, "/f{}", e % self.width);
        out.push(&*num);
    }

    /// Creates the root and every directory; returns how many directories that made.
    fn create_dirs(&self) -> anyhow::Result<u64> {
        std::fs::create_dir(&self.root)
            .with_context(|| format!("creating {}", self.root.display()))?;
        let (mut made, mut p, mut num) = (1u64, OsString::new(), String::new());
        for leaf in 0..self.leaves {
            // A leaf is the first child of its ancestor at depth d exactly when its digits
            // below that level are zero; then the ancestor does not exist yet.
            for depth in 1..=self.levels {
                if leaf % self.width.pow(self.levels - depth) == 0 {
                    self.dir_path(leaf, depth, &mut p, &mut num);
                    std::fs::create_dir(&p)
                        .with_context(|| format!("creating {}", Path::new(&p).display()))?;
                    made += 1;
                }
            }
        }
        Ok(made)
    }
}

/// Uniform in (0, 1).
fn unit(r: &mut SplitMix64) -> f64 {
    ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Standard normal (Box-Muller).
fn normal(r: &mut SplitMix64) -> f64 {
    let (u1, u2) = (unit(r), unit(r));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Gamma(shape, scale) by Marsaglia and Tsang's method (shape < 1 by the boost
/// Gamma(k) = Gamma(k + 1) * U^(1/k)).
fn gamma(r: &mut SplitMix64, shape: f64, scale: f64) -> f64 {
    if shape < 1.0 {
        let u = unit(r);
        return gamma(r, shape + 1.0, scale) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(r);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = unit(r);
        if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
            return d * v * scale;
        }
    }
}

/// One shard's entries that are not busy. Aligned so shards do not share cache lines.
#[repr(align(128))]
struct Shard(Mutex<Lists>);

#[derive(Default)]
struct Lists {
    exists: Vec<u32>,
    absent: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Exists,
    Absent,
}

struct EntrySet {
    shards: Vec<Shard>,
    /// Size of each entry's file when createfile writes it, fixed at setup.
    sizes: Vec<u32>,
}

impl EntrySet {
    /// Takes a random entry of the wanted kind out of its list (the caller now owns it
    /// until `put`); None when there is none anywhere.
    fn take(&self, want: Want, r: &mut SplitMix64) -> Option<u32> {
        let n = self.shards.len();
        let start = r.below(n as u64) as usize;
        for k in 0..n {
            let mut g = self.shards[(start + k) % n].0.lock();
            let list = match want {
                Want::Exists => &mut g.exists,
                Want::Absent => &mut g.absent,
            };
            if !list.is_empty() {
                let i = r.below(list.len() as u64) as usize;
                return Some(list.swap_remove(i));
            }
        }
        None
    }

    /// Returns an entry taken with `take`, now existing or absent.
    fn put(&self, entry: u32, exists: bool) {
        let mut g = self.shards[entry as usize % self.shards.len()].0.lock();
        if exists {
            g.exists.push(entry);
        } else {
            g.absent.push(entry);
        }
    }

    fn existing(&self) -> Vec<u32> {
        let mut v: Vec<u32> = Vec::new();
        for s in &self.shards {
            v.extend_from_slice(&s.0.lock().exists);
        }
        v.sort_unstable();
        v
    }
}

/// What one worker counted.
struct Stats {
    hist: Vec<Histogram<u64>>,
    sum_ns: [u64; 11],
    bytes: [u64; 11],
    skipped: [u64; 5],
}

impl Stats {
    fn new() -> Self {
        Self {
            hist: FLOWS.iter().map(|_| latency_histogram()).collect(),
            sum_ns: [0; 11],
            bytes: [0; 11],
            skipped: [0; 5],
        }
    }

    fn rec(&mut self, f: Flow, since: Instant, bytes: u64) {
        let ns = since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        let i = f as usize;
        record_ns(&mut self.hist[i], ns);
        self.sum_ns[i] += ns;
        self.bytes[i] += bytes;
    }

    fn merge(&mut self, o: &Stats) {
        for i in 0..FLOWS.len() {
            // Same bounds on both sides, so adding cannot fail.
            let _ = self.hist[i].add(&o.hist[i]);
            self.sum_ns[i] += o.sum_ns[i];
            self.bytes[i] += o.bytes[i];
        }
        for (a, b) in self.skipped.iter_mut().zip(o.skipped) {
            *a += b;
        }
    }

    fn count(&self, f: Flow) -> u64 {
        self.hist[f as usize].len()
    }
}

/// Shared, read-only state of the run.
struct Ctx<'a> {
    layout: &'a Layout,
    set: &'a EntrySet,
    iosize: usize,
    mean_append_bytes: u64,
    fsync: bool,
    deadline: Instant,
    abort: &'a AtomicBool,
}

/// Writes `size` bytes from `buf` in `buf.len()`-sized writes; returns `size`.
fn write_whole(f: &mut File, size: u64, buf: &[u8]) -> std::io::Result<u64> {
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(size)
}

/// Reads `f` to its end in `buf.len()`-sized reads; returns the bytes read.
fn read_whole(f: &mut File, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut total = 0u64;
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One open-operate-close sequence of the personality, each step timed as its own flowop
/// (`steps`: open, operation, close). The operation returns the bytes it moved; with
/// `--fsync` the file is fsync'ed inside the operation's timing.
fn open_op_close(
    ctx: &Ctx,
    st: &mut Stats,
    p: &OsString,
    how: &OpenOptions,
    steps: [(Flow, &str); 3],
    op: impl FnOnce(&mut std::fs::File) -> std::io::Result<u64>,
) -> anyhow::Result<()> {
    let [(open_flow, open_name), (op_flow, op_name), (close_flow, close_name)] = steps;
    let path = Path::new(p);
    let t = Instant::now();
    let mut f = how
        .open(p)
        .with_context(|| format!("{open_name}: {}", path.display()))?;
    st.rec(open_flow, t, 0);
    let t = Instant::now();
    let n = op(&mut f).with_context(|| format!("{op_name}: {}", path.display()))?;
    if ctx.fsync {
        fsync(&f, path, op_name)?;
    }
    st.rec(op_flow, t, n);
    let t = Instant::now();
    close_checked(f, path, close_name)?;
    st.rec(close_flow, t, 0);
    Ok(())
}

fn worker(ctx: &Ctx, seed: u64) -> anyhow::Result<Stats> {
    let mut r = SplitMix64::new(seed);
    let mut buf = vec![0u8; ctx.iosize];
    r.fill(&mut buf);
    let (mut p, mut num) = (OsString::new(), String::new());
    let mut st = Stats::new();
    let stop = || Instant::now() >= ctx.deadline || ctx.abort.load(Ordering::Relaxed);
    let ctx_err = |op: &str, p: &OsString| format!("{op}: {}", Path::new(p).display());
    let mut open_rw = OpenOptions::new();
    open_rw.read(true).write(true);
    while !stop() {
        // createfile1, wrtfile1, closefile1
        match ctx.set.take(Want::Absent, &mut r) {
            Some(e) => {
                ctx.layout.entry_path(e, &mut p, &mut num);
                let size = u64::from(ctx.set.sizes[e as usize]);
                let mut create = OpenOptions::new();
                create.write(true).create_new(true);
                let steps = [
                    (Flow::Create, "createfile1"),
                    (Flow::WriteWhole, "wrtfile1"),
                    (Flow::Close1, "closefile1"),
                ];
                open_op_close(ctx, &mut st, &p, &create, steps, |f| {
                    write_whole(f, size, &buf)
                })?;
                ctx.set.put(e, true);
            }
            None => st.skipped[0] += 1,
        }
        if stop() {
            break;
        }
        // openfile1, appendfilerand1, closefile2
        match ctx.set.take(Want::Exists, &mut r) {
            Some(e) => {
                ctx.layout.entry_path(e, &mut p, &mut num);
                let size = 1 + r.below(2 * ctx.mean_append_bytes);
                let steps = [
                    (Flow::Open1, "openfile1"),
                    (Flow::Append, "appendfilerand1"),
                    (Flow::Close2, "closefile2"),
                ];
                open_op_close(ctx, &mut st, &p, &open_rw, steps, |f| {
                    f.seek(SeekFrom::End(0))?;
                    write_whole(f, size, &buf)
                })?;
                ctx.set.put(e, true);
            }
            None => st.skipped[1] += 1,
        }
        if stop() {
            break;
        }
        // openfile2, readfile1, closefile3
        match ctx.set.take(Want::Exists, &mut r) {
            Some(e) => {
                ctx.layout.entry_path(e, &mut p, &mut num);
                let steps = [
                    (Flow::Open2, "openfile2"),
                    (Flow::ReadWhole, "readfile1"),
                    (Flow::Close3, "closefile3"),
                ];
                open_op_close(ctx, &mut st, &p, &open_rw, steps, |f| {
                    read_whole(f, &mut buf)
                })?;
                ctx.set.put(e, true);
            }
            None => st.skipped[2] += 1,
        }
        if stop() {
            break;
        }
        // deletefile1
        match ctx.set.take(Want::Exists, &mut r) {
            Some(e) => {
                ctx.layout.entry_path(e, &mut p, &mut num);
                let t = Instant::now();
                std::fs::remove_file(&p).with_context(|| ctx_err("deletefile1", &p))?;
                st.rec(Flow::Delete, t, 0);
                ctx.set.put(e, false);
            }
            None => st.skipped[3] += 1,
        }
        if stop() {
            break;
        }
        // statfile1
        match ctx.set.take(Want::Exists, &mut r) {
            Some(e) => {
                ctx.layout.entry_path(e, &mut p, &mut num);
                let t = Instant::now();
                std::fs::metadata(&p).with_context(|| ctx_err("statfile1", &p))?;
                st.rec(Flow::Stat, t, 0);
                ctx.set.put(e, true);
            }
            None => st.skipped[4] += 1,
        }
    }
    Ok(st)
}

/// Runs `f(i)` for every `i` in `0..n` on `threads` threads (a shared counter hands out
/// indices); stops at the first error and returns it.
fn parallel_each<F>(n: usize, threads: usize, f: F) -> anyhow::Result<()>
where
    F: Fn(usize, &mut OsString, &mut String) -> anyhow::Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let (mut p, mut num) = (OsString::new(), String::new());
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if let Err(e) = f(i, &mut p, &mut num) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a setup thread panicked"))
            })
            .collect()
    });
    results.into_iter().collect()
}

fn check(a: &FileserverArgs) -> anyhow::Result<()> {
    ensure!(
        (1..=FILES_MAX).contains(&a.files),
        "--files must be 1..={FILES_MAX}"
    );
    ensure!(
        (1..=THREADS_MAX).contains(&a.threads),
        "--threads must be 1..={THREADS_MAX}"
    );
    ensure!(
        a.secs > 0.0 && a.secs <= SECS_MAX,
        "--secs must be > 0 and <= {SECS_MAX}"
    );
    ensure!(
        (1..=MEAN_FILE_BYTES_MAX).contains(&a.mean_file_bytes),
        "--mean-file-bytes must be 1..={MEAN_FILE_BYTES_MAX}"
    );
    ensure!(
        (DIR_WIDTH_MIN..=DIR_WIDTH_MAX).contains(&a.dir_width),
        "--dir-width must be {DIR_WIDTH_MIN}..={DIR_WIDTH_MAX}"
    );
    ensure!(
        (1..=IOSIZE_MAX).contains(&a.iosize),
        "--iosize must be 1..={IOSIZE_MAX}"
    );
    ensure!(
        (1..=MEAN_APPEND_BYTES_MAX).contains(&a.mean_append_bytes),
        "--mean-append-bytes must be 1..={MEAN_APPEND_BYTES_MAX}"
    );
    ensure!(
        a.prealloc_percent <= 100,
        "--prealloc-percent must be 0..=100"
    );
    ensure!(
        a.dir.is_dir(),
        "--dir {} is not a directory",
        a.dir.display()
    );
    Ok(())
}

pub fn run(a: FileserverArgs) -> anyhow::Result<()> {
    check(&a)?;
    let root = a.dir.join(ROOT_NAME);
    if root.symlink_metadata().is_ok() {
        bail!(
            "{} already exists (left by a run with --keep or one that failed); remove it \
             or choose another --dir",
            root.display()
        );
    }
    let r = run_in(&a, &root);
    if r.is_err() && !a.keep && root.symlink_metadata().is_ok() {
        if let Err(e) = std::fs::remove_dir_all(&root) {
            return r.with_context(|| format!("and removing {} failed: {e}", root.display()));
        }
    }
    r
}

fn run_in(a: &FileserverArgs, root: &Path) -> anyhow::Result<()> {
    let files = a.files as usize;
    let layout = Layout::new(root.to_path_buf(), a.files, a.dir_width);
    let mut r = SplitMix64::new(a.seed);

    // The fileset: sizes, and which entries are preallocated (a random subset).
    let scale = a.mean_file_bytes as f64 / GAMMA_SHAPE;
    let sizes: Vec<u32> = (0..files)
        .map(|_| {
            gamma(&mut r, GAMMA_SHAPE, scale)
                .round()
                .min(FILE_BYTES_MAX as f64) as u32
        })
        .collect();
    let mut order: Vec<u32> = (0..a.files as u32).collect();
    let prealloc_files = (a.files * a.prealloc_percent / 100) as usize;
    for i in 0..prealloc_files {
        let j = i + r.below((files - i) as u64) as usize;
        order.swap(i, j);
    }
    let (pre, rest) = order.split_at_mut(prealloc_files);
    pre.sort_unstable(); // create in directory order, as a real tree would be filled
    let (pre, rest): (&[u32], &[u32]) = (pre, rest);
    let nshards = (a.threads * SHARDS_PER_THREAD).min(SHARDS_MAX).min(files);
    let mut lists: Vec<Lists> = (0..nshards).map(|_| Lists::default()).collect();
    for &e in pre.iter() {
        lists[e as usize % nshards].exists.push(e);
    }
    for &e in rest.iter() {
        lists[e as usize % nshards].absent.push(e);
    }
    let set = EntrySet {
        shards: lists.into_iter().map(|l| Shard(Mutex::new(l))).collect(),
        sizes,
    };
    let prealloc_bytes: u64 = pre.iter().map(|&e| u64::from(set.sizes[e as usize])).sum();

    // Preallocation (untimed for the result, reported on its own).
    let setup_threads = a.threads.min(SETUP_THREADS_MAX);
    let t = Instant::now();
    let dirs = layout.create_dirs()?;
    let mkdir_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let fill = vec![0x5Au8; a.iosize as usize];
    parallel_each(pre.len(), setup_threads, |i, p, num| {
        let e = pre[i];
        layout.entry_path(e, p, num);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&*p)
            .with_context(|| format!("prealloc: create {}", Path::new(p).display()))?;
        write_whole(&mut f, u64::from(set.sizes[e as usize]), &fill)
            .with_context(|| format!("prealloc: write {}", Path::new(p).display()))?;
        close_checked(f, Path::new(p), "prealloc")
    })?;
    let prealloc_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    syncfs(root)?;
    let prealloc_sync_secs = t.elapsed().as_secs_f64();

    // The timed phase.
    let abort = AtomicBool::new(false);
    let start = Instant::now();
    let ctx = Ctx {
        layout: &layout,
        set: &set,
        iosize: a.iosize as usize,
        mean_append_bytes: a.mean_append_bytes,
        fsync: a.fsync,
        deadline: start + Duration::from_secs_f64(a.secs),
        abort: &abort,
    };
    let results: Vec<anyhow::Result<Stats>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.threads)
            .map(|t| {
                let (ctx, abort) = (&ctx, &abort);
                let seed = a.seed ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                s.spawn(move || {
                    let r = worker(ctx, seed);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a worker thread panicked"))
            })
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut total = Stats::new();
    let failed = results.iter().filter(|r| r.is_err()).count();
    for res in results {
        match res {
            Ok(st) => total.merge(&st),
            Err(e) => {
                return Err(e.context(format!(
                    "fileserver aborted ({failed} of {} threads failed)",
                    a.threads
                )))
            }
        }
    }

    // Accounting: every entry is back in a list.
    let existing = set.existing();
    let created = total.count(Flow::Create);
    let deleted = total.count(Flow::Delete);
    ensure!(
        existing.len() as u64 + deleted == prealloc_files as u64 + created,
        "entry accounting is off: {} exist at the end, {prealloc_files} preallocated, \
         {created} created, {deleted} deleted",
        existing.len()
    );

    let cleanup_secs = if a.keep {
        None
    } else {
        let t = Instant::now();
        parallel_each(existing.len(), setup_threads, |i, p, num| {
            layout.entry_path(existing[i], p, num);
            std::fs::remove_file(&*p)
                .with_context(|| format!("cleanup: unlink {}", Path::new(p).display()))
        })?;
        std::fs::remove_dir_all(root)
            .with_context(|| format!("cleanup: removing {}", root.display()))?;
        Some(t.elapsed().as_secs_f64())
    };

    let ops: u64 = FLOWS.iter().map(|&f| total.count(f)).sum();
    let read_bytes = total.bytes[Flow::ReadWhole as usize];
    let written_bytes = total.bytes[Flow::WriteWhole as usize] + total.bytes[Flow::Append as usize];
    let mib_s = |b: u64| r3(b as f64 / MIB as f64 / elapsed);
    let mut flowops = serde_json::Map::new();
    for f in FLOWS {
        let h = &total.hist[f as usize];
        let n = h.len();
        let us = |ns: u64| r3(ns as f64 / 1000.0);
        let mean_us = if n == 0 {
            0.0
        } else {
            r3(total.sum_ns[f as usize] as f64 / n as f64 / 1000.0)
        };
        let (name, kind) = f.names();
        flowops.insert(
            name.into(),
            json!({
                "op": kind,
                "ops": n,
                "ops_per_sec": r3(n as f64 / elapsed),
                "bytes": total.bytes[f as usize],
                "mib_per_sec": mib_s(total.bytes[f as usize]),
                "mean_us": mean_us,
                "p50_us": us(h.value_at_quantile(0.5)),
                "p99_us": us(h.value_at_quantile(0.99)),
                "max_us": us(h.max()),
            }),
        );
    }
    let skipped: serde_json::Map<String, serde_json::Value> = GROUPS
        .iter()
        .zip(total.skipped)
        .map(|(g, n)| (String::from(*g), json!(n)))
        .collect();
    let ops_per_sec = ops as f64 / elapsed;
    let out = json!({
        "benchmark": "fileserver",
        "dir": a.dir.display().to_string(),
        "root": root.display().to_string(),
        "config": {
            "files": a.files,
            "threads": a.threads,
            "secs": a.secs,
            "mean_file_bytes": a.mean_file_bytes,
            "gamma_shape": GAMMA_SHAPE,
            "dir_width": a.dir_width,
            "iosize_bytes": a.iosize,
            "mean_append_bytes": a.mean_append_bytes,
            "prealloc_percent": a.prealloc_percent,
            "fsync": a.fsync,
            "seed": a.seed,
            "keep": a.keep,
        },
        "dirs": dirs,
        "dir_levels": layout.levels,
        "mkdir_secs": r6(mkdir_secs),
        "prealloc_files": prealloc_files,
        "prealloc_bytes": prealloc_bytes,
        "prealloc_secs": r6(prealloc_secs),
        "prealloc_sync_secs": r6(prealloc_sync_secs),
        "elapsed_secs": r6(elapsed),
        "ops": ops,
        "ops_per_sec": r3(ops_per_sec),
        "read_bytes": read_bytes,
        "written_bytes": written_bytes,
        "read_mib_per_sec": mib_s(read_bytes),
        "write_mib_per_sec": mib_s(written_bytes),
        "flowops": flowops,
        "skipped": skipped,
        "files_start": prealloc_files,
        "files_created": created,
        "files_deleted": deleted,
        "files_end": existing.len(),
        "errors": 0,
        "kept": a.keep,
        "cleanup_secs": cleanup_secs.map(r6),
    });
    let summary = format!(
        "fileserver: {ops_per_sec:.0} ops/s ({ops} ops in {elapsed:.1} s, {} threads), \
         read {:.1} MiB/s, write {:.1} MiB/s, files {prealloc_files} -> {}, prealloc \
         {prealloc_secs:.1} s, cleanup {}",
        a.threads,
        mib_s(read_bytes),
        mib_s(written_bytes),
        existing.len(),
        cleanup_secs.map_or(String::from("skipped (--keep)"), |s| format!("{s:.1} s")),
    );
    emit(&out, &summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_has_the_asked_mean_and_variance() {
        let mut r = SplitMix64::new(3);
        let (k, theta) = (GAMMA_SHAPE, 131072.0 / GAMMA_SHAPE);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| gamma(&mut r, k, theta)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean / (k * theta) - 1.0).abs() < 0.02, "mean {mean}");
        assert!((var / (k * theta * theta) - 1.0).abs() < 0.05, "var {var}");
        assert!(xs.iter().all(|&x| x > 0.0));
        // shape < 1 takes the boost path
        let ys: Vec<f64> = (0..n).map(|_| gamma(&mut r, 0.5, 2.0)).collect();
        let m = ys.iter().sum::<f64>() / n as f64;
        assert!((m - 1.0).abs() < 0.03, "mean {m}");
    }

    #[test]
    fn layout_gives_distinct_paths_and_bounded_dirs() {
        use std::collections::{HashMap, HashSet};
        for (entries, width) in [(1u64, 20u64), (20, 20), (21, 20), (401, 20), (1000, 3)] {
            let l = Layout::new(PathBuf::from("/r"), entries, width);
            let (mut p, mut num) = (OsString::new(), String::new());
            let mut children: HashMap<PathBuf, HashSet<PathBuf>> = HashMap::new();
            for e in 0..entries as u32 {
                l.entry_path(e, &mut p, &mut num);
                let path = PathBuf::from(&p);
                // "/", "r", one component per level, the file
                assert_eq!(path.components().count(), l.levels as usize + 3);
                let mut d = path.as_path();
                while let Some(parent) = d.parent() {
                    children
                        .entry(parent.to_path_buf())
                        .or_default()
                        .insert(d.to_path_buf());
                    d = parent;
                }
            }
            let files: usize = children
                .iter()
                .filter(|(_, c)| c.iter().any(|f| f.to_string_lossy().contains("/f")))
                .map(|(_, c)| c.len())
                .sum();
            assert_eq!(files as u64, entries, "paths are not distinct");
            for (dir, c) in &children {
                if dir.as_path() != Path::new("/") {
                    assert!(c.len() as u64 <= width, "{} has {}", dir.display(), c.len());
                }
            }
        }
    }

    #[test]
    fn shards_hand_out_each_entry_once() {
        let mut lists: Vec<Lists> = (0..4).map(|_| Lists::default()).collect();
        for e in 0..40u32 {
            let l = &mut lists[e as usize % 4];
            if e % 2 == 0 {
                l.exists.push(e);
            } else {
                l.absent.push(e);
            }
        }
        let set = EntrySet {
            shards: lists.into_iter().map(|l| Shard(Mutex::new(l))).collect(),
            sizes: vec![0; 40],
        };
        let mut r = SplitMix64::new(9);
        let mut got: Vec<u32> = std::iter::from_fn(|| set.take(Want::Exists, &mut r)).collect();
        got.sort_unstable();
        assert_eq!(got, (0..40).step_by(2).collect::<Vec<u32>>());
        assert!(set.take(Want::Exists, &mut r).is_none());
        set.put(4, true);
        assert_eq!(set.existing(), vec![4]);
    }
}
