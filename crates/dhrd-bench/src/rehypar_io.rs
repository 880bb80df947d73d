//! `dhrd-bench rehypar-io`: ReHypar's measured claim (seed 003, section 4), scaled to this
//! machine. The paper credits its 10-14% write throughput over ext2 and ext4 on the SSD to
//! "the large I/O granularity": small files are packed into extents held in memory, and an
//! extent is written once it is full or its time in memory for reuse expires. Here:
//!
//! - **first-fit**: each file gets its blocks from a first-fit extent allocator and is
//!   written by its own synchronous write (`pwritev2` with `RWF_DSYNC`);
//! - **rehypar**: each file gets its blocks from ReHypar (the paper's sections of 64 KiB and
//!   256 KiB extents, threshold v) and is copied into its extent's buffer; the extent is
//!   written by one synchronous write of its filled part once ReHypar no longer offers it
//!   for reuse (full, or its remainder too small) or once it has been in memory longer than
//!   `--window-ms` (then it is sealed: the paper's expiry). A writer waits until its file's
//!   extent is written, so both report a file only once it is durable.
//!
//! Files are Postmark's (500 to 10,000 bytes, uniform), written by `--threads` writers at
//! once, none deleted, into one preallocated and filled device file (`--file`, on the SSD
//! under test; 1 KiB blocks, the paper's). Rounds alternate the two, rotating who goes
//! first; every file is read back and checked after each run (untimed). Figures:
//! files per second (the claim: >= 1.10x first-fit) and space utilisation, live bytes over
//! held bytes at the end (>= 0.85x first-fit's). One JSON object on stdout, a table on
//! stderr.
//!
//! Invariants: a file is counted as written only after the synchronous write that holds
//! its bytes returned; an extent is written exactly once, after ReHypar stopped offering
//! it, so no file lands in it afterwards; with no deletes nothing is ever freed.

mod writers;

use crate::fileio::{emit, r3};
use anyhow::{bail, Context, Result};
use dhrd_io::SplitMix64;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

/// The paper's block size.
pub const BLOCK_BYTES: u64 = dhrd_alloc::rehypar::BLOCK_BYTES_DEFAULT;
/// Postmark's file sizes (its defaults, and the paper's 500 B to 10 KB).
const FILE_BYTES_MIN: u64 = 500;
const FILE_BYTES_MAX: u64 = 10_000;
/// Bounds on the options.
const DEVICE_MIB_MAX: u64 = 64 << 10;
const THREADS_MAX: usize = 256;
const ROUNDS_MAX: u32 = 100;
/// The file list may fill at most this share of the device (ReHypar's chunk gaps and
/// sealed remainders need the rest).
const FILL_PERCENT_MAX: u64 = 45;
/// The configurations: the claim compares the first two; the third says how much of the
/// difference a shared sync alone makes.
const FIRST_FIT: &str = "first-fit";
const REHYPAR: &str = "rehypar";
const GROUP_COMMIT: &str = "first-fit-groupcommit";
const CONFIGS: [&str; 3] = [FIRST_FIT, REHYPAR, GROUP_COMMIT];
/// Targets of the claim (docs/tiering.md).
const THROUGHPUT_TARGET: f64 = 1.10;
const UTILISATION_TARGET: f64 = 0.85;

#[derive(clap::Args, Debug)]
pub struct RehyparIoArgs {
    /// The device file, on the SSD under test: created, preallocated and filled first.
    #[arg(long)]
    pub file: PathBuf,
    /// Device size in MiB.
    #[arg(long, default_value_t = 256)]
    pub device_mib: u64,
    /// Files written per run.
    #[arg(long, default_value_t = 20_000)]
    pub files: u64,
    /// Writers at once, each writing one file at a time and waiting until it is durable.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// ReHypar: how long an extent may stay in memory for reuse before it is written
    /// (the paper's expiry; it gives no value).
    #[arg(long, default_value_t = 2)]
    pub window_ms: u64,
    /// ReHypar's threshold v in blocks (8 uses space best: docs/tiering.md).
    #[arg(long, default_value_t = 8)]
    pub threshold: u64,
    /// Rounds; each runs both, alternating which goes first.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep the device file (default: removed at the end).
    #[arg(long)]
    pub keep: bool,
}

/// What one run of one configuration measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub secs: f64,
    /// Files written (all of them unless the allocator ran out of space first).
    pub files: u64,
    pub out_of_space: bool,
    pub file_bytes: u64,
    /// Synchronous device writes, and the bytes they carried.
    pub device_writes: u64,
    pub device_bytes: u64,
    /// Live bytes over held bytes at the end.
    pub utilisation: f64,
    /// Extents written because their window expired (ReHypar only).
    pub expired: u64,
    /// Per file, from the start of its write to its durability (us): mean and p99.
    pub latency_mean_us: f64,
    pub latency_p99_us: f64,
}

impl RunResult {
    fn json(&self) -> Value {
        json!({
            "secs": r3(self.secs), "files": self.files, "out_of_space": self.out_of_space,
            "file_bytes": self.file_bytes,
            "files_per_sec": r3(self.files as f64 / self.secs),
            "mib_per_sec": r3(self.file_bytes as f64 / self.secs / (1 << 20) as f64),
            "device_writes": self.device_writes,
            "bytes_per_device_write": r3(self.device_bytes as f64 / self.device_writes.max(1) as f64),
            "utilisation": r3(self.utilisation), "expired_extents": self.expired,
            "latency_mean_us": r3(self.latency_mean_us), "latency_p99_us": r3(self.latency_p99_us),
        })
    }
}

fn check(a: &RehyparIoArgs) -> Result<()> {
    if a.device_mib == 0 || a.device_mib > DEVICE_MIB_MAX {
        bail!(
            "--device-mib {} outside [1, {DEVICE_MIB_MAX}]",
            a.device_mib
        );
    }
    if a.threads == 0 || a.threads > THREADS_MAX {
        bail!("--threads {} outside [1, {THREADS_MAX}]", a.threads);
    }
    if a.rounds == 0 || a.rounds > ROUNDS_MAX {
        bail!("--rounds {} outside [1, {ROUNDS_MAX}]", a.rounds);
    }
    let most = a.files * FILE_BYTES_MAX.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
    if a.files == 0 || most * 100 > a.device_mib * (1 << 20) * FILL_PERCENT_MAX {
        bail!(
            "--files {} of up to {FILE_BYTES_MAX} bytes could fill more than {FILL_PERCENT_MAX}% of \
             {} MiB: give fewer files or a larger --device-mib",
            a.files,
            a.device_mib
        );
    }
    Ok(())
}

/// The file sizes of one round (the same for both configurations).
fn file_sizes(seed: u64, n: u64) -> Vec<u64> {
    let mut r = SplitMix64::new(seed ^ 0x7265_6879_7061_7221);
    (0..n)
        .map(|_| FILE_BYTES_MIN + r.below(FILE_BYTES_MAX - FILE_BYTES_MIN + 1))
        .collect()
}

/// The bytes of file `i` of `len` bytes: distinct per file, so a misplaced write shows.
pub fn file_bytes(i: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    SplitMix64::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ len).fill(&mut b);
    b
}

/// Creates the device file, preallocated and written once, so that the runs overwrite
/// blocks the file system has already allocated and initialised.
fn prepare(a: &RehyparIoArgs) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&a.file)
        .with_context(|| format!("opening {}", a.file.display()))?;
    let bytes = a.device_mib << 20;
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..a.device_mib {
        f.write_all_at(&chunk, i << 20)
            .with_context(|| format!("filling {}", a.file.display()))?;
    }
    f.set_len(bytes)?;
    f.sync_all()
        .with_context(|| format!("syncing {}", a.file.display()))?;
    Ok(f)
}

/// Reads every file back from where `placed` says it went.
fn verify(f: &File, sizes: &[u64], placed: &[u64], what: &str) -> Result<()> {
    for (i, (&len, &block)) in sizes.iter().zip(placed).enumerate() {
        if block == writers::NOT_WRITTEN {
            continue;
        }
        let mut got = vec![0u8; len as usize];
        f.read_exact_at(&mut got, block * BLOCK_BYTES)
            .with_context(|| format!("{what}: reading file {i} back"))?;
        if got != file_bytes(i as u64, len) {
            bail!("{what}: file {i} ({len} bytes at block {block}) reads back wrong");
        }
    }
    Ok(())
}

pub fn run(a: RehyparIoArgs) -> Result<()> {
    check(&a)?;
    let f = prepare(&a)?;
    let window = Duration::from_millis(a.window_ms);
    let mut rows: Vec<(String, u32, RunResult)> = Vec::new();
    for round in 0..a.rounds {
        let sizes = file_sizes(a.seed + u64::from(round), a.files);
        // Who goes first rotates, so a slow phase of the machine hits each in turn.
        let mut order = CONFIGS;
        order.rotate_left(round as usize % CONFIGS.len());
        for name in order {
            let (res, placed) = match name {
                FIRST_FIT => writers::first_fit(&f, a.device_mib, &sizes, a.threads, false)?,
                GROUP_COMMIT => writers::first_fit(&f, a.device_mib, &sizes, a.threads, true)?,
                _ => writers::packed(&f, a.device_mib, &sizes, a.threads, a.threshold, window)?,
            };
            verify(&f, &sizes, &placed, name)?;
            eprintln!(
                "rehypar-io: round {round} {name}: {:.0} files/s, utilisation {:.3}, {} device writes{}",
                res.files as f64 / res.secs,
                res.utilisation,
                res.device_writes,
                if res.out_of_space {
                    format!(", out of space after {} files", res.files)
                } else {
                    String::new()
                }
            );
            rows.push((name.to_string(), round, res));
        }
    }
    drop(f);
    if !a.keep {
        std::fs::remove_file(&a.file).with_context(|| format!("removing {}", a.file.display()))?;
    }
    emit(&summary(&a, &rows), &table(&rows))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn med(rows: &[(String, u32, RunResult)], name: &str, f: impl Fn(&RunResult) -> f64) -> f64 {
    median(
        rows.iter()
            .filter(|r| r.0 == name)
            .map(|r| f(&r.2))
            .collect(),
    )
}

fn summary(a: &RehyparIoArgs, rows: &[(String, u32, RunResult)]) -> Value {
    let rate = |r: &RunResult| r.files as f64 / r.secs;
    let util = |r: &RunResult| r.utilisation;
    // Per round, then the median: each ratio divides two runs of the same round.
    let per_round = |f: &dyn Fn(&RunResult) -> f64| {
        median(
            (0..a.rounds)
                .filter_map(|k| {
                    let get = |n: &str| rows.iter().find(|r| r.0 == n && r.1 == k).map(|r| f(&r.2));
                    Some(get(REHYPAR)? / get(FIRST_FIT)?)
                })
                .collect(),
        )
    };
    let throughput = per_round(&rate);
    let utilisation = per_round(&util);
    let runs: Vec<Value> = rows
        .iter()
        .map(|(n, k, r)| {
            let mut v = r.json();
            v["config"] = json!(n);
            v["round"] = json!(k);
            v
        })
        .collect();
    let medians: Vec<Value> = CONFIGS
        .iter()
        .map(|n| {
            json!({
                "config": n, "files_per_sec": r3(med(rows, n, rate)),
                "utilisation": r3(med(rows, n, util)),
                "latency_mean_us": r3(med(rows, n, |r| r.latency_mean_us)),
                "bytes_per_device_write": r3(med(rows, n,
                    |r| r.device_bytes as f64 / r.device_writes.max(1) as f64)),
            })
        })
        .collect();
    json!({
        "benchmark": "rehypar-io",
        "config": {"device_mib": a.device_mib, "files": a.files, "threads": a.threads,
            "window_ms": a.window_ms, "threshold_blocks": a.threshold, "rounds": a.rounds,
            "seed": a.seed, "block_bytes": BLOCK_BYTES,
            "file_bytes": [FILE_BYTES_MIN, FILE_BYTES_MAX]},
        "runs": runs,
        "medians": medians,
        "throughput_ratio": r3(throughput),
        "utilisation_ratio": r3(utilisation),
        "targets": {"throughput_ratio": THROUGHPUT_TARGET, "utilisation_ratio": UTILISATION_TARGET},
        "met": throughput >= THROUGHPUT_TARGET && utilisation >= UTILISATION_TARGET,
    })
}

fn table(rows: &[(String, u32, RunResult)]) -> String {
    let mut t = String::from(
        "config                 round  files/s  util   writes  bytes/write  mean us\n",
    );
    for (n, k, r) in rows {
        let _ = writeln!(
            t,
            "{n:<21} {k:>6} {:>8.0} {:>5.3} {:>8} {:>12.0} {:>8.0}",
            r.files as f64 / r.secs,
            r.utilisation,
            r.device_writes,
            r.device_bytes as f64 / r.device_writes.max(1) as f64,
            r.latency_mean_us
        );
    }
    t
}
