//! `dhrd replay`: replays a public block I/O trace (SPC, MSR Cambridge or DiskSim ASCII)
//! against a regular file or block device, measures IOPS and latency percentiles, and can
//! verify every read of replayed data against a shadow of what the replay wrote.
//!
//! Invariants:
//! - Offsets are folded into the target: `offset mod span`, aligned down to the I/O
//!   alignment (512 bytes buffered, 4096 with `--direct`), and a request crossing the end
//!   is clipped, so every issued request lies inside `[0, span)`. `span` is the target size
//!   aligned down to the alignment. With `--direct` lengths are rounded up to 4096. All
//!   trace devices/ASUs share the one target address space.
//! - Trace times are made relative to the first kept record; a record earlier than the
//!   first is dispatched at time zero (never an underflow).
//! - With `--verify`, write `i` writes `pattern(i, absolute offset)`, so expected content is
//!   a pure function of (writer index, offset) and the shadow only stores which writer last
//!   wrote each byte range. Only bytes written by this run are checked: the target's prior
//!   content is unknown.
//! - With `--verify`, a request never runs concurrently with an earlier overlapping request
//!   if either is a write (ordered range locks in trace order). So every checked read sees
//!   exactly the writes that precede it in the trace, whatever the queue depth; and the
//!   shadow is updated before the write's range is released.
//! - Latencies cover only the system calls (pread/pwrite, plus fdatasync with
//!   `--fsync-writes`), or with `--nbd` the request's round trip (plus NBD_CMD_FLUSH);
//!   pattern generation and verification are outside them.
//! - With `--nbd` every worker has its own connection, and requests are aligned as with
//!   `--direct`, as a block device's consumer would send them.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dhrd_nbd::client::Client;

/// Requests one replay holds in memory at most (after --repeat): 32 bytes each.
pub const MAX_REPLAY_REQUESTS: u64 = 1 << 24;
/// Trace LBAs (SPC, DiskSim) count 512-byte sectors; buffered replay aligns to this too.
pub const SECTOR_BYTES: u64 = 512;
/// O_DIRECT alignment of offsets, lengths and buffers (the common logical block size).
pub const DIRECT_ALIGN: u64 = dhrd_io::DIRECT_ALIGN_BYTES as u64;
/// A single trace request larger than this is treated as a malformed line (real traces
/// stay far below; it also bounds each worker's buffer).
pub const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Upper bound on `--queue-depth` (one thread per outstanding request).
pub const MAX_QUEUE_DEPTH: usize = 1024;
/// Mismatches reported in detail (all are counted).
const MAX_REPORTED_MISMATCHES: usize = 8;
/// Highest latency the histograms track: one hour in nanoseconds.
const HIST_MAX_NS: u64 = 3_600_000_000_000;
/// Significant digits of the latency histograms.
const HIST_SIGFIG: u8 = 3;
/// Requests started later than this in original timing are counted as "late".
const LATE_THRESHOLD: Duration = Duration::from_millis(1);
/// Windows filetime ticks (MSR timestamps) are 100 ns.
const FILETIME_TICK_NS: u128 = 100;
/// Seed mixed into the verify pattern so it is unlikely to match any pre-existing content.
const PATTERN_SEED: u64 = 0x6468_7264_7265_706c; // "dhrdrepl"

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TraceFormat {
    /// SPC: ASU,LBA,Size,Opcode,Timestamp (LBA in sectors, Size in bytes, seconds).
    Spc,
    /// MSR Cambridge: Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime.
    Msr,
    /// DiskSim ASCII: time_ns device lba_sectors size_sectors type (1 = read, 0 = write).
    Disksim,
    /// Detect from the first record.
    Auto,
}

impl TraceFormat {
    fn name(self) -> &'static str {
        match self {
            TraceFormat::Spc => "spc",
            TraceFormat::Msr => "msr",
            TraceFormat::Disksim => "disksim",
            TraceFormat::Auto => "auto",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Timing {
    /// Issue as fast as possible with --queue-depth requests outstanding.
    Fast,
    /// Honour the trace's arrival times (divided by --speedup).
    Original,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file.
    #[arg(long)]
    pub trace: PathBuf,
    /// Trace format; auto detects it from the first record.
    #[arg(long, value_enum, default_value = "auto")]
    pub format: TraceFormat,
    /// Target: a regular file (created/extended with --size) or a block device.
    #[arg(long, required_unless_present = "nbd", conflicts_with = "nbd")]
    pub target: Option<PathBuf>,
    /// Target: the default export of an NBD server on this Unix socket (dhrd nbd, nbdkit,
    /// qemu-nbd), one connection per worker; --size may narrow the span.
    #[arg(long, value_name = "SOCKET")]
    pub nbd: Option<PathBuf>,
    /// Also report the share of requests that completed in under this many microseconds
    /// (a cache-hit measure when a miss costs more, as on a slow lower tier).
    #[arg(long, value_name = "US")]
    pub fast_below_us: Option<u64>,
    /// Size of the target span (e.g. 1G); a regular file is created or extended to it.
    /// Default: the target's current size. Trace offsets are folded into this span: offset
    /// mod span, aligned down (512, or 4096 with --direct), clipped at the end.
    #[arg(long, value_parser = dhrd_engine::parse_size)]
    pub size: Option<u64>,
    /// Open the target with O_DIRECT (offsets aligned, lengths rounded up to 4096).
    #[arg(long)]
    pub direct: bool,
    /// fdatasync after every write (the durable-write comparison).
    #[arg(long)]
    pub fsync_writes: bool,
    /// fast: as fast as possible; original: at the trace's times divided by --speedup.
    #[arg(long, value_enum, default_value = "fast")]
    pub timing: Timing,
    /// Divide the trace's inter-arrival times by this (original timing).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Outstanding requests (worker threads).
    #[arg(long, default_value_t = 1)]
    pub queue_depth: usize,
    /// Check every read of bytes this replay wrote against a shadow copy.
    #[arg(long)]
    pub verify: bool,
    /// Replay only the first N requests (zero-size records do not count).
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Replay the whole trace this many times in a row (short traces otherwise finish in
    /// milliseconds, too short to measure); with original timing each pass starts where the
    /// previous one ended.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Skip malformed lines (counted) instead of failing.
    #[arg(long)]
    pub skip_bad: bool,
    /// Write the folded requests (after --max-requests and --repeat) to this file, one
    /// `R|W offset length` line each, and exit without issuing any I/O: what a benchmark
    /// needs to place data before a replay, folded exactly as the replay folds it.
    #[arg(long, value_name = "FILE")]
    pub write_plan: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

mod trace;
mod verify;
pub use trace::*;
use verify::*;

// ---------------------------------------------------------------------------------------
// Replay

/// A buffer whose usable slice starts at a `DIRECT_ALIGN` boundary (for O_DIRECT), made
/// by over-allocating a plain Vec instead of using a custom allocator.
struct AlignedBuf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let align = DIRECT_ALIGN as usize;
        let v = vec![0u8; len + align];
        let start = (align - v.as_ptr() as usize % align) % align;
        AlignedBuf { v, start, len }
    }
    fn slice(&mut self, n: usize) -> &mut [u8] {
        debug_assert!(n <= self.len);
        &mut self.v[self.start..self.start + n]
    }
}

fn new_hist() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, HIST_SIGFIG).context("creating a histogram")
}

struct WorkerStats {
    read_lat: Histogram<u64>,
    write_lat: Histogram<u64>,
    lateness: Histogram<u64>,
    late: u64,
    read_bytes: u64,
    write_bytes: u64,
}

impl WorkerStats {
    fn new() -> Result<Self> {
        Ok(WorkerStats {
            read_lat: new_hist()?,
            write_lat: new_hist()?,
            lateness: new_hist()?,
            late: 0,
            read_bytes: 0,
            write_bytes: 0,
        })
    }
    fn merge(&mut self, o: &WorkerStats) -> Result<()> {
        self.read_lat
            .add(&o.read_lat)
            .context("merging histograms")?;
        self.write_lat
            .add(&o.write_lat)
            .context("merging histograms")?;
        self.lateness
            .add(&o.lateness)
            .context("merging histograms")?;
        self.late += o.late;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        Ok(())
    }
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let ns = u64::try_from(d.as_nanos())
        .unwrap_or(u64::MAX)
        .clamp(1, HIST_MAX_NS);
    h.saturating_record(ns);
}

/// Where the requests go.
enum Io<'a> {
    File(&'a File),
    Nbd(&'a Path),
}

/// One worker's handle on the target.
enum Conn<'a> {
    File(&'a File),
    Nbd(Client),
}

impl Io<'_> {
    fn connect(&self) -> Result<Conn<'_>> {
        Ok(match self {
            Io::File(f) => Conn::File(f),
            Io::Nbd(p) => Conn::Nbd(
                Client::connect(p).with_context(|| format!("connecting to {}", p.display()))?,
            ),
        })
    }
}

impl Conn<'_> {
    fn write(&mut self, b: &[u8], offset: u64, sync: bool) -> std::io::Result<()> {
        match self {
            Conn::File(f) => {
                f.write_all_at(b, offset)?;
                if sync {
                    f.sync_data()?;
                }
                Ok(())
            }
            Conn::Nbd(c) => {
                c.write(offset, b, false).map_err(nbd_io)?;
                if sync {
                    c.flush().map_err(nbd_io)?;
                }
                Ok(())
            }
        }
    }

    fn read(&mut self, b: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Conn::File(f) => f.read_exact_at(b, offset),
            Conn::Nbd(c) => {
                let len = u32::try_from(b.len()).map_err(std::io::Error::other)?;
                let data = c.read(offset, len).map_err(nbd_io)?;
                if data.len() != b.len() {
                    return Err(std::io::Error::other(format!(
                        "NBD read returned {} of {} bytes",
                        data.len(),
                        b.len()
                    )));
                }
                b.copy_from_slice(&data);
                Ok(())
            }
        }
    }
}

fn nbd_io(e: dhrd_nbd::NbdError) -> std::io::Error {
    match e {
        dhrd_nbd::NbdError::Io(e) => e,
        dhrd_nbd::NbdError::Errno(n) => std::io::Error::from_raw_os_error(n),
        e => std::io::Error::other(e.to_string()),
    }
}

struct Shared<'a> {
    io: Io<'a>,
    reqs: &'a [Request],
    verify: Option<Verifier>,
    order: Option<RangeOrder>,
    fsync_writes: bool,
    direct: bool,
    stop: AtomicBool,
    cursor: AtomicUsize,
    error: Mutex<Option<String>>,
}

impl Shared<'_> {
    fn fail(&self, msg: String) {
        let mut g = lock(&self.error);
        if g.is_none() {
            *g = Some(msg);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Executes request `i` with the worker's buffer, recording its latency.
    fn execute(&self, i: usize, conn: &mut Conn<'_>, buf: &mut AlignedBuf, st: &mut WorkerStats) {
        let r = self.reqs[i];
        let b = buf.slice(r.len as usize);
        let res = match r.op {
            Op::Write => {
                if self.verify.is_some() {
                    fill_pattern(b, i as u64, r.offset);
                }
                let t = Instant::now();
                let res = conn.write(b, r.offset, self.fsync_writes);
                record(&mut st.write_lat, t.elapsed());
                st.write_bytes += r.len;
                if let (Ok(()), Some(v)) = (&res, &self.verify) {
                    lock(&v.map).insert(r.offset, r.offset + r.len, i as u64);
                }
                res
            }
            Op::Read => {
                let t = Instant::now();
                let res = conn.read(b, r.offset);
                record(&mut st.read_lat, t.elapsed());
                st.read_bytes += r.len;
                if let (Ok(()), Some(v)) = (&res, &self.verify) {
                    let (mm, checked) = check_read(&lock(&v.map), b, r.offset, i);
                    if checked > 0 {
                        v.checked_reads.fetch_add(1, Ordering::Relaxed);
                        v.checked_bytes.fetch_add(checked, Ordering::Relaxed);
                    }
                    if !mm.is_empty() {
                        v.mismatch_count
                            .fetch_add(mm.len() as u64, Ordering::Relaxed);
                        let mut g = lock(&v.mismatches);
                        let room = MAX_REPORTED_MISMATCHES.saturating_sub(g.len());
                        g.extend(mm.into_iter().take(room));
                    }
                }
                res
            }
        };
        if let Err(e) = res {
            let hint = if self.direct && e.raw_os_error() == Some(libc::EINVAL) {
                " (the file system may refuse O_DIRECT)"
            } else {
                ""
            };
            self.fail(format!(
                "request {i} ({:?} of {} bytes at folded offset {}): {e}{hint}",
                r.op, r.len, r.offset
            ));
        }
    }
}

struct Target {
    /// `None` for an NBD export (each worker connects itself).
    file: Option<File>,
    span: u64,
    kind: &'static str,
    name: String,
}

/// Sizes the export behind `sock`; the span is --size (at most the export) or the export's
/// size, aligned down to `align`.
fn open_nbd_target(sock: &Path, size: Option<u64>, align: u64) -> Result<Target> {
    let c = Client::connect(sock).with_context(|| format!("connecting to {}", sock.display()))?;
    let export = c.size;
    // A polite goodbye; the export's size is all this connection was for.
    let _ = c.disconnect();
    let raw = match size {
        Some(s) if s > export => bail!("--size {s} exceeds the NBD export's {export} bytes"),
        Some(s) => s,
        None => export,
    };
    let span = raw / align * align;
    if span == 0 {
        bail!(
            "the NBD export at {} has {raw} bytes, less than {align}",
            sock.display()
        );
    }
    Ok(Target {
        file: None,
        span,
        kind: "NBD export",
        name: sock.display().to_string(),
    })
}

/// Opens (and with --size creates/extends) the target; the span is --size or the target's
/// size, aligned down to `align`.
fn open_target(path: &Path, size: Option<u64>, direct: bool, align: u64) -> Result<Target> {
    let exists = path.exists();
    let kind;
    let raw_size = {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(size.is_some())
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening target {}", path.display()))?;
        let meta = f
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?;
        if meta.file_type().is_block_device() {
            kind = "block device";
            // lseek(SEEK_END) gives a block device's size without an ioctl.
            let dev = f
                .seek(SeekFrom::End(0))
                .context("sizing the block device")?;
            match size {
                Some(s) if s > dev => bail!("--size {s} exceeds the block device's {dev} bytes"),
                Some(s) => s,
                None => dev,
            }
        } else if meta.file_type().is_file() {
            kind = if exists {
                "regular file"
            } else {
                "regular file, created"
            };
            match size {
                Some(s) => {
                    if meta.len() < s {
                        f.set_len(s)
                            .with_context(|| format!("extending {} to {s}", path.display()))?;
                    }
                    s
                }
                None => meta.len(),
            }
        } else {
            bail!(
                "{} is neither a regular file nor a block device",
                path.display()
            );
        }
    };
    let span = raw_size / align * align;
    if span == 0 {
        bail!(
            "target {} has {raw_size} bytes, less than the {align}-byte alignment; pass --size",
            path.display()
        );
    }
    let mut oo = OpenOptions::new();
    oo.read(true).write(true);
    if direct {
        oo.custom_flags(libc::O_DIRECT);
    }
    let file = oo.open(path).with_context(|| {
        if direct {
            format!(
                "opening {} with O_DIRECT (the file system may refuse O_DIRECT)",
                path.display()
            )
        } else {
            format!("opening {}", path.display())
        }
    })?;
    Ok(Target {
        file: Some(file),
        span,
        kind,
        name: path.display().to_string(),
    })
}

fn run_workers(
    shared: &Shared<'_>,
    a: &ReplayArgs,
    buf_len: usize,
) -> Result<(WorkerStats, Duration)> {
    let qd = a.queue_depth;
    // Original timing: a bounded queue, so when all workers are busy the dispatcher blocks
    // and the delay shows up as lateness rather than as unbounded buffering.
    let (tx, rx) = mpsc::sync_channel::<(usize, Instant)>(qd);
    let rx = Mutex::new(rx);
    let start = Instant::now();
    let results: Vec<Result<WorkerStats>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        match a.timing {
            Timing::Fast => {
                for _ in 0..qd {
                    handles.push(s.spawn(move || -> Result<WorkerStats> {
                        let mut st = WorkerStats::new()?;
                        let mut conn = shared.io.connect()?;
                        let mut buf = AlignedBuf::new(buf_len);
                        if shared.verify.is_none() {
                            fill_pattern(buf.slice(buf_len), 0, 0);
                        }
                        while !shared.stop.load(Ordering::Relaxed) {
                            let i = match &shared.order {
                                Some(o) => match o.claim(shared.reqs) {
                                    Some(i) => i,
                                    None => break,
                                },
                                None => {
                                    let i = shared.cursor.fetch_add(1, Ordering::Relaxed);
                                    if i >= shared.reqs.len() {
                                        break;
                                    }
                                    i
                                }
                            };
                            if let Some(o) = &shared.order {
                                o.wait_clear(i, &shared.reqs[i]);
                            }
                            shared.execute(i, &mut conn, &mut buf, &mut st);
                            if let Some(o) = &shared.order {
                                o.complete(i);
                            }
                        }
                        Ok(st)
                    }));
                }
            }
            Timing::Original => {
                let rx = &rx;
                for _ in 0..qd {
                    handles.push(s.spawn(move || -> Result<WorkerStats> {
                        let mut st = WorkerStats::new()?;
                        let mut conn = shared.io.connect()?;
                        let mut buf = AlignedBuf::new(buf_len);
                        if shared.verify.is_none() {
                            fill_pattern(buf.slice(buf_len), 0, 0);
                        }
                        loop {
                            let msg = lock(rx).recv();
                            let Ok((i, due)) = msg else { break };
                            if shared.stop.load(Ordering::Relaxed) {
                                if let Some(o) = &shared.order {
                                    o.complete(i);
                                }
                                continue;
                            }
                            if let Some(o) = &shared.order {
                                o.wait_clear(i, &shared.reqs[i]);
                            }
                            let late = Instant::now().saturating_duration_since(due);
                            record(&mut st.lateness, late);
                            if late > LATE_THRESHOLD {
                                st.late += 1;
                            }
                            shared.execute(i, &mut conn, &mut buf, &mut st);
                            if let Some(o) = &shared.order {
                                o.complete(i);
                            }
                        }
                        Ok(st)
                    }));
                }
                for (i, r) in shared.reqs.iter().enumerate() {
                    if shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let due = start + Duration::from_secs_f64(r.time_ns as f64 / 1e9 / a.speedup);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    if let Some(o) = &shared.order {
                        o.register(i, r);
                    }
                    if tx.send((i, due)).is_err() {
                        break;
                    }
                }
                drop(tx);
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a replay worker panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut total = WorkerStats::new()?;
    for r in results {
        total.merge(&r?)?;
    }
    Ok((total, elapsed))
}

fn lat_json(h: &Histogram<u64>) -> serde_json::Value {
    let us = |ns: u64| ns as f64 / 1e3;
    if h.is_empty() {
        return serde_json::json!({ "count": 0 });
    }
    serde_json::json!({
        "count": h.len(),
        "mean": h.mean() / 1e3,
        "p50": us(h.value_at_quantile(0.50)),
        "p90": us(h.value_at_quantile(0.90)),
        "p99": us(h.value_at_quantile(0.99)),
        "p99_9": us(h.value_at_quantile(0.999)),
        "max": us(h.max()),
    })
}

fn lat_line(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return String::from("-");
    }
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    format!(
        "p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  (us, n={})",
        us(0.5),
        us(0.9),
        us(0.99),
        us(0.999),
        h.max() as f64 / 1e3,
        h.len()
    )
}

/// Share of requests that completed under a latency threshold.
struct FastShare {
    threshold_us: u64,
    all: f64,
    reads: f64,
    writes: f64,
    /// Mean latency of the requests under the threshold (the hits' service time).
    mean_us: f64,
}

impl FastShare {
    fn of(st: &WorkerStats, threshold_us: u64) -> Self {
        let below = |h: &Histogram<u64>| -> (u64, u64) {
            if h.is_empty() {
                return (0, 0);
            }
            let limit = threshold_us.saturating_mul(1000).saturating_sub(1).max(1);
            (h.count_between(1, limit), h.len())
        };
        let share = |(n, d): (u64, u64)| if d == 0 { 0.0 } else { n as f64 / d as f64 };
        let (r, w) = (below(&st.read_lat), below(&st.write_lat));
        let limit_ns = threshold_us.saturating_mul(1000);
        let (mut sum_ns, mut n) = (0f64, 0u64);
        for h in [&st.read_lat, &st.write_lat] {
            for v in h.iter_recorded() {
                let ns = h.median_equivalent(v.value_iterated_to());
                if ns < limit_ns {
                    sum_ns += ns as f64 * v.count_at_value() as f64;
                    n += v.count_at_value();
                }
            }
        }
        FastShare {
            threshold_us,
            all: share((r.0 + w.0, r.1 + w.1)),
            reads: share(r),
            writes: share(w),
            mean_us: if n == 0 { 0.0 } else { sum_ns / n as f64 / 1e3 },
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

pub fn run(a: ReplayArgs) -> Result<()> {
    if a.queue_depth == 0 || a.queue_depth > MAX_QUEUE_DEPTH {
        bail!("--queue-depth must be 1 to {MAX_QUEUE_DEPTH}");
    }
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if !a.speedup.is_finite() || a.speedup <= 0.0 {
        bail!("--speedup must be a positive number");
    }
    let name = a.trace.display().to_string();
    let f = File::open(&a.trace).with_context(|| format!("opening trace {name}"))?;
    let trace = parse_trace(
        BufReader::new(f),
        &name,
        a.format,
        a.skip_bad,
        a.max_requests,
    )?;

    // An NBD export is aligned like a block device opened with O_DIRECT.
    let aligned = a.direct || a.nbd.is_some();
    let align = if aligned { DIRECT_ALIGN } else { SECTOR_BYTES };
    let target = match (&a.target, &a.nbd) {
        (_, Some(sock)) => open_nbd_target(sock, a.size, align)?,
        (Some(path), None) => open_target(path, a.size, a.direct, align)?,
        (None, None) => bail!("pass --target or --nbd"),
    };
    let (one_pass, fst) = fold(&trace.records, target.span, align, aligned);
    if (one_pass.len() as u64).saturating_mul(u64::from(a.repeat)) > MAX_REPLAY_REQUESTS {
        bail!(
            "{} requests x --repeat {} is over the limit of {MAX_REPLAY_REQUESTS} requests in one replay",
            one_pass.len(),
            a.repeat
        );
    }
    let reqs = repeat_passes(&one_pass, a.repeat);
    if let Some(path) = &a.write_plan {
        let mut text = String::with_capacity(reqs.len() * 24);
        for r in &reqs {
            let op = if r.op == Op::Read { 'R' } else { 'W' };
            text.push_str(&format!("{op} {} {}\n", r.offset, r.len));
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!(
            "plan           {} requests, span {} bytes, written to {}",
            reqs.len(),
            target.span,
            path.display()
        );
        return Ok(());
    }
    let buf_len = reqs.iter().map(|r| r.len).max().unwrap_or(align) as usize;

    let shared = Shared {
        io: match (&target.file, &a.nbd) {
            (Some(f), _) => Io::File(f),
            (None, Some(sock)) => Io::Nbd(sock),
            (None, None) => unreachable!("a file target always has its file"),
        },
        reqs: &reqs,
        verify: a.verify.then(Verifier::default),
        order: a.verify.then(RangeOrder::default),
        fsync_writes: a.fsync_writes,
        direct: a.direct,
        stop: AtomicBool::new(false),
        cursor: AtomicUsize::new(0),
        error: Mutex::new(None),
    };
    let (st, elapsed) = run_workers(&shared, &a, buf_len)?;
    if let Some(e) = lock(&shared.error).take() {
        bail!("replay failed: {e}");
    }

    let n = reqs.len() as u64;
    let reads = reqs.iter().filter(|r| r.op == Op::Read).count() as u64;
    let writes = n - reads;
    let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
    let iops = n as f64 / secs;
    let mibs = (st.read_bytes + st.write_bytes) as f64 / MIB / secs;
    let mode = if a.nbd.is_some() {
        "NBD"
    } else if a.direct {
        "O_DIRECT"
    } else {
        "buffered"
    };
    let timing = match a.timing {
        Timing::Fast => String::from("fast"),
        Timing::Original => format!("original, speedup {}", a.speedup),
    };

    println!(
        "trace          {name} ({}, {n} requests; {} zero-size and {} malformed lines skipped)",
        trace.format.name(),
        trace.zero_size_skipped,
        trace.bad_lines_skipped
    );
    println!(
        "target         {} ({}), span {} bytes ({:.2} GiB), {mode}{}, timing {timing}, queue depth {}",
        target.name,
        target.kind,
        target.span,
        target.span as f64 / GIB,
        if a.fsync_writes { " + fdatasync per write" } else { "" },
        a.queue_depth
    );
    println!(
        "folding        trace offsets [{}, {}) ({:.2} GiB) folded into the target: offset mod {}, \
         aligned down to {align}{}, clipped at the end; {} wrapped, {} aligned, {} clipped",
        trace.min_offset,
        trace.max_end,
        trace.max_end as f64 / GIB,
        target.span,
        if aligned {
            ", lengths rounded up to 4096"
        } else {
            ""
        },
        fst.wrapped,
        fst.aligned,
        fst.clipped
    );
    println!(
        "requests       {n} ({reads} reads, {writes} writes), {:.1} MiB read, {:.1} MiB written",
        st.read_bytes as f64 / MIB,
        st.write_bytes as f64 / MIB
    );
    println!("elapsed        {secs:.3} s, {iops:.0} IOPS, {mibs:.1} MiB/s");
    let fast = a.fast_below_us.map(|us| FastShare::of(&st, us));
    if let Some(f) = &fast {
        println!(
            "under {} us    {:.1}% of requests ({:.1}% of reads, {:.1}% of writes), mean {:.1} us",
            f.threshold_us,
            f.all * 100.0,
            f.reads * 100.0,
            f.writes * 100.0,
            f.mean_us
        );
    }
    println!("read latency   {}", lat_line(&st.read_lat));
    println!("write latency  {}", lat_line(&st.write_lat));
    if a.timing == Timing::Original {
        println!(
            "start lateness {}; {} requests started > {} ms late",
            lat_line(&st.lateness),
            st.late,
            LATE_THRESHOLD.as_millis()
        );
    }
    let mut verify_json = serde_json::json!({ "enabled": false });
    let mut verify_err = None;
    if let Some(v) = &shared.verify {
        let count = v.mismatch_count.load(Ordering::Relaxed);
        let cr = v.checked_reads.load(Ordering::Relaxed);
        let cb = v.checked_bytes.load(Ordering::Relaxed);
        let written = lock(&v.map).bytes();
        let mm = lock(&v.mismatches).clone();
        if count == 0 && cr == 0 {
            println!(
                "verify         OK, but nothing to check: no read touched the {written} bytes \
                 this run wrote (unwritten ranges are not checked)"
            );
        } else if count == 0 {
            println!(
                "verify         OK: {cr} reads checked {cb} bytes against the shadow of {written} \
                 written bytes (unwritten ranges not checked)"
            );
        } else {
            println!("verify         FAILED: {count} mismatching ranges in {cr} checked reads");
            for m in &mm {
                println!(
                    "  request {} read offset {}: expected {:#04x} (written by request {}), found {:#04x}",
                    m.request, m.offset, m.expected, m.writer, m.found
                );
            }
            if let Some(m) = mm.first() {
                verify_err = Some(format!(
                    "verify failed: {count} mismatching ranges, first at offset {} (request {}, \
                     written by request {})",
                    m.offset, m.request, m.writer
                ));
            }
        }
        verify_json = serde_json::json!({
            "enabled": true,
            "ok": count == 0,
            "checked_reads": cr,
            "checked_bytes": cb,
            "shadow_bytes": written,
            "mismatches": count,
            "first_mismatch_offset": mm.first().map(|m| m.offset),
        });
    }
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "trace": name,
            "format": trace.format.name(),
            "target": target.name,
            "target_kind": target.kind,
            "span_bytes": target.span,
            "direct": a.direct,
            "fsync_writes": a.fsync_writes,
            "timing": match a.timing { Timing::Fast => "fast", Timing::Original => "original" },
            "speedup": a.speedup,
            "queue_depth": a.queue_depth,
            "repeat": a.repeat,
            "requests": n,
            "reads": reads,
            "writes": writes,
            "read_bytes": st.read_bytes,
            "write_bytes": st.write_bytes,
            "zero_size_skipped": trace.zero_size_skipped,
            "bad_lines_skipped": trace.bad_lines_skipped,
            "folding": {
                "rule": "offset mod span, aligned down; clipped at the end",
                "align": align,
                "lengths_rounded_up": aligned,
                "trace_min_offset": trace.min_offset,
                "trace_max_end": trace.max_end,
                "wrapped": fst.wrapped,
                "aligned": fst.aligned,
                "clipped": fst.clipped,
            },
            "elapsed_s": secs,
            "iops": iops,
            "mib_per_s": mibs,
            "latency_us": { "read": lat_json(&st.read_lat), "write": lat_json(&st.write_lat) },
            "lateness_us": if a.timing == Timing::Original {
                serde_json::json!({ "hist": lat_json(&st.lateness), "late_over_1ms": st.late })
            } else {
                serde_json::Value::Null
            },
            "verify": verify_json,
            "fast_share": fast.map(|f| serde_json::json!({
                "threshold_us": f.threshold_us, "all": f.all, "reads": f.reads, "writes": f.writes,
                "mean_us": f.mean_us,
            })),
        });
        let text = serde_json::to_string_pretty(&j).context("encoding JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(e) = verify_err {
        bail!(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
