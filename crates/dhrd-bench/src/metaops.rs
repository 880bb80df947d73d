//! `dhrd-bench metaops`: the metadata rate of a directory on any file system, in the
//! manner of mdtest's file phases: T threads each create F empty files in a directory of
//! their own, then stat all of them, then unlink all of them. Prints one JSON object on
//! stdout (rates per phase and over the three phases, latency percentiles per phase).
//!
//! Why phases rather than create+stat+unlink per file: each phase stresses one request
//! kind at a time (create: CREATE or MKNOD+OPEN and RELEASE through FUSE; stat: LOOKUP and
//! GETATTR, or nothing if the kernel keeps entries and attributes; unlink: UNLINK), and
//! the stat phase shows whether a file system keeps what it just created in the kernel.
//!
//! Invariants: every create uses O_EXCL in a fresh directory, so an existing name is an
//! error, not a silent reuse; every stat must find a regular file of size 0; every unlink
//! must succeed; any error aborts the run, naming the phase and the path. The threads
//! start each phase together (a barrier) and a phase's time runs from that start until
//! the last thread finishes it. With `--fsync-dir` each thread fsyncs its directory at the
//! end of the create and of the unlink phase, inside the timing (durable names, as a mail
//! spool or a build cache that syncs its directory would do).

use crate::fileio::{close_checked, emit, latency_histogram, r3, record_ns};
use anyhow::{bail, ensure, Context};
use hdrhistogram::Histogram;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Instant;

/// The run's directory under `--dir`; it must not exist.
const ROOT_NAME: &str = "dhrd-metaops";
const THREADS_MAX: usize = 1024;
const FILES_PER_THREAD_MAX: u64 = 10_000_000;

#[derive(clap::Args)]
pub struct MetaopsArgs {
    /// Directory to run in (any file system); the files go into DIR/dhrd-metaops, which
    /// must not exist.
    #[arg(long)]
    pub dir: PathBuf,
    /// Threads, each in a directory of its own.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Files each thread creates, stats and unlinks.
    #[arg(long, default_value_t = 10_000)]
    pub files_per_thread: u64,
    /// fsync each thread's directory at the end of the create and the unlink phase.
    #[arg(long)]
    pub fsync_dir: bool,
}

#[derive(Clone, Copy)]
enum Phase {
    Create,
    Stat,
    Unlink,
}

const PHASES: [Phase; 3] = [Phase::Create, Phase::Stat, Phase::Unlink];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::Unlink => "unlink",
        }
    }
}

fn file_path(dir: &Path, i: u64) -> PathBuf {
    dir.join(format!("f{i}"))
}

fn fsync_dir(dir: &Path) -> anyhow::Result<()> {
    let d = File::open(dir).with_context(|| format!("open {}", dir.display()))?;
    d.sync_all()
        .with_context(|| format!("fsync directory {}", dir.display()))?;
    close_checked(d, dir, "fsync-dir")
}

/// One thread's work in one phase; latencies go into `h`.
fn run_phase(
    phase: Phase,
    dir: &Path,
    files: u64,
    sync_dir: bool,
    h: &mut Histogram<u64>,
) -> anyhow::Result<()> {
    for i in 0..files {
        let p = file_path(dir, i);
        let t = Instant::now();
        match phase {
            Phase::Create => {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&p)
                    .with_context(|| format!("create {}", p.display()))?;
                close_checked(f, &p, "create")?;
            }
            Phase::Stat => {
                let m = std::fs::symlink_metadata(&p)
                    .with_context(|| format!("stat {}", p.display()))?;
                ensure!(
                    m.file_type().is_file() && m.size() == 0,
                    "stat {}: not the empty file created (mode {:o}, size {})",
                    p.display(),
                    m.mode(),
                    m.size()
                );
            }
            Phase::Unlink => {
                std::fs::remove_file(&p).with_context(|| format!("unlink {}", p.display()))?;
            }
        }
        record_ns(h, t.elapsed().as_nanos() as u64);
    }
    if sync_dir && !matches!(phase, Phase::Stat) {
        fsync_dir(dir)?;
    }
    Ok(())
}

pub fn run(a: MetaopsArgs) -> anyhow::Result<()> {
    if a.threads == 0 || a.threads > THREADS_MAX {
        bail!("--threads must be 1..={THREADS_MAX}");
    }
    if a.files_per_thread == 0 || a.files_per_thread > FILES_PER_THREAD_MAX {
        bail!("--files-per-thread must be 1..={FILES_PER_THREAD_MAX}");
    }
    let root = a.dir.join(ROOT_NAME);
    std::fs::create_dir(&root).with_context(|| {
        format!(
            "create {} (it must not exist: remove what an earlier run left)",
            root.display()
        )
    })?;
    let dirs: Vec<PathBuf> = (0..a.threads).map(|t| root.join(format!("t{t}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    fsync_dir(&root)?;

    let barrier = Barrier::new(a.threads + 1);
    let results = std::thread::scope(|s| -> anyhow::Result<_> {
        let workers: Vec<_> = dirs
            .iter()
            .map(|d| {
                let barrier = &barrier;
                let (files, sync_dir) = (a.files_per_thread, a.fsync_dir);
                s.spawn(move || -> anyhow::Result<Vec<Histogram<u64>>> {
                    let mut hs = Vec::new();
                    let mut failed = None;
                    for phase in PHASES {
                        barrier.wait();
                        let mut h = latency_histogram();
                        // After a failure the thread still meets every barrier, so the
                        // others are not left waiting.
                        if failed.is_none() {
                            if let Err(e) = run_phase(phase, d, files, sync_dir, &mut h) {
                                failed = Some(e.context(phase.name()));
                            }
                        }
                        barrier.wait();
                        hs.push(h);
                    }
                    match failed {
                        Some(e) => Err(e),
                        None => Ok(hs),
                    }
                })
            })
            .collect();
        let mut secs = Vec::new();
        for _ in PHASES {
            barrier.wait();
            let t = Instant::now();
            barrier.wait();
            secs.push(t.elapsed().as_secs_f64());
        }
        let mut hists: Vec<Histogram<u64>> = PHASES.iter().map(|_| latency_histogram()).collect();
        for w in workers {
            let hs = w
                .join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
            for (all, h) in hists.iter_mut().zip(&hs) {
                all.add(h).context("merging latency histograms")?;
            }
        }
        Ok((secs, hists))
    })?;
    let (secs, hists) = results;
    for d in &dirs {
        std::fs::remove_dir(d).with_context(|| format!("rmdir {}", d.display()))?;
    }
    std::fs::remove_dir(&root).with_context(|| format!("rmdir {}", root.display()))?;

    let per_phase = (a.threads as u64 * a.files_per_thread) as f64;
    let total_secs: f64 = secs.iter().sum();
    let us = |ns: u64| r3(ns as f64 / 1000.0);
    let mut phases = serde_json::Map::new();
    let mut summary = format!(
        "metaops {} thread(s) x {} files:",
        a.threads, a.files_per_thread
    );
    for ((phase, s), h) in PHASES.iter().zip(&secs).zip(&hists) {
        let rate = per_phase / s.max(1e-9);
        phases.insert(
            phase.name().into(),
            json!({
                "secs": r3(*s),
                "ops_per_sec": r3(rate),
                "p50_us": us(h.value_at_quantile(0.5)),
                "p99_us": us(h.value_at_quantile(0.99)),
            }),
        );
        summary.push_str(&format!(" {} {:.0}/s", phase.name(), rate));
    }
    let ops_per_sec = 3.0 * per_phase / total_secs.max(1e-9);
    summary.push_str(&format!(", all {ops_per_sec:.0} ops/s"));
    emit(
        &json!({
            "workload": "metaops",
            "dir": a.dir,
            "threads": a.threads,
            "files_per_thread": a.files_per_thread,
            "fsync_dir": a.fsync_dir,
            "secs": r3(total_secs),
            "ops_per_sec": r3(ops_per_sec),
            "phases": phases,
        }),
        &summary,
    )
}
