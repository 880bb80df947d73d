//! Attribute changes (SETATTR: mode, owner, size, times) and READLINK.
//!
//! Invariants: a size change goes to the data path (`Files::set_len`), which drops set-id
//! bits first; a chmod adding a set-id bit to a file a passthrough writer holds is
//! refused (`Files::chmod_file`); the attributes the reply carries are read after the
//! change.
//!
//! Crash semantics: a change is durable per the mode (`SyncPolicy::meta_durable`); the
//! inode of a symlink, FIFO or socket cannot be fsync'ed by descriptor, so its change asks
//! for a syncfs in `sync` mode.

use super::Namespace;
use crate::durable::commit::SyncSet;
use crate::durable::DirRef;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, FileKind, Ino, SetAttr, SetTime};
use crate::killpriv::{Caller, Fsetid};
use crate::sys;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::UNIX_EPOCH;

impl Namespace {
    /// SETATTR of node `ino`: the size (data path), then the inode's own attributes.
    pub fn setattr(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        ino: Ino,
        change: &SetAttr,
    ) -> Result<Attr> {
        // A file the data path holds open (an open, or a registration kept after the
        // last close: a chmod or utimens right after the write, as `cp -p`, `tar` and
        // `install` do) is changed and stat'ed through that descriptor: the same inode by
        // construction, without opening, checking and closing it again by name.
        let held = self.files.held_file(self.dir.backing_ino(ino.0));
        let stat = || match &held {
            Some(f) => Ok(sys::fstat(f.as_fd())?),
            None => self.stat_node(ino),
        };
        let st = stat()?;
        let kind = FileKind::of_mode(st.st_mode);
        if let Some(size) = change.size {
            if kind != FileKind::RegularFile {
                return Err(FsError::Errno(if kind == FileKind::Directory {
                    libc::EISDIR
                } else {
                    libc::EINVAL
                }));
            }
            self.files.set_len(
                set,
                caller,
                &st,
                size,
                change.fh,
                change.mode.is_none(),
                || self.open_backing_file(ino),
                || self.display_name(ino),
            )?;
        }
        let c = change;
        let changes_inode = c.mode.is_some()
            || c.uid.is_some()
            || c.gid.is_some()
            || c.atime.is_some()
            || c.mtime.is_some();
        if changes_inode {
            match kind {
                FileKind::RegularFile | FileKind::Directory => match &held {
                    Some(f) => self.set_attrs_by_fd(set, caller, f.as_fd(), &st, change)?,
                    None => {
                        let (fd, _) = self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?;
                        self.set_attrs_by_fd(set, caller, fd.as_fd(), &st, change)?
                    }
                },
                _ => self.set_attrs_by_name(set, ino, &st, change)?,
            }
        }
        let st = stat()?;
        Ok(self.attr(&st))
    }

    /// Mode, owner and times of a regular file or directory, through descriptor `fd` of
    /// it (`st` its status).
    fn set_attrs_by_fd(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        fd: BorrowedFd<'_>,
        st: &libc::stat,
        c: &SetAttr,
    ) -> Result<()> {
        if let Some(m) = c.mode {
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                self.files.chmod_file(fd, st.st_ino, st.st_gid, m)?;
            } else {
                rustix::fs::fchmod(fd, Mode::from_raw_mode(m & 0o7777))?;
            }
        }
        if c.uid.is_some() || c.gid.is_some() {
            // The backing fchown (by root) drops S_ISUID and S_ISGID with S_IXGRP
            // itself; what depends on the caller is dropped here.
            if c.mode.is_none() {
                let f = sys::mode_owner(fd)?;
                self.files.drop_setid_bits(fd, f, caller, Fsetid::LookUp)?;
            }
            rustix::fs::fchown(
                fd,
                c.uid.map(rustix::fs::Uid::from_raw),
                c.gid.map(rustix::fs::Gid::from_raw),
            )?;
        }
        if c.atime.is_some() || c.mtime.is_some() {
            let ts = rustix::fs::Timestamps {
                last_access: timestamp(c.atime),
                last_modification: timestamp(c.mtime),
            };
            rustix::fs::futimens(fd, &ts)?;
        }
        self.sync.meta_durable(set, &[&fd])
    }

    /// Mode, owner and times of a symlink, FIFO or socket: on the name, with NOFOLLOW,
    /// in the parent.
    fn set_attrs_by_name(
        &self,
        set: &mut SyncSet,
        ino: Ino,
        st: &libc::stat,
        c: &SetAttr,
    ) -> Result<()> {
        let (parent, name) = self.parent_and_name(ino)?;
        let pfd = self.dir_fd(parent)?;
        if let Some(m) = c.mode {
            let m = Mode::from_raw_mode(m & 0o7777);
            sys::chmod_node(pfd.as_fd(), &name, m, st.st_ino)?;
        }
        if c.uid.is_some() || c.gid.is_some() {
            rustix::fs::chownat(
                &pfd,
                &name,
                c.uid.map(rustix::fs::Uid::from_raw),
                c.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if c.atime.is_some() || c.mtime.is_some() {
            let ts = rustix::fs::Timestamps {
                last_access: timestamp(c.atime),
                last_modification: timestamp(c.mtime),
            };
            rustix::fs::utimensat(&pfd, &name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        // The inode of a symlink cannot be fsync'ed by descriptor (see `node_changed`).
        let dir = DirRef {
            ino: self.dir.backing_ino(parent.0),
            fd: &pfd,
        };
        self.sync.node_changed(set, dir, &name, st.st_ino)
    }

    /// READLINK.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let (fd, _) = self.node_fd(ino, OFlags::PATH)?;
        Ok(rustix::fs::readlinkat(&fd, "", Vec::new())?.into_bytes())
    }
}

fn timestamp(t: Option<SetTime>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(SetTime::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(SetTime::At(st)) => {
            let (sec, nsec) = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
                Err(e) => (-(e.duration().as_secs() as i64), 0),
            };
            rustix::fs::Timespec {
                tv_sec: sec,
                tv_nsec: nsec as _,
            }
        }
    }
}
