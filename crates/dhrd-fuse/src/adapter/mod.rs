//! The `fuser::Filesystem` adapter: turns each FUSE request into a call on [`Shared`] and
//! its result into the reply. No state and no decisions of its own beyond what INIT
//! negotiates with the kernel.
//!
//! Crash semantics: none of its own (see `fs.rs`, `meta.rs`, `data.rs`).

use crate::config::{ReadPath, ReaddirPlus, ATTR_TTL, MAX_WRITE_BYTES, READDIRPLUS_BATCH_MAX};
use crate::durable::commit::SyncSet;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, BackingId, FileKind, OpenReply, ReplyFlags, SetAttr, SetTime};
use crate::kernel::{Fh, Ino};
use crate::killpriv::Caller;
use crate::mount::Shared;
use crate::sys;
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rustix::fs::OFlags;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

/// Kernel stacking depth announced with passthrough: one above the backing file system,
/// two when that is itself stacked (FUSE, overlayfs, ecryptfs).
fn passthrough_stack_depth(sh: &Shared) -> u32 {
    const STACKED_MAGICS: [i64; 3] = [0x6573_5546, 0x794c_7630, 0xf15f];
    match rustix::fs::fstatfs(sh.dir.root_fd()) {
        Ok(s) if STACKED_MAGICS.contains(&{ s.f_type }) => 2,
        _ => 1,
    }
}

/// The caller's credentials as the core takes them.
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::NamedPipe => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::RegularFile => FileType::RegularFile,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: std::time::UNIX_EPOCH,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(at),
    })
}

fn fopen(f: ReplyFlags) -> FopenFlags {
    FopenFlags::from_bits_retain(f.bits())
}

/// The fuser token inside a backing id this adapter made (`register`).
fn fuser_backing(id: &BackingId) -> &fuser::BackingId {
    #[allow(clippy::expect_used)] // only this adapter makes backing ids for this session
    id.get::<fuser::BackingId>()
        .expect("a backing id made by another transport")
}

/// The core's notices to the kernel, sent through the session's notifier.
pub struct Notices(pub fuser::Notifier);

impl crate::kernel::Invalidate for Notices {
    fn inode_attrs(&self, ino: u64) {
        // Offset -1: attributes only, no page cache, no inode lock. A failure leaves
        // stale attributes, not a wrong file.
        let _ = self.0.inval_inode(INodeNo(ino), -1, 0);
    }
}

/// The `fuser::Filesystem` adapter; all state lives in [`Shared`].
pub struct DhrdFs {
    pub sh: Arc<Shared>,
}

/// Replies to a request that creates a directory entry (mknod, mkdir, symlink, link).
fn reply_new_entry(sh: &Shared, r: Result<Attr>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(sh.generation(&a))),
        Err(e) => reply.error(Errno::from_i32(sh.count_err(&e))),
    }
}

fn reply_empty(sh: &Shared, r: Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(sh.count_err(&e))),
    }
}

impl DhrdFs {
    /// Runs a metadata request that makes a new entry, replying once it is durable.
    fn new_entry(&self, reply: ReplyEntry, op: impl FnOnce(&mut SyncSet) -> Result<Attr>) {
        let mut set = SyncSet::default();
        let r = op(&mut set);
        self.sh
            .reply_entry_when_durable(set, r, move |sh, r| reply_new_entry(sh, r, reply));
    }

    /// Runs a metadata request with an empty reply, replying once it is durable.
    fn empty(&self, reply: ReplyEmpty, op: impl FnOnce(&mut SyncSet) -> Result<()>) {
        let mut set = SyncSet::default();
        let r = op(&mut set);
        self.sh
            .reply_when_durable(set, r, move |sh, r| reply_empty(sh, r, reply));
    }
}

impl Filesystem for DhrdFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        if caps.contains(InitFlags::FUSE_PARALLEL_DIROPS) {
            let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        }
        // A symlink's target never changes (a new target is a new inode), so the kernel
        // may keep it: following a symlink again costs no READLINK round trip.
        if caps.contains(InitFlags::FUSE_CACHE_SYMLINKS) {
            let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        }
        if caps.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok()
        {
            self.sh.mmap_on_direct.store(true, Ordering::Release);
        }
        // Every path but engine-direct and engine-cached can use passthrough (the page
        // cache path needs it; engine-auto and engine-passthrough hand the kernel memfds).
        let want_pt = !matches!(
            self.sh.cfg.read_path,
            ReadPath::EngineDirect | ReadPath::EngineCached
        );
        if want_pt
            && caps.contains(InitFlags::FUSE_PASSTHROUGH)
            && config
                .set_max_stack_depth(passthrough_stack_depth(&self.sh))
                .is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            self.sh
                .passthrough_negotiated
                .store(true, Ordering::Release);
        }
        // Listing a directory then stat'ing its entries (ls -l, find, rsync, du) costs one
        // LOOKUP round trip per entry; READDIRPLUS returns the attributes with the names.
        let plus = match self.sh.cfg.readdirplus {
            ReaddirPlus::Auto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            ReaddirPlus::Always => InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Off => InitFlags::empty(),
        };
        if !plus.is_empty() && caps.contains(plus) {
            let _ = config.add_capabilities(plus);
        }
        // The daemon drops set-id bits itself (killpriv.rs). In return the kernel sets
        // SB_NOSEC, so cached writes stop asking for security.capability (one GETXATTR
        // round trip per write before).
        if caps.contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            && config
                .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
                .is_ok()
        {
            self.sh.killpriv_negotiated.store(true, Ordering::Release);
        }
        // open(O_TRUNC) of an existing file (shell `>`, editors, log rotation) is then one
        // OPEN instead of an OPEN and a SETATTR round trip.
        if caps.contains(InitFlags::FUSE_ATOMIC_O_TRUNC)
            && config
                .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
                .is_ok()
        {
            self.sh.atomic_o_trunc.store(true, Ordering::Release);
        }
        if let Err(max) = config.set_max_write(MAX_WRITE_BYTES) {
            let _ = config.set_max_write(max);
        }
        // With everything negotiated, the data path: the page cache where possible.
        self.sh.choose_tier().map_err(|msg| {
            eprintln!("dhrd: {msg}");
            std::io::Error::other(msg)
        })
    }

    fn destroy(&mut self) {
        self.sh.shutdown.store(true, Ordering::Release);
        if let Err(e) = self.sh.close_everything() {
            self.sh
                .record_final_error(format!("flushing file data at unmount failed: {e}"));
        }
        // Every request is answered by now; the committer's thread ends with its queue.
        self.sh.committer.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.sh.stats.lookups.fetch_add(1, Ordering::Relaxed);
        let r = sys::check_name(name)
            .and_then(|_| self.sh.dir_fd(Ino(parent.0)))
            .and_then(|pfd| self.sh.lookup_in(Ino(parent.0), &pfd, name));
        match r {
            Ok(attr) => reply.entry(
                &ATTR_TTL,
                &file_attr(&attr),
                Generation(self.sh.generation(&attr)),
            ),
            // A negative entry (node 0) that the kernel may keep as long as a positive one:
            // names appear only through this daemon (create, mkdir, link, rename...), and
            // the kernel replaces the negative dentry itself when they do. Saves a round
            // trip for every repeated probe of a missing name (PATH and include-path
            // searches, Python imports, build tools checking outputs).
            Err(e) if errno(&e) == Errno::ENOENT => reply.entry(
                &ATTR_TTL,
                &file_attr(&self.sh.placeholder_attr()),
                Generation(0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.sh.nodes.lock().forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = match fh.and_then(|f| self.sh.handle_stat(Fh(f.0))) {
            Some(st) => Ok(st),
            None => self.sh.stat_node(Ino(ino.0)),
        };
        match r {
            Ok(st) => reply.attr(&ATTR_TTL, &file_attr(&self.sh.attr(&st))),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.sh.stats.setattrs.fetch_add(1, Ordering::Relaxed);
        let mut set = SyncSet::default();
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| Fh(f.0)),
        };
        let r = self
            .sh
            .do_setattr(&mut set, &caller(req), Ino(ino.0), &change);
        self.sh.reply_when_durable(set, r, move |sh, r| match r {
            Ok(a) => reply.attr(&ATTR_TTL, &file_attr(&a)),
            Err(e) => reply.error(Errno::from_i32(sh.count_err(&e))),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.sh.stats.readlinks.fetch_add(1, Ordering::Relaxed);
        let r = self
            .sh
            .node_fd(Ino(ino.0), OFlags::PATH)
            .and_then(|(fd, _)| Ok(rustix::fs::readlinkat(&fd, "", Vec::new())?));
        match r {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.new_entry(reply, |set| {
            self.sh
                .do_mknod(set, &caller(req), Ino(parent.0), name, mode, umask, rdev)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.new_entry(reply, |set| {
            self.sh
                .do_mkdir(set, &caller(req), Ino(parent.0), name, mode, umask)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |set| {
            self.sh.do_unlink(set, Ino(parent.0), name, false)
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |set| {
            self.sh.do_unlink(set, Ino(parent.0), name, true)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.new_entry(reply, |set| {
            self.sh
                .do_symlink(set, &caller(req), Ino(parent.0), link_name, target)
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |set| {
            self.sh.do_rename(
                set,
                Ino(parent.0),
                name,
                Ino(newparent.0),
                newname,
                flags.bits(),
            )
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.new_entry(reply, |set| {
            self.sh.do_link(set, Ino(ino.0), Ino(newparent.0), newname)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut set = SyncSet::default();
        let r = {
            let register =
                |fd: std::os::fd::BorrowedFd<'_>| reply.open_backing(fd).map(BackingId::new);
            self.sh
                .open_file(&mut set, &caller(req), Ino(ino.0), flags.0, &register)
        };
        // Only an O_TRUNC open has something to make durable before the reply; a failed
        // sync closes the handle again (the kernel never learns of it).
        let undo = |sh: &Shared, (fh, _): (Fh, OpenReply)| sh.release_file(fh);
        self.sh
            .reply_when_durable_or(set, r, undo, move |sh, r| match r {
                Ok((fh, OpenReply::Plain(fl))) => reply.opened(FileHandle(fh.0), fopen(fl)),
                Ok((fh, OpenReply::Passthrough(fl, id))) => {
                    reply.opened_passthrough(FileHandle(fh.0), fopen(fl), fuser_backing(&id))
                }
                Err(e) => reply.error(Errno::from_i32(sh.count_err(&e))),
            });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.sh.do_read(Fh(fh.0), offset, size) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(Errno::from_i32(self.sh.count_err(&e))),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // `flags`: the open's flags, plus O_DSYNC / O_SYNC where this write asked for it
        // (RWF_DSYNC, RWF_SYNC); the daemon honours them (data.rs, `WriteSync`).
        match self
            .sh
            .do_write(&caller(req), Fh(fh.0), offset, data, kill, flags.0)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(Errno::from_i32(self.sh.count_err(&e))),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) does not promise durability (fsync does, and sync mode already has it)
        // and no POSIX locks are held here, so there is nothing to do. ENOSYS makes the
        // kernel stop sending FLUSH (fc->no_flush) and report success to close: one daemon
        // round trip less per close, which small-file workloads feel.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.sh.release_file(Fh(fh.0));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |set| self.sh.do_fsync(set, Fh(fh.0), datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.sh.do_opendir(Ino(ino.0)) {
            // The kernel may keep the listing in the directory's page cache across opens:
            // it drops it itself when a create, unlink, rename... through the mount changes
            // the directory (or its mtime changes), and nothing else changes it (see the
            // rule on changes behind the daemon's back). Repeated listings then cost no
            // READDIR round trip (`ls`, find, git status walking a tree again).
            Ok(fh) => reply.opened(
                FileHandle(fh.0),
                fopen(ReplyFlags::CACHE_DIR | ReplyFlags::KEEP_CACHE),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if let Err(e) = self.sh.dir_entries_ready(Ino(ino.0), Fh(fh.0)) {
            reply.error(errno(&e));
            return;
        }
        let dirs = self.sh.dirs.lock();
        let Some(d) = dirs.get(&Fh(fh.0)) else {
            reply.error(Errno::EBADF);
            return;
        };
        for (i, (ino, k, name)) in d.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, kind(*k), name) {
                break;
            }
        }
        drop(dirs);
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if let Err(e) = self.sh.dir_entries_ready(Ino(ino.0), Fh(fh.0)) {
            reply.error(errno(&e));
            return;
        }
        // Copy one batch out so the directory lock is not held while stat'ing entries.
        let batch: Vec<(u64, FileKind, OsString)> = {
            let dirs = self.sh.dirs.lock();
            let Some(d) = dirs.get(&Fh(fh.0)) else {
                reply.error(Errno::EBADF);
                return;
            };
            d.entries
                .iter()
                .skip(offset as usize)
                .take(READDIRPLUS_BATCH_MAX)
                .cloned()
                .collect()
        };
        let pfd = match self.sh.dir_fd(Ino(ino.0)) {
            Ok(fd) => fd,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        for (i, (eino, kind, name)) in batch.iter().enumerate() {
            let next = offset + i as u64 + 1;
            if name == "." || name == ".." {
                // The kernel links neither and counts no lookup for them.
                let attr = file_attr(&Attr {
                    ino: *eino,
                    kind: *kind,
                    ..self.sh.placeholder_attr()
                });
                if reply.add(INodeNo(*eino), next, name, &ATTR_TTL, &attr, Generation(0)) {
                    break;
                }
                continue;
            }
            // Gone since opendir: left out, as a later readdir would. On another file
            // system (not part of the tree; LOOKUP says EXDEV): inode 0, which the kernel
            // does not link and readdir(3) skips.
            let Ok(st) = sys::stat_at(pfd.as_fd(), name) else {
                continue;
            };
            let attr = if st.st_dev == self.sh.dir.dev() {
                self.sh.attr(&st)
            } else {
                Attr {
                    ino: 0,
                    kind: *kind,
                    ..self.sh.placeholder_attr()
                }
            };
            if reply.add(
                INodeNo(attr.ino),
                next,
                name,
                &ATTR_TTL,
                &file_attr(&attr),
                Generation(self.sh.generation(&attr)),
            ) {
                break;
            }
            if attr.ino != 0 {
                // Counted only once the entry is in the reply: the kernel takes one lookup
                // reference per entry it receives.
                self.sh
                    .nodes
                    .lock()
                    .remember(Ino(attr.ino), Ino(ino.0), name);
                self.sh
                    .stats
                    .readdirplus_entries
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.sh.do_lseek(Fh(fh.0), offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.sh.dirs.lock().remove(&Fh(fh.0));
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |set| {
            let (fd, _) = self
                .sh
                .node_fd(Ino(ino.0), OFlags::RDONLY | OFlags::DIRECTORY)?;
            if self.sh.sync_mode() {
                set.fsync(&[&fd])
            } else {
                sys::fsync(fd.as_fd()).map_err(FsError::from)?;
                self.sh.meta_dirty.store(true, Ordering::Release);
                self.sh.sync_metadata()
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.sh.do_statfs() {
            Ok((b, bf, ba, f, ff, bs, nl, fr)) => reply.statfs(b, bf, ba, f, ff, bs, nl, fr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |set| {
            self.sh.do_setxattr(set, Ino(ino.0), name, value, flags)
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.sh.do_getxattr(Ino(ino.0), name, size) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.sh.do_listxattr(Ino(ino.0), size) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |set| self.sh.do_removexattr(set, Ino(ino.0), name));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel has already checked the mode bits.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut set = SyncSet::default();
        let r = {
            let register =
                |fd: std::os::fd::BorrowedFd<'_>| reply.open_backing(fd).map(BackingId::new);
            self.sh.create_file(
                &mut set,
                &caller(req),
                Ino(parent.0),
                name,
                mode,
                umask,
                flags,
                &register,
            )
        };
        // The kernel never gets the entry nor the handle: both go.
        let undo = |sh: &Shared, (attr, fh, _): (Attr, Fh, OpenReply)| {
            sh.release_file(fh);
            sh.entry_not_sent(&attr);
        };
        self.sh
            .reply_when_durable_or(set, r, undo, move |sh, r| match r {
                Ok((attr, fh, OpenReply::Plain(fl))) => reply.created(
                    &ATTR_TTL,
                    &file_attr(&attr),
                    Generation(sh.generation(&attr)),
                    FileHandle(fh.0),
                    fopen(fl),
                ),
                Ok((attr, fh, OpenReply::Passthrough(fl, id))) => reply.created_passthrough(
                    &ATTR_TTL,
                    &file_attr(&attr),
                    Generation(sh.generation(&attr)),
                    FileHandle(fh.0),
                    fopen(fl),
                    fuser_backing(&id),
                ),
                Err(e) => reply.error(Errno::from_i32(sh.count_err(&e))),
            });
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self
            .sh
            .do_fallocate(&caller(req), Fh(fh.0), offset, length, mode)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(self.sh.count_err(&e))),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.sh.do_copy_file_range(
            &caller(req),
            Fh(fh_in.0),
            offset_in,
            Fh(fh_out.0),
            offset_out,
            len,
            flags.bits(),
        ) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(Errno::from_i32(self.sh.count_err(&e))),
        }
    }
}
