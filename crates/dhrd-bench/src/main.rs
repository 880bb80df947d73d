//! dhrd-bench: benchmarks that run dhrd and its baselines in the same invocation on the same
//! machine and report ratios (the machines are shared and noisy; absolute numbers from
//! different runs are not comparable). Writes `results.json` and `report.md` into the
//! output directory and prints the table.

mod engine;
mod machine;
mod report;

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
    /// Core engine: read_at vs memcpy, sync write vs pwrite+fdatasync/O_DSYNC, load rate vs
    /// O_DIRECT read, open-to-first-read vs size, chunk-size sweep.
    Engine(engine::EngineArgs),
}

#[derive(clap::Args, Clone)]
pub struct Common {
    /// Directory on the disk under test for backing files (needs a few GiB).
    #[arg(long, default_value = "/var/tmp/dhrd-bench")]
    pub dir: PathBuf,
    /// Where results go; default bench/results/<date>-<name>.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Small sizes and short runs (smoke test, seconds).
    #[arg(long)]
    pub quick: bool,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Engine(a) => engine::run(a),
    };
    if let Err(e) = r {
        eprintln!("dhrd-bench: {e:#}");
        std::process::exit(1);
    }
}
