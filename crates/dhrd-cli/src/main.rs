//! `dhrd`: the command-line entry point. Each subcommand family lives in its own module and
//! only parses arguments and calls into the library crates; no storage logic lives here.

mod load;
mod metrics;
mod mount;
mod nbd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dhrd",
    version,
    about = "Durable hybrid RAM disk: RAM-speed reads, SSD durability"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING_DIR at MOUNTPOINT as a durable RAM file system (FUSE).
    Mount(mount::MountArgs),
    /// Flush and unmount a dhrd mount.
    Umount(mount::UmountArgs),
    /// Show load progress, statistics and health of a running mount.
    Status(mount::StatusArgs),
    /// Export one backing file or block device as an NBD block device.
    Nbd(nbd::NbdArgs),
    /// Open one backing file as a hybrid object, load it, and report (engine smoke test).
    Load(load::LoadArgs),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Mount(a) => mount::run_mount(a),
        Cmd::Umount(a) => mount::run_umount(a),
        Cmd::Status(a) => mount::run_status(a),
        Cmd::Nbd(a) => nbd::run(a),
        Cmd::Load(a) => load::run(a),
    };
    if let Err(e) = r {
        eprintln!("dhrd: {e:#}");
        std::process::exit(1);
    }
}
