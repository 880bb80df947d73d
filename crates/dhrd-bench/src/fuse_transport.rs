//! `fuse-transport`: what the FUSE transport alone costs, /dev/fuse against FUSE over
//! io_uring, measured with a "null server" that does no work of its own.
//!
//! The server speaks the raw FUSE protocol (no fuser, no libfuse) and serves one regular file
//! held in an anonymous RAM mapping: READ copies out of it, WRITE copies into it and
//! acknowledges. Every open gets FOPEN_DIRECT_IO, so every 4 KiB read or write of fio is one
//! request and one reply through the transport under test. It runs over two transports:
//! - legacy: T threads, each blocking in read() on its own clone of the /dev/fuse descriptor
//!   and replying with writev() (what fuser and dhrd do today);
//! - io_uring (kernel >= 6.14, `fuse.enable_uring`): one queue per possible CPU, each served
//!   by one thread pinned to that CPU with its own ring of SQE128 URING_CMDs; the kernel puts
//!   a request on the queue of the CPU the caller runs on. A /dev/fuse reader stays for what
//!   the kernel still sends that way.
//!
//! fio runs against each mount and against a tmpfs file in the same invocation, in
//! interleaved rounds with rotating order; the report takes medians of per-round ratios.
//!
//! Invariants:
//! - `enable_uring` is only changed while the io_uring server negotiates (the kernel checks it
//!   when it sends INIT, when it processes the INIT reply and at the first REGISTER; once the
//!   connection has io_uring it stays on), and the previous value is always restored,
//!   also on errors and on SIGINT/SIGTERM.
//! - Every mount made here is unmounted before `run` returns (lazy unmount and a connection
//!   abort as last resorts); no server thread outlives its mount by design.
//! - The RAM file is shared memory between server threads, accessed only by raw copies, like
//!   a device: overlapping concurrent writes leave unspecified bytes, never torn metadata.
//! - It is experiment 8 of the benchmark suite (`bench/suite`, so its tiny profile runs it
//!   in the default test suite): the floor under any request a FUSE daemon serves, on
//!   which the choice of dhrd's transport rests. It needs root, fio and, for the io_uring
//!   half, a kernel built with CONFIG_FUSE_IO_URING (without it that half is reported as
//!   unavailable).

use crate::machine::Machine;
use anyhow::{bail, Context};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Bounds and tunables
// ---------------------------------------------------------------------------------------

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Largest WRITE the server accepts (INIT's max_write) and largest READ it is sent.
const MAX_WRITE: u32 = 128 * KIB as u32;
/// INIT's max_pages: MAX_WRITE in 4 KiB pages (the kernel sizes ring payloads from it).
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;
/// A /dev/fuse read must have room for the largest request: header, write_in, MAX_WRITE.
const LEGACY_BUF_BYTES: usize = MAX_WRITE as usize + 4096;
/// Ring payload buffer per entry; the kernel refuses less than max(8 KiB, max_write,
/// max_pages * 4 KiB).
const PAYLOAD_BYTES: usize = MAX_WRITE as usize;
/// Ring entries (requests in flight) per queue. fio QD1 with 2 jobs needs one per CPU;
/// a few more cover background requests (RELEASE) arriving meanwhile.
const ENTRIES_PER_QUEUE: usize = 4;
/// Attribute and entry timeouts: nothing but this server changes the file.
const ATTR_VALID_SECS: u64 = 3600;
/// How long teardown waits for server threads after unmounting before aborting the
/// connection, and again after the abort.
const THREAD_EXIT_WAIT: Duration = Duration::from_secs(5);
/// The request the stall probe makes the server sleep on, and for how long.
const STALL_MS: u64 = 200;
/// When the stall probe's second reader starts after the first.
const STALL_PROBE_DELAY: Duration = Duration::from_millis(20);
/// fio ramp time before each measured run (seconds).
const FIO_RAMP_SECS: u32 = 1;
/// Name of the one file in the null file system.
const FILE_NAME: &[u8] = b"data";
const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

mod nullfs;
mod proto;
mod server;
#[cfg(test)]
mod tests;
mod transport;

use nullfs::*;
use proto::*;
use server::*;
use transport::*;

// ---------------------------------------------------------------------------------------
// Orchestration and report
// ---------------------------------------------------------------------------------------

#[derive(clap::Args)]
pub struct FuseTransportArgs {
    /// Size of the served file (and of the tmpfs baseline file).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// Legacy server thread counts to measure (1 and dhrd's default 8).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub threads: Vec<usize>,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds per fio run (after a 1 s ramp).
    #[arg(long, default_value_t = 4)]
    pub runtime: u32,
    /// Skip the io_uring transport (legacy and tmpfs only).
    #[arg(long)]
    pub no_uring: bool,
    /// Where results go; default a new bench/results/<date>-fuse-transport[-n].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for the mount points.
    #[arg(long, default_value = "/tmp")]
    pub scratch: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], KIB),
        Some('M' | 'm') => (&s[..s.len() - 1], MIB),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|e| format!("{s}: {e}"))?;
    let v = n * mult;
    if v < 1 << 20 || v & 4095 != 0 {
        return Err(format!("{s}: need a multiple of 4 KiB, at least 1 MiB"));
    }
    Ok(v)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let h = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, h as libc::sighandler_t);
        libc::signal(libc::SIGTERM, h as libc::sighandler_t);
    }
}

#[derive(Clone, Debug, Serialize)]
struct Run {
    round: usize,
    order: usize,
    workload: String,
    target: String,
    result: FioResult,
    loadavg: String,
    /// io_uring only: requests per queue (CPU) during this run.
    queue_requests: Option<Vec<u64>>,
    /// io_uring only: share of the run's requests that came from the fio job's main CPU
    /// (requests of each pid on its most used queue / all requests).
    main_queue_share: Option<f64>,
    /// io_uring only: share of requests whose caller was on another CPU (queue) than for
    /// its previous request.
    cpu_change_share: Option<f64>,
}

#[derive(Serialize)]
struct Median {
    workload: String,
    target: String,
    iops: f64,
    clat_mean_us: f64,
    clat_p99_us: f64,
    /// Median over rounds of (target IOPS / tmpfs IOPS) of the same round.
    iops_vs_tmpfs: f64,
    /// Median over rounds of (target mean latency / tmpfs mean latency).
    lat_vs_tmpfs: f64,
    iops_vs_tmpfs_min: f64,
    iops_vs_tmpfs_max: f64,
    /// io_uring only: median per-round IOPS ratio to each legacy configuration.
    uring_vs_legacy: Vec<(String, f64)>,
}

/// Requests per opcode over /dev/fuse and over the ring.
type OpCounts = (HashMap<String, u64>, HashMap<String, u64>);

#[derive(Serialize)]
struct Summary {
    command: String,
    machine: Machine,
    size: u64,
    rounds: usize,
    runtime_s: u32,
    uring_status: String,
    server_threads: HashMap<String, String>,
    medians: Vec<Median>,
    runs: Vec<Run>,
    /// Requests per opcode that arrived over /dev/fuse and over the ring, per server.
    requests: HashMap<String, OpCounts>,
    stall: Vec<StallResult>,
    elapsed_s: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Per-queue request counts, the share on each caller's main queue, and the share of
/// requests whose caller had changed CPU since its previous request.
fn take_queue_stats(s: &Server) -> Option<(Vec<u64>, f64, f64)> {
    let stats = s.queue_stats.as_ref()?;
    let mut per_queue = Vec::new();
    let mut per_pid: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut switched = 0;
    let n = stats.len();
    for (q, m) in stats.iter().enumerate() {
        let mut g = match m.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        per_queue.push(g.by_pid.values().sum());
        for (&pid, &c) in &g.by_pid {
            per_pid.entry(pid).or_insert_with(|| vec![0; n])[q] += c;
        }
        switched += g.switched;
        if g.off_cpu > 0 {
            eprintln!(
                "fuse-transport: queue {q} served {} requests off its CPU",
                g.off_cpu
            );
        }
        *g = QueueStats::default();
    }
    let total: u64 = per_queue.iter().sum();
    let main: u64 = per_pid
        .values()
        .map(|v| v.iter().copied().max().unwrap_or(0))
        .sum();
    let share = if total > 0 {
        main as f64 / total as f64
    } else {
        f64::NAN
    };
    Some((per_queue, share, switched as f64 / total.max(1) as f64))
}

pub fn run(a: FuseTransportArgs) -> anyhow::Result<()> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        bail!("fuse-transport needs root (mount(2), enable_uring)");
    }
    install_signal_handlers();
    let t_start = Instant::now();
    let machine = Machine::probe(&a.scratch);
    println!("machine: {}", machine.describe());
    let out_dir = match &a.out {
        Some(out) => out.clone(),
        None => crate::report::new_run_dir("fuse-transport")?,
    };
    let base = a
        .scratch
        .join(format!("dhrd-fuse-transport-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let result = run_inner(&a, &base, &machine, &out_dir, t_start);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn run_inner(
    a: &FuseTransportArgs,
    base: &Path,
    machine: &Machine,
    out_dir: &Path,
    t_start: Instant,
) -> anyhow::Result<()> {
    // Servers and tmpfs are dropped (unmounted) in reverse order on every return path.
    let tmpfs = TmpfsMount::new(&base.join("tmpfs"), a.size)?;
    let mut servers: Vec<Server> = Vec::new();
    for &t in &a.threads {
        servers.push(start_legacy(&base.join(format!("legacy{t}")), t, a.size)?);
    }
    let uring_status = if a.no_uring {
        "skipped (--no-uring)".to_string()
    } else {
        match start_uring(&base.join("uring"), a.size) {
            Ok(s) => {
                servers.push(s);
                "registered".to_string()
            }
            Err(e) => {
                let msg = format!("io_uring transport unavailable: {e:#}");
                eprintln!("fuse-transport: {msg}");
                msg
            }
        }
    };
    let mut server_threads = HashMap::new();
    for s in &servers {
        server_threads.insert(
            s.label(),
            match s.kind {
                Kind::Legacy(t) => format!("{t} threads on cloned /dev/fuse fds, unpinned"),
                Kind::Uring => format!(
                    "{} queue threads pinned 1:1 to CPUs, {ENTRIES_PER_QUEUE} entries each, plus 1 /dev/fuse reader",
                    s.queue_stats.as_ref().map_or(0, |q| q.len())
                ),
            },
        );
    }
    // Smoke check every target before spending minutes on it.
    for s in &servers {
        let f = File::open(s.file()).with_context(|| format!("open {}", s.file().display()))?;
        let mut b = [0u8; 4096];
        let n = f.read_at(&mut b, 4096)?;
        if n != 4096 || b[0] != 1 || b[1] != 8 {
            bail!("{}: unexpected read of {n} bytes", s.label());
        }
    }
    for s in &servers {
        let _ = take_queue_stats(s);
    }

    let mut targets: Vec<(String, PathBuf, Option<usize>)> =
        vec![("tmpfs".into(), tmpfs.file(), None)];
    for (i, s) in servers.iter().enumerate() {
        targets.push((s.label(), s.file(), Some(i)));
    }
    let mut runs: Vec<Run> = Vec::new();
    let total = a.rounds * WORKLOADS.len() * targets.len();
    let mut done = 0;
    for round in 0..a.rounds {
        // Rotate both the workload order and the target order from round to round.
        let mut order = 0;
        for wi in 0..WORKLOADS.len() {
            let w = &WORKLOADS[(wi + round) % WORKLOADS.len()];
            for ti in 0..targets.len() {
                let (label, file, srv) = &targets[(ti + round) % targets.len()];
                if STOP.load(Ordering::SeqCst) {
                    bail!("interrupted");
                }
                let la = loadavg();
                let r = fio(file, w, a.size, a.runtime)?;
                if STOP.load(Ordering::SeqCst) {
                    bail!("interrupted");
                }
                let qs = srv.and_then(|i| take_queue_stats(&servers[i]));
                done += 1;
                println!(
                    "[{done}/{total}] round {round} {:<15} {:<10} {:>9.0} IOPS  mean {:>7.2} us  p99 {:>7.2} us{}",
                    w.name,
                    label,
                    r.iops,
                    r.clat_mean_us,
                    r.clat_p99_us,
                    qs.as_ref()
                        .map(|(q, s, w)| format!(
                            "  queues {q:?} main-queue share {s:.3} cpu-change share {w:.3}"
                        ))
                        .unwrap_or_default()
                );
                runs.push(Run {
                    round,
                    order,
                    workload: w.name.into(),
                    target: label.clone(),
                    result: r,
                    loadavg: la,
                    queue_requests: qs.as_ref().map(|(q, _, _)| q.clone()),
                    main_queue_share: qs.as_ref().map(|(_, s, _)| *s),
                    cpu_change_share: qs.as_ref().map(|(_, _, w)| *w),
                });
                order += 1;
            }
        }
    }

    let mut stall = Vec::new();
    for s in &servers {
        match stall_probe(s) {
            Ok(r) => stall.push(r),
            Err(e) => eprintln!("fuse-transport: stall probe on {}: {e:#}", s.label()),
        }
    }
    let _ = servers.iter().map(take_queue_stats).count();

    // Medians of per-round values and ratios.
    let find = |round: usize, w: &str, t: &str| {
        runs.iter()
            .find(|r| r.round == round && r.workload == w && r.target == t)
            .map(|r| r.result.clone())
    };
    let legacy_labels: Vec<String> = servers
        .iter()
        .filter(|s| matches!(s.kind, Kind::Legacy(_)))
        .map(|s| s.label())
        .collect();
    let mut medians = Vec::new();
    for w in &WORKLOADS {
        for (t, _, _) in &targets {
            let (mut iops, mut mean, mut p99, mut ri, mut rl) =
                (vec![], vec![], vec![], vec![], vec![]);
            let mut vs_legacy: Vec<(String, Vec<f64>)> =
                legacy_labels.iter().map(|l| (l.clone(), vec![])).collect();
            for round in 0..a.rounds {
                let (Some(x), Some(b)) = (find(round, w.name, t), find(round, w.name, "tmpfs"))
                else {
                    continue;
                };
                iops.push(x.iops);
                mean.push(x.clat_mean_us);
                p99.push(x.clat_p99_us);
                ri.push(x.iops / b.iops);
                rl.push(x.clat_mean_us / b.clat_mean_us);
                if t == "io_uring" {
                    for (l, v) in vs_legacy.iter_mut() {
                        if let Some(y) = find(round, w.name, l) {
                            v.push(x.iops / y.iops);
                        }
                    }
                }
            }
            let (mn, mx) = ri
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            medians.push(Median {
                workload: w.name.into(),
                target: t.clone(),
                iops: median(&mut iops),
                clat_mean_us: median(&mut mean),
                clat_p99_us: median(&mut p99),
                iops_vs_tmpfs: median(&mut ri),
                lat_vs_tmpfs: median(&mut rl),
                iops_vs_tmpfs_min: mn,
                iops_vs_tmpfs_max: mx,
                uring_vs_legacy: if t == "io_uring" {
                    vs_legacy
                        .into_iter()
                        .map(|(l, mut v)| (l, median(&mut v)))
                        .collect()
                } else {
                    vec![]
                },
            });
        }
    }
    let mut requests = HashMap::new();
    for s in &servers {
        requests.insert(s.label(), s.fs.counters.snapshot());
    }
    let summary = Summary {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine.clone(),
        size: a.size,
        rounds: a.rounds,
        runtime_s: a.runtime,
        uring_status,
        server_threads,
        medians,
        runs,
        requests,
        stall,
        elapsed_s: t_start.elapsed().as_secs_f64(),
    };
    let md = markdown(&summary);
    println!("\n{md}");
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(
        out_dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    std::fs::write(out_dir.join("results.md"), &md)?;
    println!("wrote {}", out_dir.display());
    drop(servers);
    drop(tmpfs);
    Ok(())
}

fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# fuse-transport: /dev/fuse vs FUSE over io_uring (null server)\n"
    );
    let _ = writeln!(m, "Command: `{}`\n", s.command);
    let _ = writeln!(m, "Machine: {}\n", s.machine.describe());
    let _ = writeln!(
        m,
        "File {} MiB, {} rounds x {} s (+{FIO_RAMP_SECS} s ramp) per run, fio 4 KiB psync QD1, order rotated per round. io_uring: {}.\n",
        s.size / MIB,
        s.rounds,
        s.runtime_s,
        s.uring_status
    );
    let mut names: Vec<_> = s.server_threads.iter().collect();
    names.sort();
    for (k, v) in names {
        let _ = writeln!(m, "- {k}: {v}");
    }
    let _ = writeln!(
        m,
        "\nMedians over rounds; ratios are medians of per-round ratios (min-max of the IOPS ratio in brackets).\n"
    );
    let _ = writeln!(
        m,
        "| workload | target | IOPS | mean us | p99 us | IOPS / tmpfs | mean lat / tmpfs | io_uring IOPS / legacy |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|---|");
    for x in &s.medians {
        let vs = x
            .uring_vs_legacy
            .iter()
            .map(|(l, r)| format!("{r:.2}x {l}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            m,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.3} ({:.3}-{:.3}) | {:.2} | {} |",
            x.workload,
            x.target,
            x.iops,
            x.clat_mean_us,
            x.clat_p99_us,
            x.iops_vs_tmpfs,
            x.iops_vs_tmpfs_min,
            x.iops_vs_tmpfs_max,
            x.lat_vs_tmpfs,
            vs
        );
    }
    let _ = writeln!(m, "\n## Requests by transport (opcode: count)\n");
    let mut reqs: Vec<_> = s.requests.iter().collect();
    reqs.sort_by(|a, b| a.0.cmp(b.0));
    for (label, (dev, ring)) in reqs {
        let fmt = |h: &HashMap<String, u64>| {
            let mut v: Vec<_> = h.iter().collect();
            v.sort();
            v.iter()
                .map(|(k, c)| format!("{k} {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(m, "- {label}: /dev/fuse: {}; ring: {}", fmt(dev), fmt(ring));
    }
    let uring_runs: Vec<&Run> = s
        .runs
        .iter()
        .filter(|r| r.queue_requests.is_some())
        .collect();
    if !uring_runs.is_empty() {
        let _ = writeln!(
            m,
            "\n## io_uring queue use per run (requests per queue = per CPU of the caller; share on each caller's main queue)\n"
        );
        for r in uring_runs {
            let _ = writeln!(
                m,
                "- round {} {}: {:?}, main-queue share {:.3}, caller changed CPU since its previous request: {:.3}",
                r.round,
                r.workload,
                r.queue_requests.clone().unwrap_or_default(),
                r.main_queue_share.unwrap_or(f64::NAN),
                r.cpu_change_share.unwrap_or(f64::NAN)
            );
        }
    }
    if !s.stall.is_empty() {
        let _ = writeln!(
            m,
            "\n## Stall probe (a read on CPU 0 sleeps {STALL_MS} ms in the server; latency of a second read)\n"
        );
        let _ = writeln!(
            m,
            "| target | second read on CPU 0 | second read on CPU 1 |"
        );
        let _ = writeln!(m, "|---|---|---|");
        for x in &s.stall {
            let _ = writeln!(
                m,
                "| {} | {:.0} us | {:.0} us |",
                x.target, x.same_cpu_us, x.other_cpu_us
            );
        }
    }
    let _ = writeln!(m, "\nElapsed: {:.0} s", s.elapsed_s);
    m
}
