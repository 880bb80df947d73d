//! Extended attributes: GETXATTR, LISTXATTR, SETXATTR, REMOVEXATTR, on regular files and
//! directories (the only kinds that carry user xattrs reachable without following a
//! link).
//!
//! Invariants: xattrs under `trusted.dhrd.` are the daemon's own (the page cache path's
//! sync mark): never listed, read, set or removed through the mount.
//!
//! Crash semantics: a change is durable per the mode (`SyncPolicy::meta_durable`).

use super::Namespace;
use crate::durable::commit::SyncSet;
use crate::error::{FsError, Result};
use crate::kernel::{FileKind, Ino};
use crate::page::PRIVATE_XATTR_PREFIX;
use rustix::fs::OFlags;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// Whether an xattr name is the daemon's own.
fn private_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(PRIVATE_XATTR_PREFIX.as_bytes())
}

impl Namespace {
    /// Descriptor for xattr calls: only regular files and directories carry user xattrs
    /// reachable without following a link. A kept directory descriptor or the page cache
    /// path's descriptor of a file it holds open serves without opening anything: the
    /// kernel asks for `security.capability` before the first write of every inode it
    /// instantiates, right after the open.
    fn xattr_fd(&self, ino: Ino) -> Result<Option<NodeFd>> {
        if let Some(fd) = self.nodes.lock().kept_dir(ino) {
            return Ok(Some(NodeFd::Dir(fd)));
        }
        if let Some(f) = self.files.held_file(self.dir.backing_ino(ino.0)) {
            return Ok(Some(NodeFd::File(f)));
        }
        let st = self.stat_node(ino)?;
        match FileKind::of_mode(st.st_mode) {
            FileKind::RegularFile | FileKind::Directory => Ok(Some(NodeFd::Own(
                self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?.0,
            ))),
            _ => Ok(None),
        }
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::ENODATA));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        if size == 0 {
            let n = rustix::fs::fgetxattr_query(&fd, name)?;
            return Ok(vec![0u8; n]);
        }
        let mut buf = vec![0u8; size as usize];
        let n = rustix::fs::fgetxattr(&fd, name, &mut buf[..])?;
        buf.truncate(n);
        Ok(buf)
    }

    /// The names list without the daemon's own; `size` 0 asks for the length only, and a
    /// list longer than `size` is ERANGE, as listxattr(2) answers.
    pub fn listxattr(&self, ino: Ino, size: u32) -> Result<Vec<u8>> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Ok(Vec::new());
        };
        let all = loop {
            let n = rustix::fs::flistxattr_query(&fd)?;
            let mut buf = vec![0u8; n];
            match rustix::fs::flistxattr(&fd, &mut buf[..]) {
                Ok(got) => {
                    buf.truncate(got);
                    break buf;
                }
                // Grew between the two calls.
                Err(rustix::io::Errno::RANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let shown: Vec<u8> = all
            .split_inclusive(|b| *b == 0)
            .filter(|n| !private_xattr(OsStr::from_bytes(n.strip_suffix(&[0]).unwrap_or(n))))
            .flatten()
            .copied()
            .collect();
        if size != 0 && shown.len() > size as usize {
            return Err(FsError::Errno(libc::ERANGE));
        }
        Ok(shown)
    }

    pub fn setxattr(
        &self,
        set: &mut SyncSet,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::EPERM));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::EPERM));
        };
        let f = rustix::fs::XattrFlags::from_bits_retain(flags as _);
        rustix::fs::fsetxattr(&fd, name, value, f)?;
        self.sync.meta_durable(set, &[&fd])
    }

    pub fn removexattr(&self, set: &mut SyncSet, ino: Ino, name: &OsStr) -> Result<()> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::ENODATA));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        rustix::fs::fremovexattr(&fd, name)?;
        self.sync.meta_durable(set, &[&fd])
    }
}

/// A descriptor of a node, kept elsewhere or opened for one request.
enum NodeFd {
    Dir(std::sync::Arc<OwnedFd>),
    File(crate::data::HeldFile),
    Own(OwnedFd),
}

impl AsFd for NodeFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            NodeFd::Dir(d) => d.as_fd(),
            NodeFd::File(f) => f.as_fd(),
            NodeFd::Own(o) => o.as_fd(),
        }
    }
}
