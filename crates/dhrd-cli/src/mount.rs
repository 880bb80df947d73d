//! `dhrd mount`, `dhrd umount`, `dhrd status`: argument parsing for the FUSE frontend. All
//! logic lives in `dhrd_fuse`; this module only turns flags into a `MountConfig`.

use anyhow::{bail, Context};
use clap::Args;
use dhrd_engine::parse_size;
use dhrd_engine::Durability;
use dhrd_fuse::{FsConfig, MountConfig, ReadPath};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long `--daemon` waits for the background daemon to have mounted (and a foreground
/// mount under systemd waits before it stops watching for readiness).
const DAEMON_START_WAIT: Duration = Duration::from_secs(30);
/// How often `--daemon` asks the new daemon whether the mount answers (the mount is
/// usually up within a few milliseconds; this is what the caller waits beyond that).
const DAEMON_POLL_INTERVAL: Duration = Duration::from_millis(2);

#[derive(Args)]
pub struct MountArgs {
    /// Directory holding the durable copy of every file (a plain directory, readable
    /// without dhrd).
    pub backing_dir: PathBuf,
    /// Where the file system appears (an empty directory).
    pub mountpoint: PathBuf,
    /// When writes and metadata changes are durable: sync (before each call returns),
    /// fsync (at fsync/unmount), periodic:N (fsync plus every N seconds).
    #[arg(long, default_value = "sync")]
    pub durability: Durability,
    /// Where file data lives and how it is read: auto (the backing files' page cache,
    /// served by the kernel through passthrough, where the kernel and the backing file
    /// system allow it, else engine-auto), pagecache (that, or fail), or the engine's RAM
    /// copy per file: engine-auto, engine-passthrough, engine-direct, engine-cached.
    #[arg(long, default_value = "auto")]
    pub read_path: ReadPath,
    /// RAM budget for file data shared by all files, e.g. 4G or 512M (default: half of
    /// physical memory): page cache pinned, or engine RAM. Data beyond it is served from
    /// the backing.
    #[arg(long)]
    pub mem: Option<String>,
    /// Page cache path: warm files into RAM but do not lock them there (the kernel may
    /// evict them under memory pressure).
    #[arg(long)]
    pub no_pin: bool,
    /// Chunk size of the RAM tier per file (power of two, 4K to 64M, e.g. 1M; default: the
    /// engine's).
    #[arg(long, value_parser = dhrd_engine::parse_chunk_size)]
    pub chunk: Option<u64>,
    /// Background threads that load (engine) or warm (page cache) files, shared by all.
    #[arg(long, default_value_t = dhrd_engine::LOADER_THREADS_DEFAULT)]
    pub loader_threads: usize,
    /// Cap on the background load rate in bytes per second, e.g. 200M (default: none).
    #[arg(long)]
    pub load_rate: Option<String>,
    /// FUSE worker threads: requests served at once before the next one queues in the
    /// kernel (each concurrent writer or reader holds one for its whole request).
    #[arg(long, default_value_t = dhrd_fuse::daemon::FUSE_THREADS_DEFAULT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=dhrd_fuse::daemon::FUSE_THREADS_MAX as u64))]
    pub threads: usize,
    /// Nice value of the FUSE worker threads: requests are served ahead of CPU-bound
    /// work, as the kernel's own I/O is (0 leaves them at the default priority).
    #[arg(long, default_value_t = dhrd_fuse::daemon::FUSE_WORKER_NICE_DEFAULT, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub worker_nice: i32,
    /// Directory listings with attributes (READDIRPLUS): auto (the kernel decides), always
    /// (best for du, find with stat tests, backups), off.
    #[arg(long, default_value = "auto")]
    pub readdirplus: dhrd_fuse::ReaddirPlus,
    /// Closed files whose objects (RAM tier, backing descriptor, memfd) are kept; beyond
    /// them, closed files up to 64 MiB stay in RAM as plain copies without descriptors.
    #[arg(long, default_value_t = dhrd_fuse::engine::objects::CLOSED_OBJECTS_MAX, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub object_cache: usize,
    /// Do not walk the tree at mount to preload files (they load when first opened).
    #[arg(long)]
    pub no_preload: bool,
    /// Let other users access the mount (FUSE allow_other).
    #[arg(long)]
    pub allow_other: bool,
    /// No progress line on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run in the background: return once the mount is up.
    #[arg(long)]
    pub daemon: bool,
    /// Defaults file: KEY=VALUE lines with the keys of the mount options (durability=,
    /// mem=, ...), overridden by the command line [default: /etc/dhrd/dhrd.conf when it
    /// exists].
    // Read before the command line is parsed (`boot::with_config`), which takes the flag
    // out: this field is here for the help text and is never set.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// If the daemon cannot unmount (busy mount, or the daemon died and left a dead mount),
    /// detach the mount anyway; the daemon flushes once its last user is gone.
    #[arg(long, short)]
    pub lazy: bool,
    /// If the daemon cannot unmount, abort the FUSE connection (umount -f): open files
    /// fail from then on.
    #[arg(long, short)]
    pub force: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// A dhrd mount point, or a directory held by `dhrd attach`.
    pub mountpoint: PathBuf,
    /// Print the status as one JSON object (stable field names, docs/fuse.md).
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the status in Prometheus text format (for a textfile collector or a scrape
    /// wrapper).
    #[arg(long)]
    pub prometheus: bool,
}

pub fn run_mount(a: MountArgs) -> anyhow::Result<()> {
    if a.daemon {
        return spawn_daemon(&a);
    }
    // Under systemd (Type=notify) the service is ready when the mount answers, not when
    // the process starts: units ordered after it must find the file system there.
    if let Some(sock) = crate::boot::take_notify_socket() {
        let mnt = a.mountpoint.clone();
        std::thread::Builder::new()
            .name("dhrd-notify".into())
            .spawn(move || notify_when_mounted(&sock, &mnt))
            .context("starting the readiness thread")?;
    }
    let mem_bytes = match &a.mem {
        Some(s) => parse_size(s).map_err(anyhow::Error::msg)?,
        None => dhrd_fuse::default_mem_bytes(),
    };
    let cfg = MountConfig {
        backing: a.backing_dir,
        mountpoint: a.mountpoint,
        fs: FsConfig {
            durability: a.durability,
            read_path: a.read_path,
            mem_bytes,
            chunk_bytes: a.chunk,
            loader_threads: a.loader_threads.max(1),
            load_rate: a
                .load_rate
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            preload: !a.no_preload,
            pin: !a.no_pin,
            readdirplus: a.readdirplus,
            object_cache: a.object_cache,
            dir_fds_max: dhrd_fuse::meta::nodes::DIR_FDS_MAX,
            linger_max: dhrd_fuse::page::LINGER_MAX,
            kept_fds_max: dhrd_fuse::durable::kept::KEPT_FDS_MAX,
        },
        allow_other: a.allow_other,
        threads: a.threads.max(1),
        worker_nice: a.worker_nice,
        progress: !a.quiet,
    };
    dhrd_fuse::run(cfg)?;
    Ok(())
}

/// Tells systemd `READY=1` once the mount at `mnt` answers. Gives up silently after
/// `DAEMON_START_WAIT`: systemd's own start timeout then fails the unit, and a daemon that
/// could not mount has exited with its message already.
fn notify_when_mounted(sock: &std::ffi::OsStr, mnt: &std::path::Path) {
    let t = Instant::now();
    while t.elapsed() < DAEMON_START_WAIT {
        if dhrd_fuse::control_request(mnt, "status").is_ok() {
            let msg = format!("READY=1\nSTATUS=serving {}", mnt.display());
            if let Err(e) = crate::boot::sd_notify(sock, &msg) {
                eprintln!("dhrd: telling systemd the mount is ready failed: {e}");
            }
            return;
        }
        std::thread::sleep(DAEMON_POLL_INTERVAL);
    }
}

/// `--daemon`: runs this same command without `--daemon` in a new session, with its output
/// in a log file next to the control socket, and returns once the mount answers.
fn spawn_daemon(a: &MountArgs) -> anyhow::Result<()> {
    // A daemon already serving the mountpoint would answer the readiness check below for
    // the new one, which is about to fail: refuse here with the real reason.
    if dhrd_fuse::control_request(&a.mountpoint, "status").is_ok() {
        bail!(
            "{} is already served by a dhrd daemon",
            a.mountpoint.display()
        );
    }
    std::fs::create_dir_all(dhrd_fuse::daemon::CONTROL_DIR)?;
    let sock = dhrd_fuse::daemon::control_socket(&a.mountpoint)?;
    let log_path = sock.with_extension("log");
    let b = crate::boot::Background {
        quiet_given: a.quiet,
        log_path: &log_path,
        start_wait: DAEMON_START_WAIT,
        poll_interval: DAEMON_POLL_INTERVAL,
        verb: "answer",
    };
    let pid = crate::boot::spawn_background(&b, || {
        dhrd_fuse::control_request(&a.mountpoint, "status").is_ok()
    })?;
    eprintln!(
        "dhrd: daemon {pid} serves {} (log: {})",
        a.mountpoint.display(),
        log_path.display()
    );
    Ok(())
}

pub fn run_umount(a: UmountArgs) -> anyhow::Result<()> {
    crate::boot::umount(&a.mountpoint, a.lazy, a.force)
}

pub fn run_status(a: StatusArgs) -> anyhow::Result<()> {
    if let Some(out) = crate::attach::status(&a.mountpoint, a.json, a.prometheus)? {
        print!("{out}");
        return Ok(());
    }
    if !(a.json || a.prometheus) {
        let out = dhrd_fuse::control_request(&a.mountpoint, "status")?;
        print!("{out}");
        return Ok(());
    }
    let out = dhrd_fuse::control_request(&a.mountpoint, "status-json")?;
    let doc: serde_json::Value = serde_json::from_str(out.trim())
        .map_err(|e| anyhow::anyhow!("the daemon's status is not JSON ({e}): {out}"))?;
    if a.json {
        println!("{doc}");
    } else {
        let mnt = a.mountpoint.display().to_string();
        print!(
            "{}",
            crate::metrics::prometheus_text("dhrd_mount", &[("mountpoint", &mnt)], &doc)
        );
    }
    Ok(())
}
