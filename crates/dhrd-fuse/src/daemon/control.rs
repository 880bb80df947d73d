//! The control socket of a mount (`dhrd status`, `dhrd umount`): its path, the daemon's
//! server, and the client side.
//!
//! Invariant: the socket is created mode 0600 in a 0700 directory; only root (or the
//! mounting user) can ask for status or an unmount. A command is one line; a reply ends
//! when the daemon closes the connection.
//!
//! No crash semantics: a socket left by a killed daemon is replaced at the next mount.

use super::threads::Stop;
use crate::error::{FsError, Result};
use crate::mount::Mount;
use crate::status::{status_json, status_text};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Directory of the control sockets.
pub const CONTROL_DIR: &str = "/run/dhrd";
/// Longest command or reply line on the control socket.
pub const CONTROL_LINE_MAX: usize = 256;
/// How long a control client waits for the daemon.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `dhrd umount` waits for the daemon to exit after the unmount.
pub const UMOUNT_EXIT_WAIT: Duration = Duration::from_secs(120);

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

/// The bound control socket of a mount; its path goes when this is dropped.
pub struct ControlSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ControlSocket {
    /// Binds the control socket of `mnt` (canonical), refusing when a daemon answers on
    /// it already.
    pub fn bind(mnt: &Path) -> Result<Self> {
        std::fs::create_dir_all(CONTROL_DIR).map_err(|e| setup(format!("{CONTROL_DIR}: {e}")))?;
        let _ = std::fs::set_permissions(CONTROL_DIR, std::fs::Permissions::from_mode(0o700));
        let path = control_socket(mnt)?;
        if UnixStream::connect(&path).is_ok() {
            return Err(setup(format!(
                "mountpoint {} is busy: another dhrd daemon serves it",
                mnt.display()
            )));
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| setup(format!("control socket {}: {e}", path.display())))?;
        let me = Self {
            listener: Some(listener),
            path,
        };
        std::fs::set_permissions(&me.path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| setup(format!("control socket {}: {e}", me.path.display())))?;
        Ok(me)
    }

    /// Serves status requests and hands unmount requests to `stop`, on a thread of its
    /// own, until the mount shuts down.
    pub fn serve(
        &mut self,
        m: Arc<Mount>,
        mnt: PathBuf,
        backing: PathBuf,
        stop: mpsc::Sender<Stop>,
    ) -> Result<()> {
        let listener = self
            .listener
            .take()
            .ok_or_else(|| setup("served twice".into()))?;
        std::thread::Builder::new()
            .name("dhrd-control".into())
            .spawn(move || control_server(listener, m, mnt, backing, stop))
            .map_err(|e| setup(format!("spawning the control thread: {e}")))?;
        Ok(())
    }
}

fn control_server(
    listener: UnixListener,
    m: Arc<Mount>,
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
                let _ = conn.write_all(status_text(&m, &mnt, &backing).as_bytes());
            }
            "status-json" => {
                let _ = writeln!(conn, "{}", status_json(&m, &mnt, &backing));
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
        if m.is_shutting_down() {
            return;
        }
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
