//! The checks before a mount (the FUSE device, the backing directory and the mountpoint,
//! nothing mounted there, neither inside the other), the exclusive lock on the backing
//! directory, and the descriptor limit the caches need.
//!
//! Invariant: nothing is mounted unless every check passed and the exclusive `flock` on
//! the backing directory descriptor is held (one daemon per backing directory; the lock
//! needs no file in the visible tree and is released by the kernel if the daemon dies).
//!
//! No crash semantics: nothing here writes.

use crate::config::FsConfig;
use crate::error::{FsError, Result};
use crate::sys::BackingDir;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The kernel's FUSE device and its fixed device number (misc major 10, minor 229).
pub const FUSE_DEVICE: &str = "/dev/fuse";
pub const FUSE_DEVICE_NUMBER: (u32, u32) = (10, 229);
/// Descriptors one cached object may hold: backing file, memfd, O_DIRECT descriptor.
pub const FDS_PER_OBJECT: u64 = 3;
/// Descriptors kept for everything besides the object cache: the session, the control
/// socket, directory handles, the backing directory, objects of open files beyond the
/// cache's count.
pub const FDS_RESERVED: u64 = 256;

fn setup(msg: String) -> FsError {
    FsError::Setup(msg)
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
pub fn prepare(backing: &Path, mountpoint: &Path) -> Result<(BackingDir, PathBuf)> {
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
    let given = backing;
    let backing = given
        .canonicalize()
        .map_err(|e| setup(format!("backing directory {}: {e}", given.display())))?;
    if !backing.is_dir() {
        return Err(setup(format!(
            "backing directory {} is not a directory",
            backing.display()
        )));
    }
    let mnt = mountpoint
        .canonicalize()
        .map_err(|e| setup(format!("mountpoint {}: {e}", mountpoint.display())))?;
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
/// idle registrations, descriptors kept unchecked) take what is left, a half, a quarter
/// and an eighth of it at most, so that they can never starve the opens that need
/// descriptors.
pub fn raise_nofile(fs: &mut FsConfig) -> Result<()> {
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
            fs.kept_fds_max = fs.kept_fds_max.min(spare / 8);
            Ok(())
        }
        None => Ok(()),
    }
}
