//! dhrd-bench: benchmarks that run dhrd and its baselines in the same invocation on the same
//! machine and report ratios (the machines are shared and noisy; absolute numbers from
//! different runs are not comparable). Writes `results.json` and `report.md` into the
//! output directory and prints the table.
//!
//! The file workloads (`fileserver`, `metaops`, `video`) are the exception: they measure one
//! directory on any file system and print one JSON object on stdout, for an orchestrator
//! that runs them on each target and makes the comparison.

mod cachesim;
mod engine;
mod fileio;
mod fileserver;
mod fuse_transport;
mod machine;
mod metaops;
mod rbdread;
mod rehypar;
mod rehypar_io;
mod replay;
mod report;
mod video;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "dhrd-bench", about = "dhrd benchmarks with same-run baselines")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The engine's cache policies and Belady's optimum over a fio I/O log or a zipf
    /// trace, at chunk granularity: prints JSON.
    CacheSim(cachesim::CacheSimArgs),
    /// Core engine: read_at vs memcpy, durable write vs raw O_DIRECT|O_DSYNC, load rate vs
    /// O_DIRECT read, open-to-first-read vs size, chunk-size sweep.
    Engine(engine::EngineArgs),
    /// Filebench's fileserver personality on any directory (FUSE mount, tmpfs, ext4, ...):
    /// prints one JSON object on stdout.
    Fileserver(fileserver::FileserverArgs),
    /// FUSE transport cost: a raw-protocol null server over /dev/fuse (1 and 8 threads) and
    /// over io_uring (per-CPU pinned queues) against tmpfs, fio 4 KiB QD1 (root; sets
    /// fuse.enable_uring for the run and restores it).
    FuseTransport(fuse_transport::FuseTransportArgs),
    /// Metadata rate (mdtest-like): threads create, stat and unlink empty files in
    /// directories of their own, on any directory: prints one JSON object on stdout.
    Metaops(metaops::MetaopsArgs),
    /// The fair baseline of dhrd's load from Ceph RBD: a plain librbd client reads the
    /// whole image into a fresh memfd with dhrd's request size and depth: prints JSON.
    RbdRead(rbdread::RbdReadArgs),
    /// Fast-tier space allocators (ReHypar, extent first/best-fit, buckets) on the same
    /// allocation traces: utilisation and fragmentation as JSON on stdout.
    Rehypar(rehypar::RehyparArgs),
    /// ReHypar's measured claim: small synchronous file writes packed into ReHypar extents
    /// against first-fit per-file writes, into one device file: throughput and space
    /// utilisation as JSON on stdout.
    RehyparIo(rehypar_io::RehyparIoArgs),
    /// Replay an SPC, MSR or DiskSim block trace against a file or block device, with
    /// verification against a shadow copy (docs/replay.md).
    Replay(replay::ReplayArgs),
    /// The paper's video-editing experiment (read, modify 10%, write a new file; rounds)
    /// on any directory: prints one JSON object on stdout.
    Video(video::VideoArgs),
}

#[derive(clap::Args, Clone)]
pub struct Common {
    /// Directory on the disk under test for backing files (needs a few GiB).
    #[arg(long, default_value = "/var/tmp/dhrd-bench")]
    pub dir: PathBuf,
    /// Where results go; default a new bench/results/<date>-<name>-<profile>[-n].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Small sizes and short runs (smoke test, seconds).
    #[arg(long)]
    pub quick: bool,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::CacheSim(a) => cachesim::run(a),
        Cmd::Engine(a) => engine::run(a),
        Cmd::Fileserver(a) => fileserver::run(a),
        Cmd::FuseTransport(a) => fuse_transport::run(a),
        Cmd::Metaops(a) => metaops::run(a),
        Cmd::RbdRead(a) => rbdread::run(a),
        Cmd::Rehypar(a) => rehypar::run(a),
        Cmd::RehyparIo(a) => rehypar_io::run(a),
        Cmd::Replay(a) => replay::run(a),
        Cmd::Video(a) => video::run(a),
    };
    if let Err(e) = r {
        eprintln!("dhrd-bench: {e:#}");
        std::process::exit(1);
    }
}
