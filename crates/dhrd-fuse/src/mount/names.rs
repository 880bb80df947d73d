//! The namespace requests of the mount's API: LOOKUP, FORGET, GETATTR, SETATTR, READLINK,
//! MKNOD, MKDIR, SYMLINK, LINK, UNLINK, RMDIR, RENAME, STATFS, the xattr requests and the
//! directory requests. Each is one call on the namespace, its counters, and its reply
//! (a `Durable` outcome for a change).
//!
//! Invariants: an entry a failed sync keeps from the kernel takes its lookup back
//! (`Namespace::entry_not_sent`). No crash semantics of its own (see `meta`).

use super::{Durable, Mount};
use crate::durable::commit::SyncSet;
use crate::error::Result;
use crate::kernel::{Attr, Entry, Fh, FileKind, Ino, SetAttr, Statfs};
use crate::killpriv::Caller;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Mount {
    /// LOOKUP of `name` in `parent`. A missing name is a negative entry (node 0) that the
    /// kernel may keep as long as a positive one: names appear only through this daemon
    /// (create, mkdir, link, rename...), and the kernel replaces the negative dentry itself
    /// when they do. Saves a round trip for every repeated probe of a missing name (PATH
    /// and include-path searches, Python imports, build tools checking outputs).
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Entry> {
        self.stats.lookups.fetch_add(1, Ordering::Relaxed);
        match self.ns.lookup(parent, name) {
            Err(e) if e.errno() == libc::ENOENT => Ok(Entry {
                attr: self.ns.placeholder_attr(),
                generation: 0,
            }),
            r => r,
        }
    }

    /// FORGET: the kernel dropped `n` lookups of `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        self.ns.forget(ino, n);
    }

    /// GETATTR, through the open file `fh` where the kernel names one.
    pub fn getattr(&self, ino: Ino, fh: Option<Fh>) -> Result<Attr> {
        let st = match fh.and_then(|f| self.files.handle_stat(f).ok()) {
            Some(st) => st,
            None => self.ns.stat_node(ino)?,
        };
        Ok(self.ns.attr(&st))
    }

    pub fn setattr(self: &Arc<Self>, caller: &Caller, ino: Ino, change: &SetAttr) -> Durable<Attr> {
        self.stats.setattrs.fetch_add(1, Ordering::Relaxed);
        let mut set = SyncSet::default();
        let r = self.ns.setattr(&mut set, caller, ino, change);
        self.durable(set, r, |_, _| {})
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.stats.readlinks.fetch_add(1, Ordering::Relaxed);
        self.ns.readlink(ino)
    }

    /// The outcome of a request that made entry `r`; if its sync fails, the lookup
    /// counted for it is taken back (the kernel never gets the entry).
    fn entry_durable(self: &Arc<Self>, set: SyncSet, r: Result<Attr>) -> Durable<Entry> {
        let r = r.map(|attr| self.ns.entry(attr));
        self.durable(set, r, |m, e| m.ns.entry_not_sent(&e.attr))
    }

    #[allow(clippy::too_many_arguments)] // mirrors the MKNOD request
    pub fn mknod(
        self: &Arc<Self>,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Durable<Entry> {
        let mut set = SyncSet::default();
        let r = self
            .ns
            .mknod(&mut set, caller, parent, name, mode, umask, rdev);
        self.entry_durable(set, r)
    }

    pub fn mkdir(
        self: &Arc<Self>,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Durable<Entry> {
        let mut set = SyncSet::default();
        let r = self.ns.mkdir(&mut set, caller, parent, name, mode, umask);
        self.entry_durable(set, r)
    }

    pub fn symlink(
        self: &Arc<Self>,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        target: &Path,
    ) -> Durable<Entry> {
        let mut set = SyncSet::default();
        let r = self.ns.symlink(&mut set, caller, parent, name, target);
        self.entry_durable(set, r)
    }

    pub fn link(self: &Arc<Self>, ino: Ino, newparent: Ino, newname: &OsStr) -> Durable<Entry> {
        let mut set = SyncSet::default();
        let r = self.ns.link(&mut set, ino, newparent, newname);
        self.entry_durable(set, r)
    }

    /// UNLINK (`dir` false) or RMDIR (`dir` true).
    pub fn unlink(self: &Arc<Self>, parent: Ino, name: &OsStr, dir: bool) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self.ns.unlink(&mut set, parent, name, dir);
        self.durable(set, r, |_, _| {})
    }

    /// RENAME; `flags`: RENAME_NOREPLACE, RENAME_EXCHANGE as renameat2(2) takes them.
    pub fn rename(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self
            .ns
            .rename(&mut set, parent, name, newparent, newname, flags);
        self.durable(set, r, |_, _| {})
    }

    pub fn statfs(&self) -> Result<Statfs> {
        self.ns.statfs()
    }

    /// GETXATTR; `size` 0 asks for the length only (a buffer of that length comes back).
    pub fn getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        self.ns.getxattr(ino, name, size)
    }

    /// LISTXATTR; `size` 0 asks for the length only.
    pub fn listxattr(&self, ino: Ino, size: u32) -> Result<Vec<u8>> {
        self.ns.listxattr(ino, size)
    }

    pub fn setxattr(
        self: &Arc<Self>,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self.ns.setxattr(&mut set, ino, name, value, flags);
        self.durable(set, r, |_, _| {})
    }

    pub fn removexattr(self: &Arc<Self>, ino: Ino, name: &OsStr) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self.ns.removexattr(&mut set, ino, name);
        self.durable(set, r, |_, _| {})
    }

    pub fn opendir(&self, ino: Ino) -> Result<Fh> {
        self.ns.opendir(ino)
    }

    /// READDIR from `offset`: `add(ino, next offset, kind, name)` takes each entry and
    /// says whether the reply is full.
    pub fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        add: impl FnMut(u64, u64, FileKind, &OsStr) -> bool,
    ) -> Result<()> {
        self.ns.readdir(ino, fh, offset, add)
    }

    /// READDIRPLUS from `offset`: `add(next offset, name, entry)` takes each entry with
    /// its attributes and says whether the reply is full.
    pub fn readdirplus(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        add: impl FnMut(u64, &OsStr, &Entry) -> bool,
    ) -> Result<()> {
        self.ns.readdirplus(ino, fh, offset, add)
    }

    pub fn releasedir(&self, fh: Fh) {
        self.ns.releasedir(fh);
    }

    pub fn fsyncdir(self: &Arc<Self>, ino: Ino) -> Durable<()> {
        let mut set = SyncSet::default();
        let r = self.ns.fsync_dir(&mut set, ino);
        self.durable(set, r, |_, _| {})
    }
}
