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
use crate::error::{FsError, Result};
use crate::kernel::{Attr, FileKind, Ino, SetAttr, SetTime};
use crate::killpriv::{Caller, Fsetid};
use crate::sys;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::os::fd::AsFd;
use std::time::UNIX_EPOCH;

impl Namespace {
    pub fn setattr(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        ino: Ino,
        change: &SetAttr,
    ) -> Result<Attr> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = *change;
        let st = self.stat_node(ino)?;
        let kind = FileKind::of_mode(st.st_mode);
        if let Some(size) = size {
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
                fh,
                mode.is_none(),
                || self.open_backing_file(ino),
                || self.display_name(ino),
            )?;
        }
        let changes_inode =
            mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some();
        if changes_inode {
            match kind {
                FileKind::RegularFile | FileKind::Directory => {
                    let (fd, _) = self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?;
                    if let Some(m) = mode {
                        if kind == FileKind::RegularFile {
                            self.files.chmod_file(fd.as_fd(), st.st_ino, st.st_gid, m)?;
                        } else {
                            rustix::fs::fchmod(&fd, Mode::from_raw_mode(m & 0o7777))?;
                        }
                    }
                    if uid.is_some() || gid.is_some() {
                        // The backing fchown (by root) drops S_ISUID and S_ISGID with
                        // S_IXGRP itself; what depends on the caller is dropped here.
                        if mode.is_none() {
                            let f = sys::mode_owner(fd.as_fd())?;
                            self.files
                                .drop_setid_bits(fd.as_fd(), f, caller, Fsetid::LookUp)?;
                        }
                        rustix::fs::fchown(
                            &fd,
                            uid.map(rustix::fs::Uid::from_raw),
                            gid.map(rustix::fs::Gid::from_raw),
                        )?;
                    }
                    if atime.is_some() || mtime.is_some() {
                        let ts = rustix::fs::Timestamps {
                            last_access: timestamp(atime),
                            last_modification: timestamp(mtime),
                        };
                        rustix::fs::futimens(&fd, &ts)?;
                    }
                    self.sync.meta_durable(set, &[&fd])?;
                }
                _ => {
                    // Symlinks, FIFOs, sockets: act on the name with NOFOLLOW in the parent.
                    let (parent, name) = self.parent_and_name(ino)?;
                    let pfd = self.dir_fd(parent)?;
                    if let Some(m) = mode {
                        let m = Mode::from_raw_mode(m & 0o7777);
                        sys::chmod_node(pfd.as_fd(), &name, m, st.st_ino)?;
                    }
                    if uid.is_some() || gid.is_some() {
                        rustix::fs::chownat(
                            &pfd,
                            &name,
                            uid.map(rustix::fs::Uid::from_raw),
                            gid.map(rustix::fs::Gid::from_raw),
                            AtFlags::SYMLINK_NOFOLLOW,
                        )?;
                    }
                    if atime.is_some() || mtime.is_some() {
                        let ts = rustix::fs::Timestamps {
                            last_access: timestamp(atime),
                            last_modification: timestamp(mtime),
                        };
                        rustix::fs::utimensat(&pfd, &name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
                    }
                    // The inode of a symlink cannot be fsync'ed by descriptor; syncfs covers it.
                    self.sync.meta_durable_fs(set, &pfd)?;
                }
            }
        }
        let st = self.stat_node(ino)?;
        Ok(self.attr(&st))
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
