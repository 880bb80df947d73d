//! The daemon's threads besides the transport's workers: the one that waits for the stop
//! signals, the walk, the progress line, the periodic flusher, and the stopper that
//! flushes and unmounts when asked.
//!
//! Invariants: the stop signals (SIGTERM, SIGINT, SIGHUP) are blocked in every thread
//! and taken by one thread with sigwait, so they never interrupt a request half-way; the
//! stopper flushes every file and syncs the backing before it unmounts.
//!
//! Crash semantics: a flush that fails is reported (`Mount::record_final_error`, and to
//! `dhrd umount`); the unmount goes on, and the daemon exits non-zero.

use crate::adapter::Unmounter;
use crate::error::{FsError, Result};
use crate::mount::{walk, Mount};
use crate::status::{human, load_totals};
use std::io::{IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the foreground progress line is refreshed.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Events that end the mount.
pub enum Stop {
    Signal(i32),
    /// `dhrd umount`: the reply goes to this connection once the unmount is done.
    Control(UnixStream),
}

fn setup(msg: String) -> FsError {
    FsError::Setup(msg)
}

/// The set of stop signals.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set.
    unsafe {
        let mut ss: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut ss);
        libc::sigaddset(&mut ss, libc::SIGTERM);
        libc::sigaddset(&mut ss, libc::SIGINT);
        libc::sigaddset(&mut ss, libc::SIGHUP);
        ss
    }
}

/// Blocks the stop signals in this thread and every thread it starts from now on (the
/// mask is inherited); `spawn_signals` waits for them.
pub fn block_stop_signals() {
    let ss = stop_signals();
    // SAFETY: pthread_sigmask of this thread with a set built above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &ss, std::ptr::null_mut());
    }
}

/// The thread that turns stop signals into `Stop::Signal`.
pub fn spawn_signals(tx: mpsc::Sender<Stop>) -> Result<()> {
    std::thread::Builder::new()
        .name("dhrd-signals".into())
        .spawn(move || loop {
            let ss = stop_signals();
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait on a set built locally; the signals are blocked.
            if unsafe { libc::sigwait(&ss, &mut sig) } != 0 {
                continue;
            }
            if tx.send(Stop::Signal(sig)).is_err() {
                return;
            }
        })
        .map_err(|e| setup(format!("spawning the signal thread: {e}")))?;
    Ok(())
}

/// The walk (or, without it, the note that there is none) once INIT has chosen the data
/// path; the progress line (`progress`); the periodic flusher (`period`).
pub fn spawn_background(m: &Arc<Mount>, progress: bool, period: Option<Duration>) -> Result<()> {
    let m2 = m.clone();
    std::thread::Builder::new()
        .name("dhrd-walk".into())
        .spawn(move || walk::run(m2))
        .map_err(|e| setup(format!("spawning the walk thread: {e}")))?;
    if progress {
        let m2 = m.clone();
        let _ = std::thread::Builder::new()
            .name("dhrd-progress".into())
            .spawn(move || progress_loop(m2));
    }
    if let Some(p) = period {
        let m2 = m.clone();
        let _ = std::thread::Builder::new()
            .name("dhrd-periodic".into())
            .spawn(move || {
                while !m2.is_shutting_down() {
                    std::thread::sleep(p);
                    // Data of every object, then the metadata (syncfs).
                    match m2.flush_all() {
                        Ok(()) => {
                            m2.stats().periodic_flushes.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => eprintln!("dhrd: periodic flush failed: {e}"),
                    }
                }
            });
    }
    Ok(())
}

fn progress_loop(sh: Arc<Mount>) {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last_print = Instant::now() - Duration::from_secs(3600);
    loop {
        std::thread::sleep(PROGRESS_INTERVAL);
        if sh.is_shutting_down() {
            return;
        }
        let l = load_totals(&sh);
        let (loaded, total) = (l.loaded, l.total);
        let done = l.complete && (sh.preload().done.load(Ordering::Acquire) || !sh.cfg().preload);
        let pct = (l.fraction() * 100.0).min(100.0);
        let secs = start.elapsed().as_secs_f64().max(0.001);
        let rate = loaded as f64 / secs;
        let eta = if rate > 0.0 {
            (total.saturating_sub(loaded)) as f64 / rate
        } else {
            0.0
        };
        let line = format!(
            "dhrd: loading {pct:5.1}% {} / {} ({}/s, ETA {eta:.0} s, {} files found)",
            human(loaded),
            human(total),
            human(rate as u64),
            sh.preload().files_seen.load(Ordering::Relaxed)
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
                "dhrd: load complete in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return;
        }
    }
}

/// The stopper: waits for a stop event, flushes, unmounts; the session then ends.
pub struct Stopper {
    thread: JoinHandle<()>,
    /// Set before the unmount lets the session end; cleared if the unmount failed.
    requested: Arc<AtomicBool>,
}

impl Stopper {
    pub fn spawn(
        m: Arc<Mount>,
        unmounter: Unmounter,
        mnt: PathBuf,
        events: mpsc::Receiver<Stop>,
    ) -> Result<Self> {
        let requested = Arc::new(AtomicBool::new(false));
        let r2 = requested.clone();
        let thread = std::thread::Builder::new()
            .name("dhrd-stop".into())
            .spawn(move || stop_loop(&m, unmounter, &mnt, events, &r2))
            .map_err(|e| setup(format!("spawning the stop thread: {e}")))?;
        Ok(Self { thread, requested })
    }

    /// After the session ended: a stop request being handled must finish writing its
    /// reply before the process exits.
    pub fn finish(self) {
        if self.requested.load(Ordering::Acquire) {
            let _ = self.thread.join();
        }
    }
}

fn stop_loop(
    m: &Mount,
    mut unmounter: Unmounter,
    mnt: &std::path::Path,
    events: mpsc::Receiver<Stop>,
    requested: &AtomicBool,
) {
    let mut tried_once = false;
    while let Ok(ev) = events.recv() {
        let flushed = m.flush_all();
        if let Err(e) = &flushed {
            m.record_final_error(format!("flush before unmount failed: {e}"));
        }
        // Set before the unmount lets the session end; cleared if it failed.
        requested.store(true, Ordering::Release);
        // fuser's unmounter gives up its mount on the first attempt, even a failed one,
        // and then reports every later attempt as done: a retry after a busy refusal
        // unmounts by the path instead.
        let r = if tried_once {
            rustix::mount::unmount(mnt, rustix::mount::UnmountFlags::empty())
                .map_err(std::io::Error::from)
        } else {
            unmounter.unmount()
        };
        tried_once = true;
        if r.is_err() && matches!(ev, Stop::Control(_)) {
            requested.store(false, Ordering::Release);
        }
        if answer(ev, &flushed, &r, mnt) {
            return;
        }
    }
}

/// Answers a stop event after the unmount `r`; whether the stopper is done.
fn answer(ev: Stop, flushed: &Result<()>, r: &std::io::Result<()>, mnt: &std::path::Path) -> bool {
    match ev {
        Stop::Control(mut c) => {
            let msg = match (flushed, r) {
                (Ok(()), Ok(())) => "ok\n".to_string(),
                (Err(e), _) => format!("error: flush failed: {e}\n"),
                (_, Err(e)) => format!("error: unmount of {} failed: {e}\n", mnt.display()),
            };
            let _ = c.write_all(msg.as_bytes());
            r.is_ok()
        }
        Stop::Signal(sig) => {
            if r.is_ok() {
                return true;
            }
            // Busy mount: detach it lazily so the daemon can finish; the data is flushed
            // already.
            eprintln!(
                "dhrd: signal {sig}: mount busy, detaching lazily: {}",
                r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
            );
            let _ = rustix::mount::unmount(mnt, rustix::mount::UnmountFlags::DETACH);
            true
        }
    }
}
