//! The state every FUSE handler shares ([`Shared`]) and what metadata and data requests
//! have in common: confined access to nodes, attributes, durability of metadata, set-id
//! bits. The requests themselves are in `meta.rs` (namespace, listings, xattrs), `data.rs`
//! (opens, reads, writes, on either data path) and `adapter.rs` (the fuser adapter).
//!
//! Invariants:
//! - The daemon is the only writer of the tree while mounted; the kernel caches entries and
//!   attributes for `ATTR_TTL` because every change passes through here. The one change the
//!   kernel does not expect is the set-id bits a write or fallocate drops (killpriv.rs); the
//!   daemon invalidates the inode's cached attributes when it drops them.
//! - Metadata: in `sync` durability every change (create, mkdir, mknod, symlink, link,
//!   rename, unlink, rmdir, setattr, setxattr, removexattr, set-id bits dropped by a write,
//!   truncate, chown or fallocate) is followed by `fsync` of the changed inode and of the
//!   parent directory (both parents for rename) before the reply. Set-id bits are dropped
//!   (in `sync` mode durably) before the data changes, so a crash cannot leave new content
//!   with them still set. In `fsync` / `periodic:N` the backing file system is `syncfs`'ed
//!   at fsync, fsyncdir, every period and at unmount instead.
//! - In `sync` mode a metadata request's reply waits for the committer (commit.rs), which
//!   syncs the changes of concurrent requests together, off the worker threads.
//! - The data path (`Tier`) is chosen once, when the kernel's INIT says what it offers,
//!   before any other request.
//!
//! Crash semantics: a reply that reported success in `sync` mode is on the backing device.
//! A crash between the backing operation and its fsync leaves whatever the backing file
//! system recovers, which is either the old or the new state of that one operation.

#[cfg(test)]
mod tests;
pub mod walk;

use crate::config::{FsConfig, STAT_BLKSIZE};
use crate::data::{Handle, Tier};
use crate::durable::commit::{Committer, RoundSync, SyncSet};
use crate::error::{FsError, Result};
use crate::kernel::{Attr, FileKind, Invalidate, SetAttr, SetTime};
use crate::kernel::{Fh, Ino};
use crate::killpriv::{self, Caller, Fsetid};
use crate::meta::nodes::NodeTable;
use crate::meta::DirHandle;
use crate::stats::FsStats;
use crate::sys::{self, BackingDir};
use dhrd_engine::{Durability, RamBudget};
use parking_lot::{Condvar, Mutex, RwLock};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Progress of the background walk that finds and preloads files.
#[derive(Default)]
pub struct PreloadState {
    pub files_seen: AtomicU64,
    pub bytes_seen: AtomicU64,
    pub files_preloaded: AtomicU64,
    pub done: AtomicBool,
}

/// The inode behind a new directory entry, for `Shared::entry_durable`.
pub(crate) enum NewInode<'a> {
    /// Open: fsync'ed by descriptor.
    Fd(&'a dyn AsFd),
    /// No descriptor can sync it (symlink, FIFO, socket, device node, a link count).
    NoFd,
}

/// State shared by the FUSE handlers, the control socket and the background threads.
pub struct Shared {
    pub dir: Arc<BackingDir>,
    pub cfg: FsConfig,
    /// RAM budget of whichever data path runs: pinned page cache, or engine chunks.
    pub budget: Arc<RamBudget>,
    pub stats: FsStats,
    pub preload: PreloadState,
    /// The data path, chosen at INIT (`set_tier`); `tier_ready` wakes threads waiting for it.
    tier: OnceLock<Tier>,
    tier_ready: (Mutex<bool>, Condvar),
    /// Why the mount does not run on the page cache though it was the default, if so.
    pub fallback: Mutex<Option<String>>,
    /// `sync` mode: whether the backing file system keeps FS_SYNC_FL (probed at start).
    pub sync_flag_probe: std::result::Result<(), String>,
    pub(crate) nodes: Mutex<NodeTable>,
    pub(crate) handles: RwLock<HashMap<Fh, Handle>>,
    pub(crate) dirs: Mutex<HashMap<Fh, DirHandle>>,
    next_fh: AtomicU64,
    pub shutdown: AtomicBool,
    pub passthrough_negotiated: AtomicBool,
    pub mmap_on_direct: AtomicBool,
    /// FUSE_HANDLE_KILLPRIV_V2 negotiated: the kernel leaves dropping set-id bits on cached
    /// writes, size changes, chown and fallocate to the daemon (killpriv.rs).
    pub killpriv_negotiated: AtomicBool,
    /// FUSE_ATOMIC_O_TRUNC accepted: OPEN carries O_TRUNC and the daemon truncates.
    pub atomic_o_trunc: AtomicBool,
    /// Sends cache invalidations to the kernel; set by the daemon once the session exists.
    pub notifier: OnceLock<Box<dyn Invalidate>>,
    /// Metadata changed since the last syncfs (non-sync modes).
    pub(crate) meta_dirty: AtomicBool,
    /// Syncs metadata changes in rounds, off the worker threads (`sync` mode).
    pub committer: Arc<Committer>,
    /// First failure of the flush at unmount; makes the daemon exit non-zero.
    final_error: Mutex<Option<String>>,
    /// The daemon runs as root: it gives new inodes to their callers (`chown_new`).
    pub(crate) daemon_is_root: bool,
}

fn systime(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    }
}

pub(crate) fn timestamp(t: Option<SetTime>) -> rustix::fs::Timespec {
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

impl Shared {
    pub fn new(dir: BackingDir, cfg: FsConfig) -> Result<Arc<Self>> {
        let budget = RamBudget::new(cfg.mem_bytes);
        let mut nodes = NodeTable::with_dir_fds_max(cfg.dir_fds_max);
        let root = dir
            .root_fd()
            .try_clone_to_owned()
            .map_err(|e| FsError::io("dup of the backing root", e))?;
        nodes.keep_dir(Ino(sys::FUSE_ROOT_INO), Arc::new(root));
        let round_sync = RoundSync::for_fs(dir.root_fd());
        // The page cache path needs the flag only to make writes durable (`sync` mode).
        let sync_flag_probe = if cfg.durability == Durability::Sync {
            dhrd_pagecache::probe_sync_flag(dir.root_fd()).map_err(|e| {
                format!("the backing file system does not keep the sync flag (FS_SYNC_FL): {e}")
            })
        } else {
            Ok(())
        };
        Ok(Arc::new(Self {
            dir: Arc::new(dir),
            cfg,
            budget,
            stats: FsStats::default(),
            preload: PreloadState::default(),
            tier: OnceLock::new(),
            tier_ready: (Mutex::new(false), Condvar::new()),
            fallback: Mutex::new(None),
            sync_flag_probe,
            nodes: Mutex::new(nodes),
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            passthrough_negotiated: AtomicBool::new(false),
            mmap_on_direct: AtomicBool::new(false),
            killpriv_negotiated: AtomicBool::new(false),
            atomic_o_trunc: AtomicBool::new(false),
            notifier: OnceLock::new(),
            meta_dirty: AtomicBool::new(false),
            committer: Committer::start(round_sync)
                .map_err(|e| FsError::Setup(format!("starting the metadata committer: {e}")))?,
            final_error: Mutex::new(None),
            daemon_is_root: rustix::process::geteuid().is_root(),
        }))
    }

    /// The data path. Set at INIT, which the kernel sends before any other request.
    pub fn tier(&self) -> &Tier {
        #[allow(clippy::expect_used)] // an invariant of the protocol, not an I/O outcome
        self.tier
            .get()
            .expect("a request before INIT chose the data path")
    }

    /// The data path, if INIT has chosen it.
    pub fn tier_if_set(&self) -> Option<&Tier> {
        self.tier.get()
    }

    /// Sets the data path (once, at INIT) and wakes `wait_tier`.
    pub(crate) fn set_tier(&self, t: Tier) {
        let _ = self.tier.set(t);
        let (m, cv) = &self.tier_ready;
        *m.lock() = true;
        cv.notify_all();
    }

    /// Waits until INIT has chosen the data path, or the mount is shutting down (None).
    pub fn wait_tier(&self) -> Option<&Tier> {
        let (m, cv) = &self.tier_ready;
        let mut ready = m.lock();
        while !*ready && !self.shutdown.load(Ordering::Acquire) {
            cv.wait_for(&mut ready, Duration::from_millis(100));
        }
        self.tier.get()
    }

    pub(crate) fn sync_mode(&self) -> bool {
        self.cfg.durability == Durability::Sync
    }

    /// Makes a metadata change durable per the durability mode (see module header): in
    /// `sync` mode the inodes behind `fds` join the request's `set`, which the committer
    /// syncs before the reply (commit.rs); otherwise the next syncfs covers the change.
    pub(crate) fn meta_durable(&self, set: &mut SyncSet, fds: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode() {
            set.fsync(fds)?;
        } else {
            self.meta_dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Like `meta_durable` for a change that leaves data in the page cache too (a size
    /// inside a page zeroes the rest of that page): in `sync` mode the files are fsync'ed
    /// with their data, which a journal commit alone would not write (commit.rs).
    pub(crate) fn data_durable(&self, set: &mut SyncSet, fds: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode() {
            set.fsync_data(fds)?;
        } else {
            self.meta_dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Like `meta_durable` for a change whose inode cannot be synced by descriptor
    /// (symlinks, FIFOs, link counts): a syncfs of the file system `fd` is on.
    pub(crate) fn meta_durable_fs(&self, set: &mut SyncSet, fd: &dyn AsFd) -> Result<()> {
        if self.sync_mode() {
            set.syncfs(fd)?;
        } else {
            self.meta_dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Makes a new directory entry durable per the mode: the entry's directory and the
    /// new inode itself (on a backing without a journal nothing else writes the inode,
    /// and an entry naming an unwritten inode reads back as corrupt). An inode that can
    /// be fsync'ed by descriptor (`NewInode::Fd`: regular files, directories) joins the
    /// set; one that cannot (symlinks, FIFOs, sockets, device nodes, and a new link,
    /// whose count lives in its inode) asks for a syncfs, which covers the directory too.
    pub(crate) fn entry_durable(
        &self,
        set: &mut SyncSet,
        dir: &dyn AsFd,
        new: NewInode<'_>,
    ) -> Result<()> {
        match new {
            NewInode::Fd(fd) => self.meta_durable(set, &[fd, dir]),
            NewInode::NoFd => self.meta_durable_fs(set, dir),
        }
    }

    /// Like `meta_durable`, but synced before it returns: for a change that must be durable
    /// before the next step of the same request (set-id bits before data, an undo).
    pub(crate) fn meta_durable_now(&self, fds: &[&dyn AsFd]) -> Result<()> {
        let mut set = SyncSet::default();
        self.meta_durable(&mut set, fds)?;
        if !set.is_empty() {
            set.sync_now()?;
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sends a reply once `set` is durable: `reply` gets `r`, or the sync's failure. The
    /// worker that calls this is free at once (commit.rs).
    pub(crate) fn reply_when_durable<T: Send + 'static>(
        self: &Arc<Self>,
        set: SyncSet,
        r: Result<T>,
        reply: impl FnOnce(&Shared, Result<T>) + Send + 'static,
    ) {
        self.reply_when_durable_or(set, r, |_, _| {}, reply)
    }

    /// `reply_when_durable` for a request that gives the kernel a new entry (mknod, mkdir,
    /// symlink, link): its lookup was counted when the entry was looked up; if the sync
    /// fails the kernel never gets the entry, so the lookup is taken back.
    pub(crate) fn reply_entry_when_durable(
        self: &Arc<Self>,
        set: SyncSet,
        r: Result<Attr>,
        reply: impl FnOnce(&Shared, Result<Attr>) + Send + 'static,
    ) {
        self.reply_when_durable_or(set, r, |sh, attr| sh.entry_not_sent(&attr), reply)
    }

    /// The generation to send with entry `attr` (`NodeTable::generation`).
    pub(crate) fn generation(&self, attr: &Attr) -> u64 {
        self.nodes.lock().generation(Ino(attr.ino))
    }

    /// The kernel will never get entry `attr` that was counted as looked up: the count goes.
    pub(crate) fn entry_not_sent(&self, attr: &Attr) {
        self.nodes.lock().forget(Ino(attr.ino), 1);
    }

    /// Like `reply_when_durable`; when the sync fails, `undo` gets what the request made
    /// (an open's handle, which the kernel will then never release) before the error is
    /// sent.
    pub(crate) fn reply_when_durable_or<T: Send + 'static>(
        self: &Arc<Self>,
        set: SyncSet,
        r: Result<T>,
        undo: impl FnOnce(&Shared, T) + Send + 'static,
        reply: impl FnOnce(&Shared, Result<T>) + Send + 'static,
    ) {
        match r {
            Err(e) => reply(self, Err(e)),
            Ok(v) if set.is_empty() => reply(self, Ok(v)),
            Ok(v) => {
                let sh = self.clone();
                self.committer.submit(set, move |sr| {
                    sh.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
                    match sr {
                        Ok(()) => reply(&sh, Ok(v)),
                        Err(e) => {
                            // A failed sync of metadata: the change may not survive a
                            // crash, and the caller is told so.
                            undo(&sh, v);
                            reply(&sh, Err(e))
                        }
                    }
                });
            }
        }
    }

    /// Remembers the first unmount-time failure (reported by the daemon's exit status).
    pub fn record_final_error(&self, msg: String) {
        eprintln!("dhrd: {msg}");
        let mut g = self.final_error.lock();
        if g.is_none() {
            *g = Some(msg);
        }
    }

    pub fn final_error(&self) -> Option<String> {
        self.final_error.lock().clone()
    }

    /// syncfs of the backing file system if metadata changed (non-sync modes).
    pub fn sync_metadata(&self) -> Result<()> {
        // A syncfs that failed once is never reported as covering anything again (C4):
        // its error was reported to one descriptor only (failures.rs).
        let failures = &self.committer.failures;
        if failures.fs_has_failed(self.dir.dev()) {
            return Err(FsError::io(
                "syncfs of the backing file system failed before",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        if self.meta_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = sys::syncfs(self.dir.root_fd()) {
                self.meta_dirty.store(true, Ordering::Release);
                failures.fs_failed(self.dir.dev(), format!("syncfs: {e}"));
                return Err(FsError::io("syncfs of the backing file system", e));
            }
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub(crate) fn new_fh(&self) -> Fh {
        Fh(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    /// Opens node `ino` confined and checks it is still the same backing inode. The path
    /// is resolved from the nearest kept directory on it (nodes.rs), else from the root.
    /// Always a descriptor of its own: an open directory's read position is its own.
    pub(crate) fn node_fd(&self, ino: Ino, flags: OFlags) -> Result<(OwnedFd, libc::stat)> {
        let a = self.nodes.lock().anchor(ino)?;
        let base = match &a.dir {
            Some(d) => d.as_fd(),
            None => self.dir.root_fd(),
        };
        let fd = sys::open_confined(base, a.rel.as_os_str(), flags, Mode::empty()).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ENOENT) => FsError::Stale,
                _ => FsError::io("open below the backing directory", e),
            },
        )?;
        let st = sys::fstat(fd.as_fd())?;
        self.check_same_node(ino, &st)?;
        Ok((fd, st))
    }

    /// ESTALE unless `st` is node `ino`'s backing inode.
    fn check_same_node(&self, ino: Ino, st: &libc::stat) -> Result<()> {
        if self.dir.fuse_ino(st.st_ino) != ino.0 || st.st_dev != self.dir.dev() {
            return Err(FsError::Stale);
        }
        Ok(())
    }

    /// The descriptor of directory `ino` (readable, so it can be fsync'ed), kept from its
    /// first use while the node lives (nodes.rs): a lookup, create or unlink in it is then
    /// one system call on the backing.
    pub(crate) fn dir_fd(&self, ino: Ino) -> Result<Arc<OwnedFd>> {
        if let Some(fd) = self.nodes.lock().kept_dir(ino) {
            return Ok(fd);
        }
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(FsError::Errno(libc::ENOTDIR));
        }
        let fd = Arc::new(fd);
        self.nodes.lock().keep_dir(ino, fd.clone());
        Ok(fd)
    }

    pub(crate) fn attr(&self, st: &libc::stat) -> Attr {
        let ino = self.dir.fuse_ino(st.st_ino);
        let kind = FileKind::of_mode(st.st_mode);
        let mut size = st.st_size as u64;
        if kind == FileKind::RegularFile {
            // The engine's RAM copy is authoritative for the size (ahead of the backing in
            // the non-sync modes); the page cache path's is the backing file's own.
            if let Some(len) = self.data_size(st.st_ino) {
                size = len;
            }
        }
        Attr {
            ino,
            size,
            blocks: st.st_blocks as u64,
            atime: systime(st.st_atime, st.st_atime_nsec),
            mtime: systime(st.st_mtime, st.st_mtime_nsec),
            ctime: systime(st.st_ctime, st.st_ctime_nsec),
            kind,
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: sys::encode_fuse_rdev(st.st_rdev),
            blksize: STAT_BLKSIZE,
        }
    }

    /// Attributes for an entry the kernel will not link: READDIRPLUS's ".", "..", an entry
    /// on another file system, and negative LOOKUP replies; node 0, nothing else is read.
    pub(crate) fn placeholder_attr(&self) -> Attr {
        Attr::placeholder(STAT_BLKSIZE)
    }

    /// Stats `parent/name`, records the node and returns its attributes.
    pub(crate) fn lookup_in(&self, parent: Ino, pfd: &OwnedFd, name: &OsStr) -> Result<Attr> {
        let st = sys::stat_at(pfd.as_fd(), name)?;
        if st.st_dev != self.dir.dev() {
            // Another file system mounted below the backing directory is not part of it.
            return Err(FsError::Errno(libc::EXDEV));
        }
        let attr = self.attr(&st);
        self.nodes.lock().remember(Ino(attr.ino), parent, name);
        Ok(attr)
    }

    /// Opens the backing file of regular-file node `ino` read-write (for either data path).
    pub(crate) fn open_backing_file(&self, ino: Ino) -> Result<File> {
        self.open_backing_file_stat(ino).map(|(f, _)| f)
    }

    /// `open_backing_file`, with the status the check took.
    pub(crate) fn open_backing_file_stat(&self, ino: Ino) -> Result<(File, libc::stat)> {
        let (fd, st) = self.node_fd(ino, OFlags::RDWR)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::Errno(libc::EINVAL));
        }
        Ok((File::from(fd), st))
    }

    pub(crate) fn display_name(&self, ino: Ino) -> String {
        match self.nodes.lock().path(ino) {
            Ok(p) => p.display().to_string(),
            Err(_) => format!("inode {}", ino.0),
        }
    }

    /// The backing inode's status of node `ino`, or of its open file when its name is
    /// gone (an unlinked file that is still open). A kept directory is one `fstat`, a node
    /// one name below a kept directory one `fstatat`; deeper ones are opened by path.
    pub(crate) fn stat_node(&self, ino: Ino) -> Result<libc::stat> {
        let r = (|| {
            let a = self.nodes.lock().anchor(ino)?;
            let base = match &a.dir {
                Some(d) => d.as_fd(),
                None => self.dir.root_fd(),
            };
            let mut parts = a.rel.components();
            match (parts.next(), parts.next()) {
                (None, _) => Ok(sys::fstat(base)?),
                (Some(one), None) => {
                    let st = sys::stat_at(base, one.as_os_str()).map_err(|e| {
                        match e.raw_os_error() {
                            Some(libc::ENOENT) => FsError::Stale,
                            _ => FsError::from(e),
                        }
                    })?;
                    self.check_same_node(ino, &st)?;
                    Ok(st)
                }
                _ => self.node_fd(ino, OFlags::PATH).map(|(_, st)| st),
            }
        })();
        match r {
            Err(FsError::Stale) => {
                let key = self.dir.backing_ino(ino.0);
                self.data_stat(key).ok_or(FsError::Stale)
            }
            r => r,
        }
    }

    /// Gives a newly created inode to the caller (the daemon runs as root), inheriting the
    /// group of a set-group-id parent directory as the kernel would. `made`: the new
    /// inode's status, if the caller has it; then nothing is changed (and the parent not
    /// even looked at) where the backing file system already gave the inode the right
    /// owner: a root caller in an ordinary directory, most of all. Returns whether the
    /// owner changed (the inode's ctime then changed too).
    pub(crate) fn chown_new(
        &self,
        caller: &Caller,
        pfd: &OwnedFd,
        fd: Option<&OwnedFd>,
        name: &OsStr,
        made: Option<&libc::stat>,
    ) -> Result<bool> {
        if !self.daemon_is_root {
            return Ok(false);
        }
        // The group the inode got equals the caller's: right whether or not the parent
        // is set-group-id (it would have given its own group, which is then the same).
        let gid = match made {
            Some(st) if st.st_gid == caller.gid => st.st_gid,
            _ => {
                let pst = sys::fstat(pfd.as_fd())?;
                if pst.st_mode & libc::S_ISGID != 0 {
                    pst.st_gid
                } else {
                    caller.gid
                }
            }
        };
        if made.is_some_and(|st| st.st_uid == caller.uid && st.st_gid == gid) {
            return Ok(false);
        }
        let uid = Some(rustix::fs::Uid::from_raw(caller.uid));
        let gid = Some(rustix::fs::Gid::from_raw(gid));
        match fd {
            Some(fd) => rustix::fs::fchown(fd, uid, gid)?,
            None => rustix::fs::chownat(pfd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?,
        }
        Ok(true)
    }

    /// `chown` clears S_ISUID and S_ISGID of a non-directory even when root makes it, so a
    /// node created with set-id bits on the caller's behalf gets them back after
    /// `chown_new`. What the caller may not set the kernel has stripped already
    /// (`vfs_prepare_mode`) before the request reached the daemon.
    pub(crate) fn restore_setid_bits(&self, pfd: &OwnedFd, name: &OsStr, perm: Mode) -> Result<()> {
        if perm.bits() & (libc::S_ISUID | libc::S_ISGID) == 0 || !self.daemon_is_root {
            return Ok(());
        }
        let st = sys::stat_at(pfd.as_fd(), name)?;
        sys::chmod_node(pfd.as_fd(), name, perm, st.st_ino)
    }

    /// Counts a failed request and gives its errno.
    pub(crate) fn count_err(&self, e: &FsError) -> i32 {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        e.errno()
    }

    /// Clears the set-id bits `caller` must drop (killpriv.rs) from the file behind `fd`,
    /// described by `f`, durably per the durability mode. Called before the change
    /// itself, like the VFS does, so that a crash never leaves changed content with the
    /// bits still set. Concurrent callers compute the same mode; a chmod cannot interleave
    /// because the kernel holds the inode lock across both setattr and write.
    pub(crate) fn drop_setid_bits(
        &self,
        fd: BorrowedFd<'_>,
        f: sys::ModeOwner,
        caller: &Caller,
        fsetid: Fsetid,
    ) -> Result<()> {
        let kill = killpriv::bits_to_drop(f.mode, f.gid, caller, fsetid);
        if kill == 0 {
            return Ok(());
        }
        rustix::fs::fchmod(fd, Mode::from_raw_mode(f.mode & 0o7777 & !kill))?;
        self.meta_durable_now(&[&fd])?;
        // A write or fallocate does not make the kernel forget the cached mode (it
        // invalidates only size and times), so statx(STATX_MODE) would show the bits for
        // up to ATTR_TTL. Attributes only (no page cache, no inode lock), so this is safe
        // while the kernel waits for this request. A failure leaves stale attributes, not
        // a wrong file, and is not worth failing the request.
        if let Some(n) = self.notifier.get() {
            n.inode_attrs(self.dir.fuse_ino(f.ino));
        }
        Ok(())
    }

    // ----- operations, each returning a Result so the handlers stay one-liners -----

    pub(crate) fn do_setattr(
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
            self.data_set_len(set, caller, ino, &st, size, fh, mode.is_none())?;
        }
        let changes_inode =
            mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some();
        if changes_inode {
            match kind {
                FileKind::RegularFile | FileKind::Directory => {
                    let (fd, _) = self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?;
                    if let Some(m) = mode {
                        if kind == FileKind::RegularFile {
                            self.chmod_file(fd.as_fd(), st.st_ino, st.st_gid, m)?;
                        } else {
                            rustix::fs::fchmod(&fd, Mode::from_raw_mode(m & 0o7777))?;
                        }
                    }
                    if uid.is_some() || gid.is_some() {
                        // The backing fchown (by root) drops S_ISUID and S_ISGID with
                        // S_IXGRP itself; what depends on the caller is dropped here.
                        if mode.is_none() {
                            let f = sys::mode_owner(fd.as_fd())?;
                            self.drop_setid_bits(fd.as_fd(), f, caller, Fsetid::LookUp)?;
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
                    self.meta_durable(set, &[&fd])?;
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
                    self.meta_durable_fs(set, &pfd)?;
                }
            }
        }
        let st = self.stat_node(ino)?;
        Ok(self.attr(&st))
    }
}
