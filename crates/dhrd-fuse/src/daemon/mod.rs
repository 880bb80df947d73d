//! Running a mount: checks of the command-line input, the backing-directory lock, the FUSE
//! session with its worker threads, the control socket (`dhrd status`, `dhrd umount`), the
//! background walk that preloads files, the progress line, and orderly shutdown on
//! SIGTERM / SIGINT / `dhrd umount`.
//!
//! Invariants:
//! - Nothing is mounted unless every check passed and the exclusive `flock` on the backing
//!   directory descriptor is held (one daemon per backing directory; the lock needs no file
//!   in the visible tree and is released by the kernel if the daemon dies).
//! - Shutdown order: flush every object and sync metadata, unmount, then (in `destroy`)
//!   close every object; the process exits 0 only when that succeeded.
//! - The control socket is created mode 0600 in a 0700 directory; only root (or the
//!   mounting user) can ask for status or an unmount.
//!
//! Crash semantics: a SIGKILL leaves a dead FUSE mount (clean it with `fusermount3 -uz` or
//! `umount -l`) and a backing directory holding every acknowledged write (sync mode) or
//! every write up to the last flush (fsync / periodic modes). Nothing needs recovery.

use crate::adapter::DhrdFs;
use crate::config::FsConfig;
use crate::error::{FsError, Result};
use crate::mount::Shared;
use crate::status::{human, load_totals, status_json, status_text};
use crate::sys::BackingDir;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The kernel's FUSE device and its fixed device number (misc major 10, minor 229).
pub const FUSE_DEVICE: &str = "/dev/fuse";
pub const FUSE_DEVICE_NUMBER: (u32, u32) = (10, 229);
/// Directory of the control sockets.
pub const CONTROL_DIR: &str = "/run/dhrd";
/// Descriptors one cached object may hold: backing file, memfd, O_DIRECT descriptor.
pub const FDS_PER_OBJECT: u64 = 3;
/// Descriptors kept for everything besides the object cache: the session, the control
/// socket, directory handles, the backing directory, objects of open files beyond the
/// cache's count.
pub const FDS_RESERVED: u64 = 256;
/// Default number of FUSE worker threads.
pub const FUSE_THREADS_DEFAULT: usize = 8;
/// Default nice value of the FUSE worker threads. A FUSE request is I/O work done on
/// behalf of the calling process; the kernel does the same work for a local file system in
/// the caller's context and in interrupt context, ahead of any CPU-bound task. Workers at
/// nice 0 queue behind CPU-bound tasks (including the callers) at every wakeup: request
/// arrival, backing I/O completion. See docs/fuse.md for the measurement.
pub const FUSE_WORKER_NICE_DEFAULT: i32 = -10;
/// Default RAM budget when `--mem` is not given: half of physical memory.
pub const MEM_DEFAULT_FRACTION_DIV: u64 = 2;
/// Longest command or reply line on the control socket.
pub const CONTROL_LINE_MAX: usize = 256;
/// How long a control client waits for the daemon.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the foreground progress line is refreshed.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Allocations at least this large get their own mapping (see `run`).
pub const MALLOC_MMAP_THRESHOLD_BYTES: i32 = 64 * 1024;
/// How long `dhrd umount` waits for the daemon to exit after the unmount.
pub const UMOUNT_EXIT_WAIT: Duration = Duration::from_secs(120);

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

fn setup(msg: String) -> FsError {
    FsError::Setup(msg)
}

/// The control socket path of a mountpoint (the canonical path, hashed so any path fits).
pub fn control_socket(mountpoint: &Path) -> Result<PathBuf> {
    let canon = mountpoint
        .canonicalize()
        .map_err(|e| setup(format!("mountpoint {}: {e}", mountpoint.display())))?;
    // FNV-1a: stable across builds and platforms, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canon.as_os_str().as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Ok(Path::new(CONTROL_DIR).join(format!("mnt-{h:016x}.sock")))
}

/// Whether `path` is a mount point, from /proc/self/mountinfo (exact path match).
fn is_mountpoint(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(|m| unescape_mountinfo(m).as_slice() == want)
            .unwrap_or(false)
    })
}

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Checks the input and takes the lock. Returns the opened backing directory and the
/// canonical mountpoint.
pub fn prepare(cfg: &MountConfig) -> Result<(BackingDir, PathBuf)> {
    match std::fs::metadata(FUSE_DEVICE) {
        Err(_) => {
            return Err(setup(
                "/dev/fuse is missing: load the fuse module (modprobe fuse) or run the container with --device /dev/fuse".into(),
            ));
        }
        Ok(m) => {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let rdev = m.rdev();
            if !m.file_type().is_char_device()
                || (libc::major(rdev), libc::minor(rdev)) != FUSE_DEVICE_NUMBER
            {
                return Err(setup(format!(
                    "{FUSE_DEVICE} is not the FUSE device (expected character device {}:{}); \
                     recreate it with mknod {FUSE_DEVICE} c {} {}",
                    FUSE_DEVICE_NUMBER.0,
                    FUSE_DEVICE_NUMBER.1,
                    FUSE_DEVICE_NUMBER.0,
                    FUSE_DEVICE_NUMBER.1
                )));
            }
        }
    }
    let backing = cfg
        .backing
        .canonicalize()
        .map_err(|e| setup(format!("backing directory {}: {e}", cfg.backing.display())))?;
    if !backing.is_dir() {
        return Err(setup(format!(
            "backing directory {} is not a directory",
            backing.display()
        )));
    }
    let mnt = cfg
        .mountpoint
        .canonicalize()
        .map_err(|e| setup(format!("mountpoint {}: {e}", cfg.mountpoint.display())))?;
    if !mnt.is_dir() {
        return Err(setup(format!(
            "mountpoint {} is not a directory",
            mnt.display()
        )));
    }
    if backing.starts_with(&mnt) {
        return Err(setup(format!(
            "backing directory {} is inside (or equal to) the mountpoint {}: the mount would hide it",
            backing.display(),
            mnt.display()
        )));
    }
    if mnt.starts_with(&backing) {
        return Err(setup(format!(
            "mountpoint {} is inside the backing directory {}: the tree would contain itself",
            mnt.display(),
            backing.display()
        )));
    }
    if is_mountpoint(&mnt) {
        return Err(setup(format!(
            "mountpoint {} is busy: something is already mounted there",
            mnt.display()
        )));
    }
    let mut it =
        std::fs::read_dir(&mnt).map_err(|e| setup(format!("mountpoint {}: {e}", mnt.display())))?;
    if it.next().is_some() {
        return Err(setup(format!(
            "mountpoint {} is not empty (dhrd would hide its contents)",
            mnt.display()
        )));
    }
    let dir = BackingDir::open(&backing)?;
    match rustix::fs::flock(
        dir.root_fd(),
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    ) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(setup(format!(
                "backing directory {} is already served by another dhrd daemon (its lock is held)",
                backing.display()
            )))
        }
        Err(e) => {
            return Err(setup(format!(
                "cannot lock backing directory {}: {}",
                backing.display(),
                std::io::Error::from(e)
            )))
        }
    }
    Ok((dir, mnt))
}

/// Raises the soft descriptor limit to the hard one: each cached object holds descriptors.
/// Fails when even that cannot hold a full object cache, rather than letting opens fail
/// with EMFILE once the cache fills. The other caches of descriptors (kept directories,
/// idle registrations) take what is left, half and a quarter of it at most, so that they
/// can never starve the opens that need descriptors.
fn raise_nofile(fs: &mut crate::FsConfig) -> Result<()> {
    let object_cache = fs.object_cache;
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
    let need = (object_cache as u64)
        .saturating_mul(FDS_PER_OBJECT)
        .saturating_add(FDS_RESERVED);
    let have = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    match have {
        Some(have) if have < need => Err(setup(format!(
            "--object-cache {object_cache} needs up to {need} file descriptors, but this \
             process may open {have} (ulimit -n); lower --object-cache or raise the limit"
        ))),
        Some(have) => {
            let spare = usize::try_from(have - need).unwrap_or(usize::MAX);
            fs.dir_fds_max = fs.dir_fds_max.min(spare / 2);
            fs.linger_max = fs.linger_max.min(spare / 4);
            Ok(())
        }
        None => Ok(()),
    }
}

fn progress_loop(sh: Arc<Shared>) {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last_print = Instant::now() - Duration::from_secs(3600);
    loop {
        std::thread::sleep(PROGRESS_INTERVAL);
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        let l = load_totals(&sh);
        let (loaded, total) = (l.loaded, l.total);
        let done = l.complete && (sh.preload.done.load(Ordering::Acquire) || !sh.cfg.preload);
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
            sh.preload.files_seen.load(Ordering::Relaxed)
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

/// Events that end the mount.
enum Stop {
    Signal(i32),
    Control(UnixStream),
}

fn control_server(
    listener: UnixListener,
    sh: Arc<Shared>,
    mnt: PathBuf,
    backing: PathBuf,
    stop: mpsc::Sender<Stop>,
) {
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
                let _ = conn.write_all(status_text(&sh, &mnt, &backing).as_bytes());
            }
            "status-json" => {
                let _ = writeln!(conn, "{}", status_json(&sh, &mnt, &backing));
            }
            "umount" => {
                // The reply is written by the main thread once the unmount is done.
                if stop.send(Stop::Control(conn)).is_err() {
                    return;
                }
            }
            other => {
                let _ = writeln!(conn, "error: unknown command {other:?}");
            }
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Mounts and serves until SIGTERM, SIGINT or `dhrd umount`. Returns Ok after a clean
/// flush and unmount.
pub fn run(mut cfg: MountConfig) -> Result<()> {
    let (dir, mnt) = prepare(&cfg)?;
    // Each engine object allocates a few hundred KiB of histograms; with glibc's dynamic
    // mmap threshold those end up in per-thread arenas that never shrink while objects
    // churn through the cache. A fixed threshold keeps large blocks in their own mappings,
    // returned to the kernel when an object is dropped.
    // SAFETY: mallopt only tunes the allocator; called before any worker thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES);
    }
    let backing = cfg
        .backing
        .canonicalize()
        .unwrap_or_else(|_| cfg.backing.clone());
    raise_nofile(&mut cfg.fs)?;

    // Block the stop signals in every thread (the mask is inherited); one thread waits for
    // them with sigwait so they never interrupt a request half-way.
    // SAFETY: sigset manipulation on a local set, then pthread_sigmask for this thread.
    unsafe {
        let mut ss: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut ss);
        libc::sigaddset(&mut ss, libc::SIGTERM);
        libc::sigaddset(&mut ss, libc::SIGINT);
        libc::sigaddset(&mut ss, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &ss, std::ptr::null_mut());
    }

    std::fs::create_dir_all(CONTROL_DIR).map_err(|e| setup(format!("{CONTROL_DIR}: {e}")))?;
    let _ = std::fs::set_permissions(CONTROL_DIR, std::fs::Permissions::from_mode(0o700));
    let sock_path = control_socket(&mnt)?;
    if UnixStream::connect(&sock_path).is_ok() {
        return Err(setup(format!(
            "mountpoint {} is busy: another dhrd daemon serves it",
            mnt.display()
        )));
    }
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path)
        .map_err(|e| setup(format!("control socket {}: {e}", sock_path.display())))?;
    std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| setup(format!("control socket {}: {e}", sock_path.display())))?;
    let _sock_guard = RemoveOnDrop(sock_path.clone());

    // From here on the daemon creates files only on behalf of callers, whose umask the
    // kernel has already applied to the mode it sends (or sent along for us to apply):
    // the daemon's own umask must not mask them a second time (umask 0 and mode 0777 must
    // give 0777, as on a local file system). Everything the daemon made for itself is
    // made above, with explicit permissions.
    rustix::process::umask(rustix::fs::Mode::empty());

    let sh = Shared::new(dir, cfg.fs.clone())?;
    // What can be known before mounting is refused before mounting; passthrough support
    // is known only from the kernel's INIT (then the mount fails there).
    if cfg.fs.read_path == crate::config::ReadPath::PageCache {
        if let Err(why) = &sh.sync_flag_probe {
            return Err(setup(format!("--read-path pagecache: {why}")));
        }
    }
    let mut options = vec![
        fuser::MountOption::FSName(format!("dhrd:{}", backing.display())),
        fuser::MountOption::Subtype("dhrd".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::RW,
    ];
    let acl = if cfg.allow_other {
        options.push(fuser::MountOption::CUSTOM("allow_other".into()));
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = options;
    fcfg.acl = acl;
    fcfg.n_threads = Some(cfg.threads.max(1));
    fcfg.clone_fd = true;
    let mut session = fuser::Session::new(DhrdFs { sh: sh.clone() }, &mnt, &fcfg)
        .map_err(|e| setup(format!("mounting {}: {e}", mnt.display())))?;
    let unmounter = session.unmount_callable();
    let _ = sh
        .notifier
        .set(Box::new(crate::adapter::Notices(session.notifier())));

    let (stop_tx, stop_rx) = mpsc::channel::<Stop>();
    {
        let tx = stop_tx.clone();
        std::thread::Builder::new()
            .name("dhrd-signals".into())
            .spawn(move || loop {
                // SAFETY: sigwait on a set built locally; the signals are blocked.
                let sig = unsafe {
                    let mut ss: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut ss);
                    libc::sigaddset(&mut ss, libc::SIGTERM);
                    libc::sigaddset(&mut ss, libc::SIGINT);
                    libc::sigaddset(&mut ss, libc::SIGHUP);
                    let mut sig: libc::c_int = 0;
                    if libc::sigwait(&ss, &mut sig) != 0 {
                        continue;
                    }
                    sig
                };
                if tx.send(Stop::Signal(sig)).is_err() {
                    return;
                }
            })
            .map_err(|e| setup(format!("spawning the signal thread: {e}")))?;
    }
    {
        let (sh2, m2, b2, tx) = (sh.clone(), mnt.clone(), backing.clone(), stop_tx.clone());
        std::thread::Builder::new()
            .name("dhrd-control".into())
            .spawn(move || control_server(listener, sh2, m2, b2, tx))
            .map_err(|e| setup(format!("spawning the control thread: {e}")))?;
    }
    {
        // The walk (or, without it, the note that there is none) once INIT has chosen
        // the data path.
        let sh2 = sh.clone();
        let preload = cfg.fs.preload;
        std::thread::Builder::new()
            .name("dhrd-walk".into())
            .spawn(move || {
                if preload {
                    crate::mount::walk::walk(sh2);
                } else if let Some(crate::data::Tier::Page(t)) = sh2.wait_tier() {
                    t.resident.walk_done();
                }
            })
            .map_err(|e| setup(format!("spawning the walk thread: {e}")))?;
    }
    if cfg.progress {
        let sh2 = sh.clone();
        let _ = std::thread::Builder::new()
            .name("dhrd-progress".into())
            .spawn(move || progress_loop(sh2));
    }
    if let dhrd_engine::Durability::Periodic(p) = cfg.fs.durability {
        let sh2 = sh.clone();
        let _ = std::thread::Builder::new()
            .name("dhrd-periodic".into())
            .spawn(move || {
                while !sh2.shutdown.load(Ordering::Acquire) {
                    std::thread::sleep(p);
                    // Data of every object, then the metadata (syncfs).
                    if let Err(e) = sh2.flush_all() {
                        eprintln!("dhrd: periodic flush failed: {e}");
                    }
                }
            });
    }

    // The stopper: waits for a stop event, flushes, unmounts; the session loop then ends.
    let stop_requested = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopper = {
        let sh2 = sh.clone();
        let requested = stop_requested.clone();
        let mnt2 = mnt.clone();
        let mut unmounter = unmounter;
        std::thread::Builder::new()
            .name("dhrd-stop".into())
            .spawn(move || {
                let mut tried_once = false;
                while let Ok(ev) = stop_rx.recv() {
                    let flushed = sh2.flush_all();
                    if let Err(e) = &flushed {
                        sh2.record_final_error(format!("flush before unmount failed: {e}"));
                    }
                    // Set before the unmount lets the session end; cleared if it failed.
                    requested.store(true, Ordering::Release);
                    // fuser's unmounter gives up its mount on the first attempt, even a
                    // failed one, and then reports every later attempt as done: a retry
                    // after a busy refusal unmounts by the path instead.
                    let r = if tried_once {
                        rustix::mount::unmount(&mnt2, rustix::mount::UnmountFlags::empty())
                            .map_err(std::io::Error::from)
                    } else {
                        unmounter.unmount()
                    };
                    tried_once = true;
                    if r.is_err() && matches!(ev, Stop::Control(_)) {
                        requested.store(false, Ordering::Release);
                    }
                    match ev {
                        Stop::Control(mut c) => {
                            let msg = match (&flushed, &r) {
                                (Ok(()), Ok(())) => "ok\n".to_string(),
                                (Err(e), _) => format!("error: flush failed: {e}\n"),
                                (_, Err(e)) => {
                                    format!("error: unmount of {} failed: {e}\n", mnt2.display())
                                }
                            };
                            let _ = c.write_all(msg.as_bytes());
                            if r.is_ok() {
                                return;
                            }
                        }
                        Stop::Signal(sig) => {
                            if r.is_ok() {
                                return;
                            }
                            // Busy mount: detach it lazily so the daemon can finish; the data
                            // is flushed already.
                            eprintln!(
                                "dhrd: signal {sig}: mount busy, detaching lazily: {}",
                                r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
                            );
                            let _ =
                                rustix::mount::unmount(&mnt2, rustix::mount::UnmountFlags::DETACH);
                            return;
                        }
                    }
                }
            })
            .map_err(|e| setup(format!("spawning the stop thread: {e}")))?
    };
    drop(stop_tx);

    eprintln!(
        "dhrd: mounted {} on {} (durability {}, read path {})",
        backing.display(),
        mnt.display(),
        cfg.fs.durability,
        cfg.fs.read_path
    );
    // The workers are created by this thread inside `run` and inherit its nice value (on
    // Linux a per-thread attribute); the threads started above keep theirs.
    if cfg.worker_nice != 0 {
        if let Err(e) = set_thread_nice(cfg.worker_nice) {
            eprintln!(
                "dhrd: FUSE workers keep the default priority (nice {}: {e})",
                cfg.worker_nice
            );
        }
    }
    let r = session.run();
    sh.shutdown.store(true, Ordering::Release);
    // A stop request being handled must finish writing its reply before the process exits.
    if stop_requested.load(Ordering::Acquire) {
        let _ = stopper.join();
    }
    // The session is over and `destroy` has flushed everything: let a new daemon have the
    // backing now, before the control socket goes (which is what `dhrd umount` waits
    // for), not when the last thread holding `Shared` lets go of the directory fd.
    let _ = rustix::fs::flock(sh.dir.root_fd(), rustix::fs::FlockOperation::Unlock);
    r.map_err(|e| FsError::io("FUSE session", e))?;
    if let Some(msg) = sh.final_error() {
        // Unmounted, but not everything may be on the backing: say so and exit non-zero.
        return Err(setup(msg));
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

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Sends one command to the daemon of `mountpoint` and returns its reply.
pub fn control_request(mountpoint: &Path, cmd: &str) -> Result<String> {
    let path = control_socket(mountpoint)?;
    let mut c = UnixStream::connect(&path).map_err(|e| {
        setup(format!(
            "no dhrd daemon answers for {} ({}: {e})",
            mountpoint.display(),
            path.display()
        ))
    })?;
    let _ = c.set_read_timeout(Some(CONTROL_TIMEOUT));
    writeln!(c, "{cmd}").map_err(|e| FsError::io("control socket write", e))?;
    let mut out = String::new();
    c.read_to_string(&mut out)
        .map_err(|e| FsError::io("control socket read", e))?;
    Ok(out)
}

/// `dhrd umount`: asks the daemon to flush and unmount, then waits for it to exit (its
/// control socket disappears). Without a daemon, falls back to `fusermount3 -u`.
pub fn umount(mountpoint: &Path) -> Result<()> {
    let path = control_socket(mountpoint)?;
    match control_request(mountpoint, "umount") {
        Ok(reply) if reply.trim() == "ok" => {
            let t = Instant::now();
            while path.exists() && t.elapsed() < UMOUNT_EXIT_WAIT {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }
        Ok(reply) => Err(setup(reply.trim().to_string())),
        Err(e) => {
            let st = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(mountpoint)
                .status();
            match st {
                Ok(s) if s.success() => Ok(()),
                _ => Err(e),
            }
        }
    }
}
