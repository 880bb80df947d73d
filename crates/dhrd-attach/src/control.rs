//! The control socket of an attached directory (`dhrd status DIR`, `dhrd detach DIR`),
//! and the client side of it.
//!
//! One socket per attached directory, `/run/dhrd/att-<hash of its path>.sock`, mode 0600
//! in a 0700 directory: only root (or the attaching user) may ask for status or a detach.
//! Lines: `status`, `status-json`, `detach` (the reply, `ok` or `error: ...`, comes once
//! every change is undone).
//!
//! Invariants: the socket exists only while the daemon serves the directory (removed at
//! exit; a stale one left by a SIGKILL is replaced by the next daemon after it checked
//! nobody answers). No crash semantics.

use crate::error::{AttachError, Result};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Directory of the control sockets (shared with `dhrd mount`'s).
pub const CONTROL_DIR: &str = "/run/dhrd";
/// How long a client waits for the daemon's reply (a detach clears flags of every file).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest command line.
pub const CONTROL_LINE_MAX: usize = 256;
/// How long `detach` waits for the daemon's process to exit after it replied.
pub const DETACH_EXIT_WAIT: Duration = Duration::from_secs(60);

/// The socket of directory `dir` (canonical path, hashed so any path fits).
pub fn socket_path(dir: &Path) -> Result<PathBuf> {
    let canon = dir
        .canonicalize()
        .map_err(|e| AttachError::Refused(format!("{}: {e}", dir.display())))?;
    Ok(socket_path_of_canonical(&canon))
}

pub(crate) fn socket_path_of_canonical(canon: &Path) -> PathBuf {
    // FNV-1a: stable across builds, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canon.as_os_str().as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Path::new(CONTROL_DIR).join(format!("att-{h:016x}.sock"))
}

/// Whether a daemon answers for `dir`.
pub fn is_attached(dir: &Path) -> bool {
    socket_path(dir).is_ok_and(|p| UnixStream::connect(p).is_ok())
}

/// Sends one command to the daemon holding `dir` and returns its reply.
pub fn request(dir: &Path, cmd: &str) -> Result<String> {
    let path = socket_path(dir)?;
    let c = UnixStream::connect(&path).map_err(|e| {
        AttachError::Refused(format!(
            "no dhrd daemon holds {} ({}: {e})",
            dir.display(),
            path.display()
        ))
    })?;
    exchange(c, &path, cmd)
}

/// One command and its whole reply on a connected control socket.
fn exchange(mut c: UnixStream, path: &Path, cmd: &str) -> Result<String> {
    let _ = c.set_read_timeout(Some(CONTROL_TIMEOUT));
    writeln!(c, "{cmd}").map_err(|e| AttachError::io("control socket write", e))?;
    let mut out = String::new();
    c.read_to_string(&mut out)
        .map_err(|e| AttachError::io(format!("control socket {} read", path.display()), e))?;
    Ok(out)
}

/// `dhrd detach DIR`: asks the daemon to undo what it changed and exit, and waits for the
/// process itself to be gone, so that nothing of the directory is held open any more when
/// it returns (`umount` right after it finds the file system free). With no daemon, undoes
/// what a daemon that died left (its record) here.
pub fn detach(dir: &Path) -> Result<String> {
    let path = socket_path(dir)?;
    let Ok(c) = UnixStream::connect(&path) else {
        return crate::attached::undo_orphaned(dir);
    };
    // The daemon's process, pinned by a pidfd before it is asked to exit, so that its pid
    // cannot be reused by another process while this waits.
    let daemon = peer_pidfd(&c);
    let reply = exchange(c, &path, "detach")?;
    if reply.trim() != "ok" {
        return Err(AttachError::Refused(reply.trim().to_string()));
    }
    match daemon {
        Some(fd) => wait_exit(&fd, DETACH_EXIT_WAIT)?,
        None => {
            // No pidfd (a kernel before 5.3): the socket goes just before the process
            // exits, which is the nearest sign left.
            let t = Instant::now();
            while path.exists() && t.elapsed() < DETACH_EXIT_WAIT {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    Ok(format!("detached {}", dir.display()))
}

/// A pidfd of the process at the other end of `c` (SO_PEERCRED), if the kernel has pidfds.
fn peer_pidfd(c: &UnixStream) -> Option<rustix::fd::OwnedFd> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a ucred we own, with its size, on a connected socket.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(c),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 || cred.pid <= 0 {
        return None;
    }
    let pid = rustix::process::Pid::from_raw(cred.pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Waits until the process of `pidfd` has exited (its pidfd turns readable), up to `limit`.
fn wait_exit(pidfd: &rustix::fd::OwnedFd, limit: Duration) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(pidfd),
        events: libc::POLLIN,
        revents: 0,
    };
    let t = Instant::now();
    loop {
        let left = limit.saturating_sub(t.elapsed());
        if left.is_zero() {
            return Err(AttachError::Refused(format!(
                "the daemon replied to the detach but had not exited after {} s",
                limit.as_secs()
            )));
        }
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd we own, for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(AttachError::io(
                "waiting for the daemon to exit",
                std::io::Error::last_os_error(),
            ));
        }
    }
}
