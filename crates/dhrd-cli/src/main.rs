//! `dhrd`: the command-line entry point. Each subcommand family lives in its own module and
//! only parses arguments and calls into the library crates; no storage logic lives here.

mod attach;
mod boot;
mod dist;
mod load;
mod metrics;
mod mount;
mod nbd;
mod nbd_tls;
mod nvm;
mod report;
mod timing;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dhrd",
    version,
    // A flag given twice takes its last value: the defaults file's flags come first.
    args_override_self = true,
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
    /// Show load progress, statistics and health of a running mount or attached directory.
    Status(mount::StatusArgs),
    /// Hold a directory's files in RAM, durable, in place: applications keep using DIR,
    /// the kernel serves it, the daemon warms, pins and keeps the durability mode.
    Attach(attach::AttachArgs),
    /// Stop holding an attached directory: undo what attach changed, make it durable.
    Detach(attach::DetachArgs),
    /// Export one backing file or block device as an NBD block device.
    // Boxed: its many options would make every other command's value as large.
    Nbd(Box<nbd::NbdArgs>),
    /// Open one backing file as a hybrid object, load it, and report (engine smoke test).
    Load(load::LoadArgs),
}

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Packaging only, so not a command of `Cli`: its man pages and completions list exactly
    // what users run. An option-like name, which no mount helper call starts with.
    if argv.get(1).is_some_and(|a| a == dist::FLAG) {
        if let Err(e) = dist::run(Cli::command(), &argv[1..]) {
            eprintln!("dhrd: {}", report::chain_text(&e));
            std::process::exit(1);
        }
        return;
    }
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    // mount(8) and umount(8) run their helpers by name (links to this binary); fuse3's
    // mount.fuse runs `dhrd BACKING MOUNTPOINT -o OPTIONS`.
    let helper = match invoked_as.as_deref() {
        Some(boot::MOUNT_HELPER_NAME) => Some((boot::MOUNT_HELPER_NAME, true)),
        Some(boot::UMOUNT_HELPER_NAME) => Some((boot::UMOUNT_HELPER_NAME, false)),
        _ => {
            let cmd = Cli::command();
            let mut names: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
            names.push("help");
            boot::is_fuse3_helper_call(&argv, &names).then_some((boot::MOUNT_HELPER_NAME, true))
        }
    };
    if let Some((name, mount)) = helper {
        let r = if mount {
            boot::run_mount_helper(&argv)
        } else {
            boot::run_umount_helper(&argv)
        };
        if let Err(e) = r {
            eprintln!("{name}: {}", report::chain_text(&e));
            // mount(8) and umount(8) read a helper's exit status as their own: 32 is
            // "mount failure" in both.
            std::process::exit(boot::HELPER_EXIT_FAILURE);
        }
        return;
    }
    let argv = match boot::with_config(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dhrd: {}", report::chain_text(&e));
            std::process::exit(1);
        }
    };
    let cli = Cli::parse_from(argv);
    let r = match cli.cmd {
        Cmd::Mount(a) => mount::run_mount(a),
        Cmd::Umount(a) => mount::run_umount(a),
        Cmd::Status(a) => mount::run_status(a),
        Cmd::Attach(a) => attach::run_attach(a),
        Cmd::Detach(a) => attach::run_detach(a),
        Cmd::Nbd(a) => nbd::run(*a),
        Cmd::Load(a) => load::run(a),
    };
    if let Err(e) = r {
        eprintln!("dhrd: {}", report::chain_text(&e));
        std::process::exit(1);
    }
}
