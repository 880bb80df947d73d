//! The file requests of the mount's API: OPEN, CREATE, READ, WRITE, RELEASE, FSYNC, LSEEK,
//! FALLOCATE, COPY_FILE_RANGE. OPEN and CREATE cross both halves of the mount: the
//! namespace finds or makes the file (and truncates it for open(O_TRUNC)), the data path
//! opens it.
//!
//! Invariants: an open or create whose later step fails, or whose sync fails, gives back
//! what it took (the data path's count, the handle, the new file, the entry's lookup)
//! before the error is sent. No crash semantics of its own (see `data`, `meta`).

use super::{Durable, Mount};
use crate::durable::commit::SyncSet;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, Entry, Fh, Ino, OpenReply, Register, SetAttr, SetTime};
use crate::killpriv::Caller;
use crate::page::Opened;
use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Mount {
    /// OPEN of regular file `ino` with open(2) `flags`; `register` makes backing ids for
    /// passthrough. Only an O_TRUNC open has something to make durable before the reply;
    /// a failed sync closes the handle again (the kernel never learns of it).
    pub fn open(
        self: &Arc<Self>,
        caller: &Caller,
        ino: Ino,
        flags: i32,
        register: Register<'_>,
    ) -> Durable<(Fh, OpenReply)> {
        let mut set = SyncSet::default();
        let r = self.open_file(&mut set, caller, ino, flags, register);
        self.durable(set, r, |m, (fh, _)| m.files.release(fh))
    }

    fn open_file(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        ino: Ino,
        flags: i32,
        register: Register<'_>,
    ) -> Result<(Fh, OpenReply)> {
        let key = self.dir.backing_ino(ino.0);
        // A program being executed refuses writers with ETXTBSY, which the kernel checks
        // before a writable OPEN but only after a read-only one, for its O_TRUNC; the
        // truncation below would be done by then, cutting the running program. The
        // daemon knows a program by the handle of its exec. (After the program exits its
        // RELEASE may come a little later, and an O_RDONLY|O_TRUNC open in between is
        // refused where the kernel would allow it: refused, never truncated wrongly.)
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
        if flags & libc::O_TRUNC != 0 && read_only && self.files.executing(key) {
            return Err(FsError::Errno(libc::ETXTBSY));
        }
        let opening = self.files.open(
            key,
            flags,
            caller,
            || self.ns.open_backing_file_stat(ino),
            || self.ns.display_name(ino),
            register,
        )?;
        // The kernel has checked write permission for O_TRUNC, whatever the access mode,
        // and passes it only once FUSE_ATOMIC_O_TRUNC is negotiated. What the SETATTR of
        // a non-atomic open(O_TRUNC) would do: size 0, mtime and ctime now (even when the
        // file was empty already), set-id bits dropped, durable in sync mode; after the
        // open's own checks, so a refused open changes nothing.
        if flags & libc::O_TRUNC != 0 {
            let change = SetAttr {
                size: Some(0),
                mtime: Some(SetTime::Now),
                ..SetAttr::default()
            };
            if let Err(e) = self.ns.setattr(set, caller, ino, &change) {
                self.files.abandon(opening);
                return Err(e);
            }
            self.stats.open_truncates.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.files.finish_open(opening, flags, register))
    }

    /// CREATE: the entry, then an open of it on the data path. If the reply's sync fails,
    /// the kernel never gets the entry nor the handle: both go.
    #[allow(clippy::too_many_arguments)] // mirrors the CREATE request
    pub fn create(
        self: &Arc<Self>,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        register: Register<'_>,
    ) -> Durable<(Entry, Fh, OpenReply)> {
        let mut set = SyncSet::default();
        let r = self.create_file(
            &mut set,
            caller,
            parent,
            name,
            (mode, umask),
            flags,
            register,
        );
        let r = r.map(|(attr, fh, open)| (self.ns.entry(attr), fh, open));
        self.durable(set, r, |m, (e, fh, _)| {
            m.files.release(fh);
            m.ns.entry_not_sent(&e.attr);
        })
    }

    #[allow(clippy::too_many_arguments)] // mirrors the CREATE request
    fn create_file(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        (mode, umask): (u32, u32),
        flags: i32,
        register: Register<'_>,
    ) -> Result<(Attr, Fh, OpenReply)> {
        let c = self
            .ns
            .create_entry(set, caller, parent, name, mode, umask, flags)?;
        let opened = Opened {
            file: c.file,
            mode: c.mode,
            fresh: c.made,
            size: c.attr.size,
        };
        let ino = Ino(c.attr.ino);
        let label = || self.ns.display_name(ino);
        let r = self
            .files
            .open_created(c.key, flags, caller, opened, label, register)
            .and_then(|(fh, open)| Ok((self.opened_attr(fh)?, fh, open)));
        r.inspect_err(|_| {
            if c.made {
                self.ns.undo_create(parent, &c.pfd, name, c.key, true);
            }
        })
    }

    /// The attributes of the file just opened through handle `fh`, for CREATE's reply. The
    /// open may have changed the inode after the namespace looked at it: in `sync` mode
    /// the first open of an inode sets its sync flag and mark, which moves its ctime. The
    /// kernel keeps the reply's attributes for the attribute timeout, so attributes from
    /// before the open would show an older ctime until something refreshed them, and the
    /// next refresh (a failed truncate or link by another user, say) would seem to change
    /// the ctime. A handle that cannot be stat'ed is closed again.
    fn opened_attr(&self, fh: Fh) -> Result<Attr> {
        let st = self
            .files
            .handle_stat(fh)
            .inspect_err(|_| self.files.release(fh))?;
        Ok(self.ns.attr(&st))
    }

    pub fn read(&self, fh: Fh, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.counted(self.files.read(fh, offset, size))
    }

    /// WRITE through handle `fh`. `kill_suidgid`: the kernel flagged the write
    /// (FUSE_WRITE_KILL_SUIDGID: the writer lacks CAP_FSETID); `write_flags`: the open's
    /// flags plus O_DSYNC / O_SYNC where this write asked for it (RWF_DSYNC, RWF_SYNC).
    pub fn write(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        write_flags: i32,
    ) -> Result<u32> {
        let r = self
            .files
            .write(caller, fh, offset, data, kill_suidgid, write_flags);
        self.counted(r)
    }

    pub fn release(&self, fh: Fh) {
        self.files.release(fh);
    }

    pub fn fsync(self: &Arc<Self>, fh: Fh, datasync: bool) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self.files.fsync(&mut set, fh, datasync);
        self.durable(set, r, |_, _| {})
    }

    /// SEEK_DATA / SEEK_HOLE.
    pub fn lseek(&self, fh: Fh, offset: i64, whence: i32) -> Result<i64> {
        self.files.lseek(fh, offset, whence)
    }

    pub fn fallocate(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let r = self.files.fallocate(caller, fh, offset, length, mode);
        self.counted(r)
    }

    /// COPY_FILE_RANGE between two open files of the mount.
    #[allow(clippy::too_many_arguments)] // mirrors the COPY_FILE_RANGE request
    pub fn copy_file_range(
        &self,
        caller: &Caller,
        fh_in: Fh,
        offset_in: u64,
        fh_out: Fh,
        offset_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<u32> {
        let r = self
            .files
            .copy_file_range(caller, fh_in, offset_in, fh_out, offset_out, len, flags);
        self.counted(r)
    }
}
