//! Running a mount (`run`): the checks of the command-line input and the backing-directory
//! lock (`prepare`), the control socket for `dhrd status` and `dhrd umount` (`control`),
//! the FUSE session with its worker threads (`adapter`), the background threads and the
//! orderly shutdown on SIGTERM / SIGINT / `dhrd umount` (`threads`).
//!
//! Invariants:
//! - Nothing is mounted unless every check passed and the backing directory's lock is
//!   held (prepare.rs).
//! - Shutdown order: flush every object and sync metadata, unmount, then (in `destroy`)
//!   close every object; the process exits 0 only when that succeeded.
//!
//! Crash semantics: a SIGKILL leaves a dead FUSE mount (clean it with `fusermount3 -uz` or
//! `umount -l`) and a backing directory holding every acknowledged write (sync mode) or
//! every write up to the last flush (fsync / periodic modes). Nothing needs recovery.

mod control;
mod prepare;
mod threads;

pub use control::{
    control_request, control_socket, umount, CONTROL_DIR, CONTROL_LINE_MAX, CONTROL_TIMEOUT,
    UMOUNT_EXIT_WAIT,
};
pub use prepare::{prepare, FDS_PER_OBJECT, FDS_RESERVED, FUSE_DEVICE, FUSE_DEVICE_NUMBER};
pub use threads::PROGRESS_INTERVAL;

use crate::adapter::{Session, SessionOptions};
use crate::config::{FsConfig, ReadPath};
use crate::error::{FsError, Result};
use crate::mount::Mount;
use control::ControlSocket;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use threads::{Stop, Stopper};

/// Default number of FUSE worker threads. A worker serves one request at a time, start to
/// reply, and a durable write holds it for a whole device write; the kernel sends one
/// request per calling thread and never waits for a worker, so a request that finds every
/// worker busy waits in the kernel's queue. With as many workers as writers, the worker
/// that just replied is often not back in `read` when its writer's next request arrives:
/// 8 writers of one file averaged 6.5 writes in the daemon at 8 workers, 7.1 at 16, and 16
/// writers never got more than 8 in (docs/fuse.md, "The engine paths"). An idle worker
/// costs a thread blocked in `read` and the pages of its request buffer it has touched (at
/// most a request, `MAX_WRITE_BYTES` plus a header), so the default serves 32 concurrent
/// requests before any of them queues.
pub const FUSE_THREADS_DEFAULT: usize = 32;
/// The most FUSE worker threads `--threads` may ask for: each may keep a request buffer of
/// `MAX_WRITE_BYTES` resident.
pub const FUSE_THREADS_MAX: usize = 1024;
/// Default nice value of the FUSE worker threads. A FUSE request is I/O work done on
/// behalf of the calling process; the kernel does the same work for a local file system in
/// the caller's context and in interrupt context, ahead of any CPU-bound task. Workers at
/// nice 0 queue behind CPU-bound tasks (including the callers) at every wakeup: request
/// arrival, backing I/O completion. See docs/fuse.md for the measurement.
pub const FUSE_WORKER_NICE_DEFAULT: i32 = -10;
/// Default RAM budget when `--mem` is not given: half of physical memory.
pub const MEM_DEFAULT_FRACTION_DIV: u64 = 2;
/// Allocations at least this large get their own mapping (see `tune_allocator`).
pub const MALLOC_MMAP_THRESHOLD_BYTES: i32 = 64 * 1024;

/// Everything `dhrd mount` needs.
#[derive(Debug, Clone)]
pub struct MountConfig {
    pub backing: PathBuf,
    pub mountpoint: PathBuf,
    pub fs: FsConfig,
    pub allow_other: bool,
    pub threads: usize,
    /// Nice value of the FUSE worker threads (0: leave as is).
    pub worker_nice: i32,
    /// Show the progress line on stderr.
    pub progress: bool,
}

/// Physical memory in bytes (for the default budget).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
}

pub fn default_mem_bytes() -> u64 {
    physical_memory() / MEM_DEFAULT_FRACTION_DIV
}

/// Mounts and serves until SIGTERM, SIGINT or `dhrd umount`. Returns Ok after a clean
/// flush and unmount.
pub fn run(mut cfg: MountConfig) -> Result<()> {
    let (dir, mnt) = prepare(&cfg.backing, &cfg.mountpoint)?;
    tune_allocator();
    let backing = cfg
        .backing
        .canonicalize()
        .unwrap_or_else(|_| cfg.backing.clone());
    prepare::raise_nofile(&mut cfg.fs)?;
    threads::block_stop_signals();
    let mut control = ControlSocket::bind(&mnt)?;
    // From here on the daemon creates files only on behalf of callers, whose umask the
    // kernel has already applied to the mode it sends (or sent along for us to apply):
    // the daemon's own umask must not mask them a second time (umask 0 and mode 0777 must
    // give 0777, as on a local file system). Everything the daemon made for itself is
    // made above, with explicit permissions.
    rustix::process::umask(rustix::fs::Mode::empty());
    let m = Mount::new(dir, cfg.fs.clone())?;
    refuse_before_mounting(&m)?;
    let options = SessionOptions {
        fs_name: format!("dhrd:{}", backing.display()),
        allow_other: cfg.allow_other,
        threads: cfg.threads,
    };
    let mut session = Session::mount(m.clone(), &mnt, &options)
        .map_err(|e| FsError::Setup(format!("mounting {}: {e}", mnt.display())))?;
    let (stop_tx, stop_rx) = mpsc::channel::<Stop>();
    threads::spawn_signals(stop_tx.clone())?;
    control.serve(m.clone(), mnt.clone(), backing.clone(), stop_tx)?;
    let period = match cfg.fs.durability {
        dhrd_engine::Durability::Periodic(p) => Some(p),
        _ => None,
    };
    threads::spawn_background(&m, cfg.progress, period)?;
    let stopper = Stopper::spawn(m.clone(), session.unmounter(), mnt.clone(), stop_rx)?;
    eprintln!(
        "dhrd: mounted {} on {} (durability {}, read path {})",
        backing.display(),
        mnt.display(),
        cfg.fs.durability,
        cfg.fs.read_path
    );
    nice_workers(cfg.worker_nice);
    let served = session.run();
    finish(&m, stopper, served)
}

/// Each engine object allocates a few hundred KiB of histograms; with glibc's dynamic
/// mmap threshold those end up in per-thread arenas that never shrink while objects churn
/// through the cache. A fixed threshold keeps large blocks in their own mappings, returned
/// to the kernel when an object is dropped.
fn tune_allocator() {
    // SAFETY: mallopt only tunes the allocator; called before any worker thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES);
    }
}

/// What can be known before mounting is refused before mounting; passthrough support is
/// known only from the kernel's INIT (then the mount fails there).
fn refuse_before_mounting(m: &Mount) -> Result<()> {
    if m.cfg().read_path == ReadPath::PageCache {
        if let Err(why) = m.sync_flag_probe() {
            return Err(FsError::Setup(format!("--read-path pagecache: {why}")));
        }
    }
    Ok(())
}

/// The workers are created by the session on this thread and inherit its nice value (on
/// Linux a per-thread attribute); the threads started before keep theirs.
fn nice_workers(nice: i32) {
    if nice != 0 {
        if let Err(e) = set_thread_nice(nice) {
            eprintln!("dhrd: FUSE workers keep the default priority (nice {nice}: {e})");
        }
    }
}

/// After the session ended (`served`): lets the stopper answer, gives the backing to the
/// next daemon, and says whether everything reached the backing.
fn finish(m: &Arc<Mount>, stopper: Stopper, served: std::io::Result<()>) -> Result<()> {
    m.begin_shutdown();
    stopper.finish();
    // The session is over and `destroy` has flushed everything: let a new daemon have the
    // backing now, before the control socket goes (which is what `dhrd umount` waits
    // for), not when the last thread holding the mount lets go of the directory fd.
    let _ = rustix::fs::flock(m.dir().root_fd(), rustix::fs::FlockOperation::Unlock);
    served.map_err(|e| FsError::io("FUSE session", e))?;
    if let Some(msg) = m.final_error() {
        // Unmounted, but not everything may be on the backing: say so and exit non-zero.
        return Err(FsError::Setup(msg));
    }
    Ok(())
}

/// Sets the nice value of the calling thread only.
fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority on this thread's own id; no memory is touched.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
