//! The listening socket: a Unix socket private to its owner from the start, or a TCP
//! address that is loopback unless remote clients are allowed.
//!
//! Invariants:
//! - a Unix socket gets mode 0600 between bind and listen, so no other user can connect
//!   in any window; an existing path is replaced only if it is a socket no server answers
//!   on (a stale one), never a file of another kind;
//! - a listener removes its Unix socket when dropped only if the path still names the
//!   socket it created (another server may have replaced it);
//! - accepted streams are blocking, TCP ones with Nagle off (replies are written whole).
//!
//! Crash semantics: none; a socket left by a killed server is replaced at the next bind.

use crate::socket::Stream;
use crate::NbdError;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

pub(crate) enum Listener {
    Unix {
        l: UnixListener,
        path: PathBuf,
        ino: u64,
    },
    Tcp(TcpListener),
}

impl Listener {
    pub(crate) fn fd(&self) -> RawFd {
        match self {
            Listener::Unix { l, .. } => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix { l, .. } => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                Ok(Stream::Unix(s))
            }
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                // Replies are written whole; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, ino, .. } = self {
            // Remove the socket only if it is still ours (not replaced by another server).
            if std::fs::symlink_metadata(&*path).ok().map(|m| m.ino()) == Some(*ino) {
                let _ = std::fs::remove_file(&*path);
            }
        }
    }
}

/// Binds a Unix socket with mode 0600 before listening.
fn bind_unix(path: &Path) -> Result<Listener, NbdError> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(NbdError::Config(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(NbdError::Config(format!(
                "{} is in use by a running server",
                path.display()
            )));
        }
        // A stale socket from a server that died: replace it.
        std::fs::remove_file(path)?;
    }
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(NbdError::Config(format!(
            "socket path too long or invalid: {}",
            path.display()
        )));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2); the result is checked and owned right away.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes that outlives the call.
    let rc = unsafe { libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    // Restrict before listen(): until then nobody can connect, so there is no window in
    // which another user could.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // SAFETY: listen(2) on our bound socket.
    if unsafe { libc::listen(fd, libc::SOMAXCONN) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    let l = UnixListener::from(owned);
    l.set_nonblocking(true)?;
    let ino = std::fs::symlink_metadata(path)?.ino();
    Ok(Listener::Unix {
        l,
        path: path.to_path_buf(),
        ino,
    })
}

/// Binds `addr`; a TCP address that is not loopback only with `allow_remote`.
pub(crate) fn bind(addr: &ListenAddr, allow_remote: bool) -> Result<Listener, NbdError> {
    bind_any(addr, allow_remote).map_err(|e| match e {
        // Which address could not be bound, not only why.
        NbdError::Io(e) => NbdError::Config(format!("listening on {addr}: {e}")),
        e => e,
    })
}

fn bind_any(addr: &ListenAddr, allow_remote: bool) -> Result<Listener, NbdError> {
    match addr {
        ListenAddr::Unix(p) => bind_unix(p),
        ListenAddr::Tcp(a) => {
            if !a.ip().is_loopback() && !allow_remote {
                return Err(NbdError::Config(format!(
                    "{a} is not a loopback address; pass --allow-remote to listen on it \
                     (with --tls require and client authentication, docs/nbd.md)"
                )));
            }
            let l = TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            Ok(Listener::Tcp(l))
        }
    }
}
