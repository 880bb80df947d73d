//! The `fuser::Filesystem` adapter: turns each FUSE request into one call on [`Mount`]
//! and its result into fuser's reply. No state and no decisions of its own beyond what
//! INIT negotiates with the kernel.
//!
//! Crash semantics: none of its own (see `mount`).

use super::convert::{caller, entry, errno, file_attr, fopen, fuser_backing, kind, set_time};
use crate::config::{ReaddirPlus, ATTR_TTL, MAX_BACKGROUND_MIN, MAX_WRITE_BYTES};
use crate::error::Result;
use crate::kernel::{BackingId, Fh, Ino, Negotiated, OpenReply, ReplyFlags, SetAttr};
use crate::mount::Mount;
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::SystemTime;

/// Kernel stacking depth announced with passthrough: one above the backing file system,
/// two when that is itself stacked (FUSE, overlayfs, ecryptfs).
fn passthrough_stack_depth(m: &Mount) -> u32 {
    const STACKED_MAGICS: [i64; 3] = [0x6573_5546, 0x794c_7630, 0xf15f];
    match rustix::fs::fstatfs(m.dir().root_fd()) {
        Ok(s) if STACKED_MAGICS.contains(&{ s.f_type }) => 2,
        _ => 1,
    }
}

/// The `fuser::Filesystem` adapter; all state lives in [`Mount`].
pub struct DhrdFs {
    m: Arc<Mount>,
    /// The session's worker threads: how many requests the daemon serves at once.
    workers: usize,
}

impl DhrdFs {
    pub fn new(m: Arc<Mount>, workers: usize) -> Self {
        Self { m, workers }
    }
}

fn reply_entry(r: Result<crate::kernel::Entry>, reply: ReplyEntry) {
    match r {
        Ok(e) => {
            let (attr, generation) = entry(&e);
            reply.entry(&ATTR_TTL, &attr, generation)
        }
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(r: Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_xattr(r: Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Adds the capability `flag` if the kernel offers it; whether it was added.
fn offer(config: &mut KernelConfig, flag: InitFlags) -> bool {
    config.capabilities().contains(flag) && config.add_capabilities(flag).is_ok()
}

/// Asynchronous direct I/O (io_uring, libaio: databases, VMs with `aio=native`): without
/// `FUSE_ASYNC_DIO` the kernel serves each such I/O synchronously in the submitter, so a
/// process with 24 in flight has one in the daemon at a time. With it, the kernel sends
/// them (and the `max_write` pieces of a large one) as background requests without
/// waiting, and holds back those beyond `max_background`: that is raised to the worker
/// count, so that every worker may serve one. Congestion (which makes the kernel skip
/// async readahead and background writeback) starts at three quarters of it, as the
/// kernel's default does.
fn offer_async_dio(config: &mut KernelConfig, workers: usize) {
    offer(config, InitFlags::FUSE_ASYNC_DIO);
    let max = u16::try_from(workers)
        .unwrap_or(u16::MAX)
        .max(MAX_BACKGROUND_MIN);
    // Both refuse only 0.
    let set = config.set_max_background(max);
    debug_assert!(set.is_ok(), "max_background {max}: {set:?}");
    let set = config.set_congestion_threshold(max / 4 * 3);
    debug_assert!(set.is_ok(), "congestion_threshold {}: {set:?}", max / 4 * 3);
}

impl Filesystem for DhrdFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        offer(config, InitFlags::FUSE_PARALLEL_DIROPS);
        offer_async_dio(config, self.workers);
        // A symlink's target never changes (a new target is a new inode), so the kernel
        // may keep it: following a symlink again costs no READLINK round trip.
        offer(config, InitFlags::FUSE_CACHE_SYMLINKS);
        let mut n = Negotiated {
            mmap_on_direct: offer(config, InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP),
            ..Negotiated::default()
        };
        n.passthrough = self.m.wants_passthrough()
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config
                .set_max_stack_depth(passthrough_stack_depth(&self.m))
                .is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
        // Listing a directory then stat'ing its entries (ls -l, find, rsync, du) costs one
        // LOOKUP round trip per entry; READDIRPLUS returns the attributes with the names.
        let plus = match self.m.cfg().readdirplus {
            ReaddirPlus::Auto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            ReaddirPlus::Always => InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Off => InitFlags::empty(),
        };
        if !plus.is_empty() && config.capabilities().contains(plus) {
            let _ = config.add_capabilities(plus);
        }
        // The daemon drops set-id bits itself (killpriv.rs). In return the kernel sets
        // SB_NOSEC, so cached writes stop asking for security.capability (one GETXATTR
        // round trip per write before).
        n.killpriv_v2 = offer(config, InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // open(O_TRUNC) of an existing file (shell `>`, editors, log rotation) is then one
        // OPEN instead of an OPEN and a SETATTR round trip.
        n.atomic_o_trunc = offer(config, InitFlags::FUSE_ATOMIC_O_TRUNC);
        if let Err(max) = config.set_max_write(MAX_WRITE_BYTES) {
            let _ = config.set_max_write(max);
        }
        // With everything negotiated, the data path: the page cache where possible.
        self.m.init(n).map_err(|msg| {
            eprintln!("dhrd: {msg}");
            std::io::Error::other(msg)
        })
    }

    fn destroy(&mut self) {
        self.m.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(self.m.lookup(Ino(parent.0), name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.m.forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.m.getattr(Ino(ino.0), fh.map(|f| Fh(f.0))) {
            Ok(a) => reply.attr(&ATTR_TTL, &file_attr(&a)),
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
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| Fh(f.0)),
        };
        let done = self.m.setattr(&caller(req), Ino(ino.0), &change);
        done.reply(move |r| match r {
            Ok(a) => reply.attr(&ATTR_TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.m.readlink(Ino(ino.0)) {
            Ok(t) => reply.data(&t),
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
        let (c, p) = (caller(req), Ino(parent.0));
        let done = self.m.mknod(&c, p, name, mode, umask, rdev);
        done.reply(move |r| reply_entry(r, reply));
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
        let (c, p) = (caller(req), Ino(parent.0));
        let done = self.m.mkdir(&c, p, name, mode, umask);
        done.reply(move |r| reply_entry(r, reply));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.m.unlink(Ino(parent.0), name, false);
        done.reply(move |r| reply_empty(r, reply));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.m.unlink(Ino(parent.0), name, true);
        done.reply(move |r| reply_empty(r, reply));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let (c, p) = (caller(req), Ino(parent.0));
        let done = self.m.symlink(&c, p, link_name, target);
        done.reply(move |r| reply_entry(r, reply));
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
        let (p, np) = (Ino(parent.0), Ino(newparent.0));
        let done = self.m.rename(p, name, np, newname, flags.bits());
        done.reply(move |r| reply_empty(r, reply));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let done = self.m.link(Ino(ino.0), Ino(newparent.0), newname);
        done.reply(move |r| reply_entry(r, reply));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let done = {
            let register = |fd: BorrowedFd<'_>| reply.open_backing(fd).map(BackingId::new);
            self.m.open(&caller(req), Ino(ino.0), flags.0, &register)
        };
        done.reply(move |r| match r {
            Ok((fh, OpenReply::Plain(fl))) => reply.opened(FileHandle(fh.0), fopen(fl)),
            Ok((fh, OpenReply::Passthrough(fl, id))) => {
                reply.opened_passthrough(FileHandle(fh.0), fopen(fl), fuser_backing(&id))
            }
            Err(e) => reply.error(errno(&e)),
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
        match self.m.read(Fh(fh.0), offset, size) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(errno(&e)),
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
        // (RWF_DSYNC, RWF_SYNC); the daemon honours them (`WriteSync`).
        match self
            .m
            .write(&caller(req), Fh(fh.0), offset, data, kill, flags.0)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
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
        self.m.release(Fh(fh.0));
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
        let done = self.m.fsync(Fh(fh.0), datasync);
        done.reply(move |r| reply_empty(r, reply));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.m.opendir(Ino(ino.0)) {
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
        let r = self
            .m
            .readdir(Ino(ino.0), Fh(fh.0), offset, |i, next, k, name| {
                reply.add(INodeNo(i), next, kind(k), name)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self
            .m
            .readdirplus(Ino(ino.0), Fh(fh.0), offset, |next, name, e| {
                let (attr, generation) = entry(e);
                reply.add(attr.ino, next, name, &ATTR_TTL, &attr, generation)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
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
        match self.m.lseek(Fh(fh.0), offset, whence) {
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
        self.m.releasedir(Fh(fh.0));
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
        let done = self.m.fsyncdir(Ino(ino.0));
        done.reply(move |r| reply_empty(r, reply));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.m.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_bytes,
                s.name_bytes_max,
                s.fragment_bytes,
            ),
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
        let done = self.m.setxattr(Ino(ino.0), name, value, flags);
        done.reply(move |r| reply_empty(r, reply));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(self.m.getxattr(Ino(ino.0), name, size), size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(self.m.listxattr(Ino(ino.0), size), size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.m.removexattr(Ino(ino.0), name);
        done.reply(move |r| reply_empty(r, reply));
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
        let done = {
            let register = |fd: BorrowedFd<'_>| reply.open_backing(fd).map(BackingId::new);
            let c = caller(req);
            let p = Ino(parent.0);
            self.m.create(&c, p, name, mode, umask, flags, &register)
        };
        done.reply(move |r| match r {
            Ok((e, fh, open)) => {
                let (attr, generation) = entry(&e);
                let fh = FileHandle(fh.0);
                match open {
                    OpenReply::Plain(fl) => {
                        reply.created(&ATTR_TTL, &attr, generation, fh, fopen(fl))
                    }
                    OpenReply::Passthrough(fl, id) => reply.created_passthrough(
                        &ATTR_TTL,
                        &attr,
                        generation,
                        fh,
                        fopen(fl),
                        fuser_backing(&id),
                    ),
                }
            }
            Err(e) => reply.error(errno(&e)),
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
        let r = self
            .m
            .fallocate(&caller(req), Fh(fh.0), offset, length, mode);
        reply_empty(r, reply);
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
        let (i, o) = (Fh(fh_in.0), Fh(fh_out.0));
        let c = caller(req);
        match self
            .m
            .copy_file_range(&c, i, offset_in, o, offset_out, len, flags.bits())
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
