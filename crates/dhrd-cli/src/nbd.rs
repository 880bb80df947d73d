//! `dhrd nbd`: exports one backing file, block device or Ceph RBD image as an NBD block
//! device.
//!
//! Only argument parsing, process plumbing (signals, the ready line) and wiring live here;
//! the protocol is `dhrd_nbd` and the storage is `dhrd_engine`.
//!
//! Invariants:
//! - SIGINT and SIGTERM are blocked before any thread starts, so only the dedicated signal
//!   thread receives them; the first one starts a graceful shutdown (stop accepting,
//!   finish in-flight requests, flush, exit 0), a second one exits at once;
//! - the ready line is printed to stdout only after the socket is listening.

use anyhow::{anyhow, bail, Context};
use clap::Args;
pub use dhrd_engine::parse_size;
use dhrd_engine::{Durability, LoaderConfig, ObjectConfig, RamBudget};
use dhrd_io::{DeviceProfile, WriteSync};
use dhrd_nbd::limits::{IDLE_EVICT_AFTER, MAX_CONNECTIONS, POLL_BEFORE_BLOCK};
use dhrd_nbd::server::ServeSummary;
use dhrd_nbd::{EngineTarget, ListenAddr, Prepared, Server, ServerConfig, ShutdownHandle};
use dhrd_rbd::{RbdOptions, RbdSpec};
use dhrd_stack::{BackingConfig, FastLayer, Layers, Object, Stack, StackConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("endpoint").required(true).args(["socket", "listen"]))]
pub struct NbdArgs {
    /// Backing regular file (created or extended to --size), block device, or Ceph RBD
    /// image as rbd:POOL/IMAGE (also rbd:POOL/NAMESPACE/IMAGE; @SNAP exports a snapshot
    /// read-only). A file whose name starts with "rbd:" is given as ./rbd:...
    #[arg(long)]
    pub backing: PathBuf,
    /// Export size for a regular file or RBD image (e.g. 1G, 512M, 4096); it is created or
    /// extended to it, never shrunk. Block devices are exported at their size.
    #[arg(long, value_parser = parse_export_size)]
    pub size: Option<u64>,
    /// ceph.conf for an rbd: backing (default: $CEPH_CONF, then /etc/ceph/ceph.conf).
    #[arg(long)]
    pub ceph_conf: Option<PathBuf>,
    /// Ceph client id for an rbd: backing, without "client." (default: admin).
    #[arg(long)]
    pub ceph_id: Option<String>,
    /// Fail a Ceph request after this many seconds (the export then turns read-only, as
    /// after any backing failure); default: wait for the cluster however long it is away.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rbd_op_timeout_secs: Option<u64>,
    /// How long to wait for the exclusive lock of an RBD image another client holds (a
    /// crashed holder's lock is freed by the cluster after osd_client_watch_timeout).
    #[arg(long, default_value_t = dhrd_rbd::DEFAULT_LOCK_WAIT.as_secs())]
    pub rbd_lock_wait_secs: u64,
    /// Directory where dhrd records which lock owner it is, so that a restart on this host
    /// after a crash breaks the dead process's lock at once instead of waiting for the
    /// cluster's watch timeout (default /run/dhrd/rbd; "none" to keep no record).
    #[arg(long, default_value = dhrd_rbd::DEFAULT_OWNER_RECORD_DIR)]
    pub rbd_owner_dir: String,
    /// Serve reads from RAM only while the image's lock was confirmed at the cluster
    /// within this many seconds, where another host may take the image over; it must be
    /// below osd_client_watch_timeout less objecter_tick_interval and a margin (refused
    /// otherwise; docs/rbd.md). Default: RAM serves reads until dhrd learns that it lost
    /// the lock (a request fails, or the check every second sees another owner).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rbd_read_lease_secs: Option<u64>,
    /// Listen on this Unix socket (created with mode 0600).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Listen on TCP ADDR:PORT; only loopback addresses unless --allow-remote.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback --listen address. Without --tls require and client
    /// authentication anyone who reaches it can read and overwrite the export (warned
    /// about at start and in the status file).
    #[arg(long)]
    pub allow_remote: bool,
    #[command(flatten)]
    pub tls: crate::nbd_tls::TlsArgs,
    /// Export name (clients asking for the default export "" get it too).
    #[arg(long, default_value = "")]
    pub name: String,
    /// RAM budget for the RAM tier (e.g. 2G). When the export is larger, RAM caches it:
    /// see --cache-policy, --cache-admit, --read-ahead and --no-prefill.
    #[arg(long, value_parser = parse_size)]
    pub mem: Option<u64>,
    /// Which chunk leaves RAM when a read needs room once --mem is full: s3fifo (scan
    /// resistant), clock, or off (RAM keeps what filled it first).
    #[arg(long, default_value_t = dhrd_engine::CachePolicy::default())]
    pub cache_policy: dhrd_engine::CachePolicy,
    /// Which read misses bring their chunk into RAM once --mem is full: second (on a
    /// second miss, or at once if evicted recently; one-off reads bypass RAM) or always.
    #[arg(long, default_value_t = dhrd_engine::Admission::default())]
    pub cache_admit: dhrd_engine::Admission,
    /// Read-ahead into RAM: none, sequential (a doubling window), or history (on a
    /// second access with recently read neighbours).
    #[arg(long, default_value_t = dhrd_engine::ReadAhead::default())]
    pub read_ahead: dhrd_engine::ReadAhead,
    /// Largest read-ahead window, in chunks.
    #[arg(long, default_value_t = dhrd_engine::ahead::WINDOW_MAX_CHUNKS_DEFAULT,
        value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub read_ahead_max_chunks: u64,
    /// Do not copy the export into RAM in the background at start: RAM fills only with
    /// what is read (admission, read-ahead) and written (a pure cache).
    #[arg(long)]
    pub no_prefill: bool,
    /// Touch every page of the RAM tier before the load starts (MADV_POPULATE_WRITE), so
    /// the load writes into memory already there; the load is then timed from the end of
    /// the pre-fault. For measuring the load apart from the cost of fresh RAM
    /// (docs/rbd.md); it costs the same time, at the start.
    #[arg(long)]
    pub prefault_ram: bool,
    /// A file on non-volatile memory (a pmem/DAX mount) for writes: with --ram-kind nvm,
    /// a write is acknowledged once it is in this file and written back to the backing in
    /// the background; after a crash the dirty chunks are served from it and written back.
    #[arg(long, requires = "ram_kind")]
    pub ram_file: Option<PathBuf>,
    /// What --ram-file is: nvm (non-volatile; enables write-back). DRAM is never treated
    /// as non-volatile: a --ram-file on tmpfs or ramfs is refused.
    #[arg(long, value_enum, requires = "ram_file")]
    pub ram_kind: Option<crate::nvm::RamKind>,
    /// Device timing of the --ram-file (e.g. nvm), as --backing-timing.
    #[arg(long, value_name = "PROFILE", value_parser = crate::timing::parse, requires = "ram_file")]
    pub ram_timing: Option<DeviceProfile>,
    /// At a clean stop, wait this long for the write-back to finish (what is left stays
    /// safe in the --ram-file or --tier-ssd).
    #[arg(long, default_value_t = 60)]
    pub writeback_drain_secs: u64,
    /// Tiered device (SPEC T1): an SSD file caching the --backing (the slow lower tier)
    /// in chunk slots: hot chunks are promoted, writes are durable on the SSD and written
    /// back (or written through, --tier-mode).
    #[arg(long, requires = "tier_ssd_size", conflicts_with = "ram_file")]
    pub tier_ssd: Option<PathBuf>,
    /// Size of the SSD cache tier (e.g. 10G).
    #[arg(long, value_parser = parse_size, requires = "tier_ssd")]
    pub tier_ssd_size: Option<u64>,
    /// writeback (durable on the SSD, written back later) or writethrough.
    #[arg(long, default_value = "writeback", requires = "tier_ssd")]
    pub tier_mode: dhrd_tier::TierMode,
    /// Device timing of the --tier-ssd, as --backing-timing.
    #[arg(long, value_name = "PROFILE", value_parser = crate::timing::parse, requires = "tier_ssd")]
    pub tier_ssd_timing: Option<DeviceProfile>,
    /// The --tier-ssd or --ram-file records which backing it caches. When it was made for
    /// another backing (or this one was moved or copied), or the backing was changed
    /// while dhrd was not running over it, its clean chunks are dropped, and while it
    /// holds dirty chunks dhrd refuses to start. This flag keeps those dirty chunks and
    /// writes them back over the backing instead.
    #[arg(long)]
    pub adopt_cache: bool,
    /// Start although the backing is marked as lacking data that a --tier-ssd or
    /// --ram-file holds (that cache was not stopped cleanly, or its write-back did not
    /// finish): without that cache, or with another one, its data is lost for the backing.
    /// The mark is removed, or replaced by the new cache's.
    #[arg(long)]
    pub drop_cache_mark: bool,
    /// sync (every write durable before its reply), fsync (durable at FLUSH/FUA) or
    /// periodic:N (fsync plus a flush every N seconds).
    #[arg(long, default_value = "sync")]
    pub durability: Durability,
    /// How writes reach a file or block device backing: direct (whole aligned blocks
    /// through O_DIRECT with RWF_DSYNC, one device operation each, unaligned writes sent
    /// as the blocks around them; concurrent writers reach the device in parallel),
    /// fdatasync (buffered, one shared sync per batch of concurrent writers) or dsync (each
    /// write opened O_DSYNC). Default: direct in `sync` durability, fdatasync otherwise.
    /// Where the file system refuses direct I/O, direct falls back to fdatasync and says
    /// so at start.
    #[arg(long, value_parser = ["direct", "fdatasync", "dsync"])]
    pub backing_sync: Option<String>,
    /// Write the export's status every second to this file as JSON (stable field names,
    /// docs/nbd.md) and to FILE.prom in Prometheus text format (for a textfile
    /// collector); both replaced atomically.
    #[arg(long)]
    pub status_file: Option<PathBuf>,
    /// Export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Chunk size of the RAM tier's loader (power of two, e.g. 1M; default 1M, or the
    /// object size of an RBD image).
    #[arg(long, value_parser = dhrd_engine::parse_chunk_size)]
    pub chunk: Option<u64>,
    /// Threads loading chunks into RAM in the background (each has one chunk's read in
    /// flight; an RBD backing splits it into several requests).
    #[arg(long, default_value_t = dhrd_engine::LOADER_THREADS_DEFAULT)]
    pub loader_threads: usize,
    /// Cap the background load rate (bytes per second, e.g. 200M); default unlimited.
    #[arg(long, value_parser = parse_size)]
    pub load_rate: Option<u64>,
    /// Clients served at once. When all slots are taken, a new client gets the slot of
    /// the connection idle longest (see --idle-evict-secs), or is refused.
    #[arg(
        long,
        default_value_t = MAX_CONNECTIONS as u64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_connections: u64,
    /// When all slots are taken, a connection with no request in flight for this many
    /// seconds may be closed to let a new client in.
    #[arg(
        long,
        default_value_t = IDLE_EVICT_AFTER.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub idle_evict_secs: u64,
    /// Close a connection with no request in flight for this many seconds even when no
    /// other client needs its slot; default: idle clients stay while slots are free.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_secs: Option<u64>,
    /// Poll a connection's socket for this many microseconds before blocking for the next
    /// request: a small read's round trip loses the wake-up of a blocked reader (about
    /// 20 us on a VM), for up to one CPU spent polling while clients are active. 0: off.
    #[arg(
        long,
        default_value_t = POLL_BEFORE_BLOCK.as_micros() as u64,
        value_parser = clap::value_parser!(u64).range(0..=10_000)
    )]
    pub poll_us: u64,
    /// Emulate a slower device (file or RBD backing alike): each backing operation takes
    /// at least the profile's latency plus its transfer time on a bandwidth shared by all
    /// requests. ssd, hdd, nvm or READ_US,WRITE_US,SYNC_US,MBPS (MBPS 0: unlimited).
    #[arg(long, value_name = "PROFILE", value_parser = crate::timing::parse)]
    pub backing_timing: Option<DeviceProfile>,
    /// Log connection events, and the engine's statistics at exit, to stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it starts).
fn block_signals() -> anyhow::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it; pthread_sigmask
    // only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

/// The signal thread: first signal = graceful shutdown, second = immediate exit.
fn spawn_signal_thread(set: libc::sigset_t, h: ShutdownHandle) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("dhrd-nbd-signals".into())
        .spawn(move || {
            let mut first = true;
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is an initialised sigset; sigwait writes one int.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                if first {
                    eprintln!("dhrd nbd: signal {sig}: finishing in-flight requests, then exiting");
                    h.shutdown();
                    first = false;
                } else {
                    eprintln!("dhrd nbd: second signal {sig}: exiting now");
                    std::process::exit(130);
                }
            }
        })?;
    Ok(())
}

/// `--size`: a size as `parse_size` reads it, and at least one byte (an export of nothing
/// is refused here, before a backing file is made for it).
fn parse_export_size(s: &str) -> std::result::Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!(
            "an export of {s:?} bytes holds nothing: give a size of at least 1"
        )),
        n => Ok(n),
    }
}

pub fn run(a: NbdArgs) -> anyhow::Result<()> {
    let sigset = block_signals()?;
    let scfg = server_config(&a)?;
    let security = Arc::new(crate::nbd_tls::Security::of(&scfg));
    // Before the backing is created or opened: a start that cannot serve (limits, TLS
    // credentials, the address) makes nothing.
    let prepared = Prepared::new(scfg)?;
    if let Some(path) = &a.status_file {
        dhrd_io::replace::check_replaceable(path)
            .with_context(|| format!("--status-file {}", path.display()))?;
    }
    let started = Instant::now();
    let mut stack = open_stack(&a)?;
    if a.prefault_ram {
        // The load's own clock starts after the pre-fault: its cost is reported apart.
        eprintln!(
            "dhrd nbd: RAM pre-faulted in {:.2} s",
            started.elapsed().as_secs_f64()
        );
    }
    stack.notices().iter().for_each(crate::nvm::say);
    report_load_when_done(stack.object().clone());
    let target = Arc::new(EngineTarget::new(stack.object().clone(), a.read_only));
    if let Some(w) = &security.warning {
        eprintln!("dhrd nbd: warning: {w}");
    }
    let server = Server::on(prepared, Arc::clone(&target))?;
    if let Some(path) = &a.status_file {
        let h = server.shutdown_handle();
        let (obj, layers) = (stack.object().clone(), stack.layers().clone());
        spawn_status_writer(path.clone(), obj, layers, h, Arc::clone(&security))?;
    }
    spawn_signal_thread(sigset, server.shutdown_handle())?;
    say_ready(&a, &stack, &security, server.local_addr())?;
    let summary = server.run().context("serving")?;
    let closed = stack.close_object();
    say_stopped(&summary, &closed);
    if a.verbose {
        eprintln!("{}", stack.object().stats());
    }
    let failure = stack.object().failure();
    let drain = Duration::from_secs(a.writeback_drain_secs);
    crate::nvm::say_released(&stack.release(drain), drain);
    if let Some(f) = failure {
        eprintln!("dhrd nbd: the export turned read-only after a backing failure: {f}");
    }
    closed.context("final flush")?;
    Ok(())
}

/// The server's settings from the arguments (a bad TLS setting fails here, before the
/// backing is opened).
fn server_config(a: &NbdArgs) -> anyhow::Result<ServerConfig> {
    let listen = match (&a.socket, a.listen) {
        (Some(p), None) => ListenAddr::Unix(p.clone()),
        (None, Some(addr)) => ListenAddr::Tcp(addr),
        _ => bail!("give exactly one of --socket PATH or --listen ADDR:PORT"),
    };
    let mut scfg = ServerConfig::new(listen);
    scfg.name = a.name.clone();
    scfg.allow_remote = a.allow_remote;
    scfg.verbose = a.verbose;
    scfg.max_connections = usize::try_from(a.max_connections).unwrap_or(usize::MAX);
    scfg.idle_evict_after = Duration::from_secs(a.idle_evict_secs);
    scfg.idle_timeout = a.idle_timeout_secs.map(Duration::from_secs);
    scfg.poll_before_block = Duration::from_micros(a.poll_us);
    scfg.tls = a.tls.config()?;
    Ok(scfg)
}

/// Opens the stack the arguments describe (`dhrd_stack`), with this command's words for
/// what the library cannot know: which flag would fix a refusal.
fn open_stack(a: &NbdArgs) -> anyhow::Result<Stack> {
    let cfg = StackConfig {
        backing: backing_config(a)?,
        fast: fast_layer(a)?,
        adopt_cache: a.adopt_cache,
        drop_cache_mark: a.drop_cache_mark,
        chunk_bytes: a.chunk,
        object: object_config(a),
    };
    Stack::open(cfg).map_err(|e| match e {
        dhrd_stack::Error::Empty { .. } => anyhow!("{e}; pass --size to export it"),
        dhrd_stack::Error::Volatile { .. } => anyhow!("--ram-file: {e}, or drop --ram-kind nvm"),
        e => e.into(),
    })
}

/// The backing the arguments name: an RBD image for `rbd:...`, else a file or device.
fn backing_config(a: &NbdArgs) -> anyhow::Result<BackingConfig> {
    let name = a.backing.to_string_lossy();
    let rbd = if RbdSpec::is_rbd(&name) {
        let spec = RbdSpec::parse(&name)?;
        RbdOptions {
            conf: a.ceph_conf.clone(),
            id: a.ceph_id.clone(),
            op_timeout: a.rbd_op_timeout_secs.map(Duration::from_secs),
            lock_wait: Duration::from_secs(a.rbd_lock_wait_secs),
            owner_record: owner_record_dir(a).map(|d| dhrd_rbd::owner_record_in(&d, &spec)),
            read_lease: a.rbd_read_lease_secs.map(Duration::from_secs),
            ..Default::default()
        }
    } else {
        if a.ceph_conf.is_some()
            || a.ceph_id.is_some()
            || a.rbd_op_timeout_secs.is_some()
            || a.rbd_read_lease_secs.is_some()
        {
            bail!(
                "--ceph-conf, --ceph-id, --rbd-op-timeout-secs and --rbd-read-lease-secs \
                 apply to an rbd: backing only"
            );
        }
        if !a.backing.exists() && a.size.is_none() {
            bail!(
                "{} does not exist; pass --size to create it",
                a.backing.display()
            );
        }
        RbdOptions::default()
    };
    Ok(BackingConfig {
        create: true,
        min_len: a.size,
        write_sync: a.backing_sync.as_deref().map(|s| match s {
            "direct" => WriteSync::DirectDsync,
            "dsync" => WriteSync::ODsync,
            _ => WriteSync::Fdatasync,
        }),
        rbd,
        timing: a.backing_timing,
        ..BackingConfig::new(&a.backing)
    })
}

/// The fast layer the arguments ask for: --tier-ssd, --ram-file with --ram-kind nvm, or
/// none.
fn fast_layer(a: &NbdArgs) -> anyhow::Result<Option<FastLayer>> {
    if let (Some(file), Some(bytes)) = (&a.tier_ssd, a.tier_ssd_size) {
        if a.read_only {
            bail!("--tier-ssd takes writes; it cannot be combined with --read-only");
        }
        let (mode, timing) = (a.tier_mode, a.tier_ssd_timing);
        let file = file.clone();
        return Ok(Some(FastLayer::Ssd {
            file,
            bytes,
            mode,
            timing,
        }));
    }
    match (&a.ram_file, a.ram_kind) {
        (Some(_), Some(crate::nvm::RamKind::Nvm)) if a.read_only => {
            bail!("--ram-kind nvm takes writes; it cannot be combined with --read-only")
        }
        (Some(f), Some(crate::nvm::RamKind::Nvm)) => Ok(Some(FastLayer::Nvm {
            file: f.clone(),
            timing: a.ram_timing,
        })),
        (Some(_), Some(crate::nvm::RamKind::Dram)) => bail!(
            "--ram-kind dram: DRAM is volatile, so writes stay write-through and a --ram-file \
             has no use; give --ram-kind nvm for a file on non-volatile memory"
        ),
        _ => Ok(None),
    }
}

/// The hybrid object's settings: a fixed-size export, and the RAM tier's cache mode.
fn object_config(a: &NbdArgs) -> ObjectConfig {
    ObjectConfig {
        durability: a.durability,
        budget: a.mem.map(RamBudget::new),
        fixed_len: true,
        read_only: a.read_only,
        name: String::from("dhrd-nbd"),
        loader_config: LoaderConfig {
            rate_bytes_per_s: a.load_rate,
            threads: a.loader_threads.clamp(1, dhrd_engine::LOADER_THREADS_MAX),
            ..Default::default()
        },
        cache: dhrd_engine::CacheConfig {
            policy: a.cache_policy,
            admission: a.cache_admit,
            read_ahead: a.read_ahead,
            read_ahead_window_max_chunks: a.read_ahead_max_chunks,
            prefill: !a.no_prefill,
        },
        ram: dhrd_engine::RamOptions {
            prefault: a.prefault_ram,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The ready line on stdout, once the socket listens. The timing is part of it so that a
/// benchmark's log shows what device the numbers were measured on.
fn say_ready(
    a: &NbdArgs,
    stack: &Stack,
    security: &crate::nbd_tls::Security,
    addr: impl std::fmt::Display,
) -> anyhow::Result<()> {
    let size = stack.object().len();
    let cache = a
        .mem
        .filter(|m| *m < size)
        .map(|m| {
            format!(
                ", RAM {m} bytes caching it: evict {}, admit {}, read-ahead {}{}",
                a.cache_policy,
                a.cache_admit,
                a.read_ahead,
                if a.no_prefill { ", no prefill" } else { "" }
            )
        })
        .unwrap_or_default();
    let timing = |p: Option<DeviceProfile>, what: &str| {
        p.map(|p| format!("{what} timing {p}")).unwrap_or_default()
    };
    let layers = stack.layers();
    let tier = match (&a.tier_ssd, &layers.tier) {
        (Some(f), Some(_)) => format!(
            ", cached on SSD tier {} ({}{})",
            f.display(),
            a.tier_mode,
            timing(a.tier_ssd_timing, ", SSD")
        ),
        _ => String::new(),
    };
    let nvm = match (&a.ram_file, &layers.writeback) {
        (Some(f), Some(_)) => format!(
            ", writes acknowledged on NVM {} and written back{}",
            f.display(),
            a.ram_timing
                .map(|p| format!(" (NVM timing {p})"))
                .unwrap_or_default()
        ),
        _ => String::new(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "dhrd nbd: serving {} ({size} bytes, durability {}{}{}{cache}{}{tier}{nvm}) as export \
         {:?} on {}",
        stack.description(),
        a.durability,
        security.describe(),
        if a.read_only { ", read-only" } else { "" },
        timing(a.backing_timing, ", backing"),
        a.name,
        addr
    )?;
    out.flush()?;
    Ok(())
}

/// The exit line: how many clients were served, and whether the final flush worked.
fn say_stopped(summary: &ServeSummary, closed: &dhrd_engine::Result<()>) {
    eprintln!(
        "dhrd nbd: stopped after {} connection(s) ({} refused, {} idle ones evicted for new \
         clients, {} closed by the idle timeout){}; {}",
        summary.connections,
        summary.refused,
        summary.evicted,
        summary.idle_closed,
        if summary.abandoned > 0 {
            format!(", {} did not finish in time", summary.abandoned)
        } else {
            String::new()
        },
        match closed {
            Ok(()) => "all writes flushed".to_string(),
            Err(e) => format!("final flush FAILED: {e}"),
        }
    );
}

/// The directory of the RBD owner records: none for "none"; the default only if it can be
/// created (it needs root), with a warning otherwise; a directory given explicitly must
/// work, or the open fails.
fn owner_record_dir(a: &NbdArgs) -> Option<PathBuf> {
    if a.rbd_owner_dir == "none" {
        return None;
    }
    let dir = PathBuf::from(&a.rbd_owner_dir);
    if a.rbd_owner_dir == dhrd_rbd::DEFAULT_OWNER_RECORD_DIR {
        use std::os::unix::fs::DirBuilderExt;
        let made = match dir.exists() {
            true => Ok(()),
            false => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir),
        };
        if let Err(e) = made {
            eprintln!(
                "dhrd nbd: warning: no owner record in {} ({e}): after a crash, a restart \
                 waits for the cluster to expire the lock (--rbd-owner-dir)",
                dir.display()
            );
            return None;
        }
    }
    Some(dir)
}

/// Prints one line when the background load finishes (tests and operators wait for it).
fn report_load_when_done(obj: Object) {
    let _ = std::thread::Builder::new()
        .name("dhrd-nbd-load".into())
        .spawn(move || {
            let done = obj.wait_loaded(None);
            let p = obj.progress();
            if done {
                eprintln!(
                    "dhrd nbd: loaded {} bytes into RAM in {:.2} s",
                    p.bytes_total,
                    p.elapsed.as_secs_f64()
                );
            } else {
                eprintln!(
                    "dhrd nbd: load incomplete: {}/{} chunks loaded, {} failed, {} over the RAM budget (served from the backing)",
                    p.chunks_loaded, p.chunks_total, p.chunks_failed, p.chunks_over_budget
                );
            }
        });
}

/// How often `--status-file` is rewritten.
const STATUS_FILE_INTERVAL: Duration = Duration::from_secs(1);

/// Writes `content` to `path` through a temporary file of a random name and a rename, so
/// a reader never sees half a status and a name planted in the directory (which may be
/// writable by others: a textfile collector's, /tmp) is never followed.
fn replace_file(path: &std::path::Path, content: &str) -> std::io::Result<()> {
    dhrd_io::replace::replace_file(path, content.as_bytes(), 0o644, false)
}

/// Writes the status file now (so that a bad path fails the start) and every second: the
/// stack's status document (`dhrd_stack::status`, stable names, docs/nbd.md) with the
/// server's connections and security.
fn spawn_status_writer(
    path: PathBuf,
    obj: Object,
    layers: Layers,
    h: ShutdownHandle,
    security: Arc<crate::nbd_tls::Security>,
) -> anyhow::Result<()> {
    let mut prom = path.as_os_str().to_owned();
    prom.push(".prom");
    let prom = PathBuf::from(prom);
    let shown = path.clone();
    let write = move || -> std::io::Result<()> {
        let mut doc = dhrd_stack::status(&obj, &layers.stats());
        let connections = serde_json::json!({"open": h.active_connections(),
            "evicted": h.evicted_connections(), "refused": h.refused_connections(),
            "idle_closed": h.idle_closed_connections()});
        doc.insert("connections".into(), connections);
        for (k, v) in security.status(&h.stats()) {
            doc.insert(k.into(), v);
        }
        let doc = serde_json::Value::Object(doc);
        replace_file(&path, &format!("{doc}\n"))?;
        let text = crate::metrics::prometheus_text("dhrd_nbd", &[], &doc);
        replace_file(&prom, &text)
    };
    write().with_context(|| format!("--status-file {}", shown.display()))?;
    std::thread::Builder::new()
        .name("dhrd-nbd-status".into())
        .spawn(move || loop {
            std::thread::sleep(STATUS_FILE_INTERVAL);
            if let Err(e) = write() {
                eprintln!("dhrd nbd: status file: {e}");
            }
        })?;
    Ok(())
}
