//! `dhrd attach`, `dhrd detach`: argument parsing for the in-place mode. All logic lives in
//! `dhrd_attach`; this module turns flags (and the defaults file) into an `AttachConfig`,
//! runs it in the foreground or as a background daemon, and tells systemd when it is
//! ready.

use anyhow::{bail, Context};
use clap::Args;
use dhrd_attach::AttachConfig;
use dhrd_engine::{parse_size, Durability};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Defaults of every `dhrd attach` when the file exists (`KEY=VALUE` lines).
pub const ATTACH_CONFIG_DEFAULT: &str = "/etc/dhrd/attach.conf";
/// How long `--daemon` waits for the background daemon to be attached (a `sync` attach in
/// a subdirectory flags every inode first).
const DAEMON_START_WAIT: Duration = Duration::from_secs(600);
const DAEMON_POLL_INTERVAL: Duration = Duration::from_millis(5);

#[derive(Args)]
pub struct AttachArgs {
    /// The directory to hold in RAM, durable; applications keep using it.
    pub dir: PathBuf,
    /// When writes and directory changes are durable: sync (before each call returns),
    /// fsync (at fsync and at detach), periodic:N (fsync plus a syncfs every N seconds)
    /// [default: sync].
    #[arg(long)]
    pub durability: Option<Durability>,
    /// RAM budget of the pinned pages, e.g. 4G [default: half of physical memory]. Files
    /// beyond it stay on the disk (and in the page cache while the kernel keeps them).
    #[arg(long)]
    pub mem: Option<String>,
    /// Warm-up threads [default: 4].
    #[arg(long)]
    pub loader_threads: Option<usize>,
    /// Cap on the warm-up's read rate in bytes per second, e.g. 200M [default: none].
    #[arg(long)]
    pub load_rate: Option<String>,
    /// No progress line on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run in the background: return once the directory is attached.
    #[arg(long)]
    pub daemon: bool,
    /// Defaults file: KEY=VALUE lines (durability=, mem=, loader_threads=), overridden by
    /// the command line [default: /etc/dhrd/attach.conf when it exists].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Args)]
pub struct DetachArgs {
    /// The attached directory.
    pub dir: PathBuf,
}

/// The defaults file's values: (durability, mem, loader_threads).
fn defaults(
    path: Option<&Path>,
) -> anyhow::Result<(Option<String>, Option<String>, Option<String>)> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None if Path::new(ATTACH_CONFIG_DEFAULT).exists() => PathBuf::from(ATTACH_CONFIG_DEFAULT),
        None => return Ok((None, None, None)),
    };
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let (mut d, mut m, mut t) = (None, None, None);
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            bail!("{} line {}: expected KEY=VALUE", path.display(), i + 1);
        };
        let v = v.trim().trim_matches('"').to_string();
        match k.trim().to_lowercase().as_str() {
            "durability" => d = Some(v),
            "mem" => m = Some(v),
            "loader_threads" => t = Some(v),
            other => bail!("{} line {}: unknown key {other:?}", path.display(), i + 1),
        }
    }
    Ok((d, m, t))
}

fn config(a: &AttachArgs) -> anyhow::Result<AttachConfig> {
    let (d, m, t) = defaults(a.config.as_deref())?;
    let durability = match (&a.durability, d) {
        (Some(d), _) => *d,
        (None, Some(s)) => s.parse().map_err(anyhow::Error::msg)?,
        (None, None) => Durability::Sync,
    };
    let mem_bytes = match a.mem.clone().or(m) {
        Some(s) => parse_size(&s).map_err(anyhow::Error::msg)?,
        None => dhrd_attach::default_mem_bytes(),
    };
    let warm_threads = match (a.loader_threads, t) {
        (Some(n), _) => n,
        (None, Some(s)) => s.parse().context("loader_threads")?,
        (None, None) => dhrd_pagecache::resident::RESIDENT_THREADS_DEFAULT,
    };
    Ok(AttachConfig {
        dir: a.dir.clone(),
        durability,
        mem_bytes,
        warm_threads: warm_threads.max(1),
        load_rate: a
            .load_rate
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(anyhow::Error::msg)?,
    })
}

pub fn run_attach(a: AttachArgs) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    if a.daemon {
        return spawn_daemon(&a.dir);
    }
    // Under systemd (Type=notify) the service is ready once the mode is in force.
    let notify = crate::boot::take_notify_socket();
    dhrd_attach::run(cfg, !a.quiet, |dir| {
        if let Some(sock) = &notify {
            let msg = format!("READY=1\nSTATUS=holding {}", dir.display());
            if let Err(e) = crate::boot::sd_notify(sock, &msg) {
                eprintln!("dhrd: telling systemd the attach is ready failed: {e}");
            }
        }
    })?;
    Ok(())
}

/// `--daemon`: runs this same command without `--daemon` in a new session, its output in
/// a log file next to the control socket, and returns once the directory is attached.
fn spawn_daemon(dir: &Path) -> anyhow::Result<()> {
    if dhrd_attach::is_attached(dir) {
        bail!(
            "{} is attached already (dhrd status {})",
            dir.display(),
            dir.display()
        );
    }
    std::fs::create_dir_all(dhrd_attach::control::CONTROL_DIR)?;
    let log_path = dhrd_attach::control::socket_path(dir)?.with_extension("log");
    let quiet_given = std::env::args_os().any(|x| x == "--quiet" || x == "-q");
    let b = crate::boot::Background {
        quiet_given,
        log_path: &log_path,
        start_wait: DAEMON_START_WAIT,
        poll_interval: DAEMON_POLL_INTERVAL,
        verb: "attach",
    };
    let pid = crate::boot::spawn_background(&b, || dhrd_attach::is_attached(dir))?;
    eprintln!(
        "dhrd: daemon {pid} holds {} (log: {})",
        dir.display(),
        log_path.display()
    );
    // The daemon's own warning went to its log: the user who started it sees it here.
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let not_held = dhrd_attach::status::mounts_inside_text(&canon);
    if !not_held.is_empty() {
        eprintln!("dhrd: warning: {}: {not_held}", dir.display());
    }
    Ok(())
}

pub fn run_detach(a: DetachArgs) -> anyhow::Result<()> {
    let msg = dhrd_attach::detach(&a.dir)?;
    eprintln!("dhrd: {msg}");
    Ok(())
}

/// `dhrd status DIR` of an attached directory; None if no attach daemon answers for it.
pub fn status(dir: &Path, json: bool, prometheus: bool) -> anyhow::Result<Option<String>> {
    if !dhrd_attach::is_attached(dir) {
        return Ok(None);
    }
    if !(json || prometheus) {
        return Ok(Some(dhrd_attach::request(dir, "status")?));
    }
    let out = dhrd_attach::request(dir, "status-json")?;
    let doc: serde_json::Value = serde_json::from_str(out.trim())
        .map_err(|e| anyhow::anyhow!("the daemon's status is not JSON ({e}): {out}"))?;
    if json {
        return Ok(Some(format!("{doc}\n")));
    }
    let d = dir.display().to_string();
    Ok(Some(crate::metrics::prometheus_text(
        "dhrd_attach",
        &[("dir", &d)],
        &doc,
    )))
}
