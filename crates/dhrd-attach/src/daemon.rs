//! Running an attach: the daemon's threads (the watch's events, the warm-up walk, the
//! periodic sync, the flag audit, the progress line, the control socket) and the orderly
//! stop on SIGTERM, SIGINT, SIGHUP or `dhrd detach`.
//!
//! Invariants: the control socket exists only once durability is in force (so a caller
//! that sees it answer, `--daemon` or systemd, knows the mode holds); the stop undoes every
//! change before the daemon replies `ok` or exits 0. Stop signals are blocked in every
//! thread and taken by one thread with `sigwait`.
//!
//! Crash semantics: a SIGKILL stops the threads, the pins and the watch; applications go
//! on using the directory (the kernel serves it), writes stay as durable as the mode made
//! them (the `sync` option or the flags stay), and the next attach or `dhrd detach` finds
//! the record. Nothing needs recovery.

use crate::attached::{audit_interval, AttachConfig, Attached};
use crate::check::SyncBy;
use crate::control::{self, CONTROL_DIR, CONTROL_LINE_MAX, CONTROL_TIMEOUT};
use crate::error::{Context, Result};
use crate::status;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the foreground progress line is refreshed.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Step of the background threads' sleeps, so they notice a stop promptly.
const SLEEP_STEP: Duration = Duration::from_millis(100);

/// Events that end the attach.
enum Stop {
    Signal(i32),
    Control(UnixStream),
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: builds a signal set in a local.
    unsafe {
        let mut ss: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut ss);
        libc::sigaddset(&mut ss, libc::SIGTERM);
        libc::sigaddset(&mut ss, libc::SIGINT);
        libc::sigaddset(&mut ss, libc::SIGHUP);
        ss
    }
}

/// Sleeps `d`, or less if the attach stops.
fn sleep_unless_stopped(a: &Attached, d: Duration) {
    let end = Instant::now() + d;
    while !a.stopping() {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(SLEEP_STEP));
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .during(|| format!("starting thread {name}"))
}

/// Attaches, serves until stopped, detaches. Returns Ok after every change was undone.
/// `on_ready` runs once durability is in force and the control socket answers.
pub fn run(
    cfg: AttachConfig,
    progress: bool,
    on_ready: impl FnOnce(&std::path::Path),
) -> Result<()> {
    let ss = stop_signals();
    // SAFETY: blocks the stop signals in this thread; threads made later inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &ss, std::ptr::null_mut()) };
    let a = Attached::start(cfg)?;
    let (stop_tx, stop_rx) = mpsc::channel::<Stop>();
    let listener = match bind_control(&a) {
        Ok(l) => l,
        Err(e) => {
            let _ = a.detach();
            return Err(e);
        }
    };
    let sock = control::socket_path_of_canonical(&a.dir);
    let _sock_guard = RemoveOnDrop(sock);
    {
        let tx = stop_tx.clone();
        spawn("dhrd-signals", move || loop {
            let ss = stop_signals();
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait on a set built locally; the signals are blocked.
            if unsafe { libc::sigwait(&ss, &mut sig) } != 0 {
                continue;
            }
            if tx.send(Stop::Signal(sig)).is_err() {
                return;
            }
        })?;
    }
    {
        let (a2, tx) = (a.clone(), stop_tx.clone());
        spawn("dhrd-control", move || control_server(&listener, &a2, &tx))?;
    }
    let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
        .map_err(std::io::Error::from)
        .during(|| "eventfd".into())?;
    let wake = Arc::new(wake);
    let threads = spawn_workers(&a, &wake, progress)?;
    drop(stop_tx);
    eprintln!(
        "dhrd: attached {} (durability {}: {}; ready in {:.3} s)",
        a.dir.display(),
        a.cfg.durability,
        a.sync_by,
        *a.ready_after_s.lock()
    );
    let not_held = crate::status::mounts_inside_text(&a.dir);
    if !not_held.is_empty() {
        eprintln!("dhrd: warning: {}: {not_held}", a.dir.display());
    }
    on_ready(&a.dir);
    let ev = stop_rx.recv().ok();
    if let Some(Stop::Signal(sig)) = &ev {
        eprintln!("dhrd: signal {sig}: detaching {}", a.dir.display());
    }
    a.shutdown.store(true, std::sync::atomic::Ordering::Release);
    let _ = rustix::io::write(&*wake, &1u64.to_ne_bytes());
    for t in threads {
        let _ = t.join();
    }
    let r = a.detach();
    if let Some(Stop::Control(mut c)) = ev {
        let msg = match &r {
            Ok(()) => "ok\n".to_string(),
            Err(e) => format!("error: {e}\n"),
        };
        let _ = c.write_all(msg.as_bytes());
    }
    match &r {
        Ok(()) => eprintln!("dhrd: detached {}", a.dir.display()),
        Err(e) => eprintln!("dhrd: detach of {} incomplete: {e}", a.dir.display()),
    }
    r
}

/// The threads that serve an attached directory until shutdown: the event watch (woken by
/// `wake` to stop), the warm-up walk, and when asked the periodic sync, the flag audit and
/// the progress line.
fn spawn_workers(
    a: &Arc<Attached>,
    wake: &Arc<rustix::fd::OwnedFd>,
    progress: bool,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    {
        let (a2, w2) = (a.clone(), wake.clone());
        threads.push(spawn("dhrd-watch", move || a2.watch_events(w2.as_fd()))?);
    }
    {
        let a2 = a.clone();
        threads.push(spawn("dhrd-walk", move || a2.warm_walk())?);
    }
    if let dhrd_engine::Durability::Periodic(p) = a.cfg.durability {
        let a2 = a.clone();
        threads.push(spawn("dhrd-periodic", move || {
            while !a2.stopping() {
                sleep_unless_stopped(&a2, p);
                if !a2.stopping() {
                    a2.periodic_sync();
                }
            }
        })?);
    }
    if a.sync_by == SyncBy::InodeFlags {
        let a2 = a.clone();
        threads.push(spawn("dhrd-audit", move || {
            while !a2.stopping() {
                sleep_unless_stopped(&a2, audit_interval());
                if !a2.stopping() {
                    let n = a2.audit_flags();
                    if n > 0 {
                        eprintln!("dhrd: the audit set {n} sync flag(s) found missing");
                    }
                }
            }
        })?);
    }
    if progress {
        let a2 = a.clone();
        threads.push(spawn("dhrd-progress", move || progress_loop(&a2))?);
    }
    Ok(threads)
}

fn bind_control(a: &Attached) -> Result<UnixListener> {
    std::fs::create_dir_all(CONTROL_DIR).during(|| CONTROL_DIR.into())?;
    let _ = std::fs::set_permissions(CONTROL_DIR, std::fs::Permissions::from_mode(0o700));
    let path = control::socket_path_of_canonical(&a.dir);
    // Nobody else can serve this directory (we hold its lock): a socket there is stale.
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).during(|| format!("control socket {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .during(|| format!("control socket {}", path.display()))?;
    Ok(l)
}

fn control_server(listener: &UnixListener, a: &Arc<Attached>, stop: &mpsc::Sender<Stop>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
        let mut line = String::new();
        let mut rd = BufReader::new((&conn).take(CONTROL_LINE_MAX as u64));
        if rd.read_line(&mut line).is_err() {
            continue;
        }
        match line.trim() {
            "status" => {
                let _ = conn.write_all(status::text(a).as_bytes());
            }
            "status-json" => {
                let _ = writeln!(conn, "{}", status::json(a));
            }
            "detach" => {
                // The reply is written once every change is undone.
                if stop.send(Stop::Control(conn)).is_err() {
                    return;
                }
            }
            other => {
                let _ = writeln!(conn, "error: unknown command {other:?}");
            }
        }
        if a.stopping() {
            return;
        }
    }
}

fn progress_loop(a: &Attached) {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last_print = Instant::now() - Duration::from_secs(3600);
    while !a.stopping() {
        sleep_unless_stopped(a, PROGRESS_INTERVAL);
        let l = status::load(a);
        let done = l.complete && a.walk_done.load(std::sync::atomic::Ordering::Acquire);
        let line = format!(
            "dhrd: warming {:5.1}% {} / {} pinned ({} files found)",
            l.fraction() * 100.0,
            status::human(l.loaded),
            status::human(l.total),
            a.walk_files.load(std::sync::atomic::Ordering::Relaxed)
        );
        if tty {
            eprint!("\r{line}\x1b[K");
            if done {
                eprintln!();
            }
        } else if done || last_print.elapsed() >= Duration::from_secs(5) {
            eprintln!("{line}");
            last_print = Instant::now();
        }
        if done {
            eprintln!(
                "dhrd: warm-up complete in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return;
        }
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
