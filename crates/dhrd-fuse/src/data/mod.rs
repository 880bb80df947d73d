//! File data ([`Files`]): which data path (`Tier`) serves the mount, the table of open
//! files, and the data requests (open, read, write, fsync, lseek, fallocate,
//! copy_file_range, truncate, release), each dispatched to the page cache path (`page`)
//! or the engine path (`engine`). Files are known here by their backing inode number
//! (`key`); names are the namespace's business (`meta`), which hands in what an open of a
//! node needs.
//!
//! Why two paths: the page cache path is the default and serves reads and writes in the
//! kernel; it needs FUSE passthrough (kernel >= 6.9) and, in `sync` mode, a backing file
//! system that keeps the sync flag. Where either is missing the mount runs on the engine
//! (a RAM copy per file in a memfd, every write through the daemon), and says so. The
//! engine paths also stay selectable (`--read-path engine-*`) for the paper's comparison.
//!
//! Invariants:
//! - The tier is chosen once at INIT and never changes while mounted.
//! - Every handle belongs to the tier of the mount (handles.rs).
//! - Set-id bits a data change must drop are dropped before the change (killpriv.rs).
//!
//! Crash semantics: those of the tier (see `page`, `engine` and docs/crash-model.md);
//! this module adds none.

mod handles;
mod io;
pub mod open;
mod sync;

use crate::config::{FsConfig, ReadPath};
use crate::durable::failures::SyncOf;
use crate::durable::SyncPolicy;
use crate::engine::objects::Obj;
use crate::engine::EngineTier;
use crate::error::{FsError, Result};
use crate::kernel::{Invalidate, WriteSync};
use crate::killpriv::{self, Caller, Fsetid};
use crate::page::{Backing, BackingOpener, PageOpen, PageTier, Service};
use crate::stats::FsStats;
use crate::sys::{self, BackingDir};
use dhrd_engine::RamBudget;
use dhrd_pagecache::reaper::{Reaper, REAPER_THREADS};
use dhrd_pagecache::resident::{Resident, ResidentConfig};
use handles::Handles;
use parking_lot::{Condvar, Mutex};
use rustix::fs::Mode;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The data path of the mount.
pub enum Tier {
    Page(PageTier),
    Engine(EngineTier),
}

/// How long `wait_tier` sleeps between looks at its give-up flag.
const TIER_WAIT_POLL: Duration = Duration::from_millis(100);

/// The mount's open files and the data path that serves them.
pub struct Files {
    dir: Arc<BackingDir>,
    cfg: FsConfig,
    /// RAM budget of whichever data path runs: pinned page cache, or engine chunks.
    budget: Arc<RamBudget>,
    sync: Arc<SyncPolicy>,
    stats: Arc<FsStats>,
    /// The data path, chosen at INIT (`choose_tier`); `tier_ready` wakes threads waiting
    /// for it.
    tier: OnceLock<Tier>,
    tier_ready: (Mutex<bool>, Condvar),
    handles: Handles,
    /// Tells the kernel of attribute changes it does not expect (set-id bits dropped);
    /// set once the transport's session exists.
    notices: OnceLock<Box<dyn Invalidate>>,
}

/// A descriptor of a backing inode that the data path holds (`Files::held_file`).
pub enum HeldFile {
    Page(Arc<File>),
    Engine(Obj),
}

impl AsFd for HeldFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            HeldFile::Page(f) => f.as_fd(),
            HeldFile::Engine(o) => o.backing().file().as_fd(),
        }
    }
}

impl Files {
    pub fn new(
        dir: Arc<BackingDir>,
        cfg: FsConfig,
        budget: Arc<RamBudget>,
        sync: Arc<SyncPolicy>,
        stats: Arc<FsStats>,
    ) -> Self {
        Self {
            dir,
            cfg,
            budget,
            sync,
            stats,
            tier: OnceLock::new(),
            tier_ready: (Mutex::new(false), Condvar::new()),
            handles: Handles::default(),
            notices: OnceLock::new(),
        }
    }

    /// Chooses the data path once the kernel's INIT said what it offers (`passthrough`).
    /// Ok(Some(why)): the engine serves the mount because the page cache, the default,
    /// cannot (`sync_flag_probe`: whether the backing keeps the sync flag, in `sync`
    /// mode). Err: the mount asked for the page cache (`--read-path pagecache`) and
    /// cannot have it, or a data path failed to start.
    pub fn choose_tier(
        &self,
        passthrough: bool,
        sync_flag_probe: &std::result::Result<(), String>,
    ) -> std::result::Result<Option<String>, String> {
        assert!(self.tier.get().is_none(), "the data path is chosen once");
        let wanted = self.cfg.read_path;
        let mut fallback = None;
        let engine_path = match wanted {
            ReadPath::Auto | ReadPath::PageCache => {
                let why = if !passthrough {
                    Some("this kernel offers no FUSE passthrough (needs Linux >= 6.9)".to_string())
                } else {
                    sync_flag_probe.clone().err()
                };
                match why {
                    None => {
                        self.set_tier(Tier::Page(self.start_page_tier()?));
                        return Ok(None);
                    }
                    Some(why) if wanted == ReadPath::PageCache => {
                        return Err(format!("--read-path pagecache: {why}"));
                    }
                    Some(why) => {
                        fallback = Some(why);
                        ReadPath::EngineAuto
                    }
                }
            }
            p => p,
        };
        let t = EngineTier::new(&self.cfg, engine_path, self.budget.clone(), passthrough)
            .map_err(|e| format!("starting the engine: {e}"))?;
        self.set_tier(Tier::Engine(t));
        Ok(fallback)
    }

    fn start_page_tier(&self) -> std::result::Result<PageTier, String> {
        // Deleted files are let go off the request threads (reaper.rs): with the sync
        // flag, freeing one is a journal commit.
        self.sync.failures().set_kept_max(self.cfg.kept_fds_max);
        let reaper = Reaper::new(REAPER_THREADS, "dhrd-reap")
            .map_err(|e| format!("starting the reaper threads: {e}"))?;
        let resident = Resident::new(
            ResidentConfig {
                threads: self.cfg.loader_threads,
                pin: self.cfg.pin,
                rate_bytes_per_s: self.cfg.load_rate,
                reaper: Some(reaper.clone()),
                ..ResidentConfig::default()
            },
            self.budget.clone(),
            Arc::new(BackingOpener::new(self.dir.clone())),
        )
        .map_err(|e| format!("starting the warm-up threads: {e}"))?;
        Ok(PageTier::new(
            self.sync.sync_mode(),
            resident,
            self.cfg.linger_max,
            reaper,
            Backing {
                failures: self.sync.failures_shared(),
                dev: self.dir.dev(),
            },
        ))
    }

    /// Sets the data path (once, at INIT) and wakes `wait_tier`.
    fn set_tier(&self, t: Tier) {
        let first = self.tier.set(t).is_ok();
        assert!(first, "the data path is chosen once");
        let (m, cv) = &self.tier_ready;
        *m.lock() = true;
        cv.notify_all();
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

    /// Waits until INIT has chosen the data path, or `give_up` is set (None).
    pub fn wait_tier(&self, give_up: &AtomicBool) -> Option<&Tier> {
        let (m, cv) = &self.tier_ready;
        let mut ready = m.lock();
        while !*ready && !give_up.load(Ordering::Acquire) {
            cv.wait_for(&mut ready, TIER_WAIT_POLL);
        }
        self.tier.get()
    }

    /// Where the core's notices to the kernel go (once the session exists).
    pub fn set_notices(&self, n: Box<dyn Invalidate>) {
        let _ = self.notices.set(n);
    }

    fn page(&self) -> Result<&PageTier> {
        match self.tier() {
            Tier::Page(t) => Ok(t),
            Tier::Engine(_) => Err(FsError::Errno(libc::EBADF)),
        }
    }

    /// The size the mount shows for backing inode `key` where the backing file's own is
    /// not it (an engine object ahead of its backing).
    pub fn size_of(&self, key: u64) -> Option<u64> {
        match self.tier_if_set()? {
            Tier::Engine(t) => t.objects().get(key).map(|o| o.len()),
            Tier::Page(_) => None,
        }
    }

    /// Status of an open file whose name is gone (unlinked while open).
    pub fn stat_open(&self, key: u64) -> Option<libc::stat> {
        match self.tier_if_set()? {
            Tier::Engine(t) => t
                .objects()
                .get(key)
                .and_then(|o| sys::fstat(o.backing().file().as_fd()).ok()),
            Tier::Page(t) => t.open_file(key).and_then(|f| sys::fstat(f.as_fd()).ok()),
        }
    }

    /// A descriptor of backing inode `key` the data path holds open anyway (an open, a
    /// registration kept after the last close, a cached object), for requests that only
    /// need one of the inode (xattrs, chmod, chown, utimens): no open by name, and it
    /// reaches a file that is open but has no name any more, as on a local file system.
    pub fn held_file(&self, key: u64) -> Option<HeldFile> {
        match self.tier_if_set()? {
            Tier::Page(t) => t.held_file(key).map(HeldFile::Page),
            Tier::Engine(t) => t.objects().get(key).map(HeldFile::Engine),
        }
    }

    /// The last link of regular file `key` went (unlink, rename over, a failed create).
    pub fn unlinked(&self, key: u64) {
        match self.tier_if_set() {
            Some(Tier::Engine(t)) => t.objects().forget_if_closed(key),
            Some(Tier::Page(t)) => t.unlinked(key),
            None => {}
        }
    }

    /// chmod of regular file `fd` (backing inode `key`, group `file_gid`) to `mode`. A
    /// set-id bit is refused (ETXTBSY) while a writer holds a passed-through open that
    /// would drop it at its next write: the daemon never sees those writes, so nothing
    /// would (killpriv.rs). Checked and made under the registration table's lock, so no
    /// such open can start in between.
    pub fn chmod_file(&self, fd: BorrowedFd<'_>, key: u64, file_gid: u32, mode: u32) -> Result<()> {
        let chmod = || -> Result<()> {
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777))?;
            Ok(())
        };
        match self.tier_if_set() {
            Some(Tier::Page(t)) if mode & (libc::S_ISUID | libc::S_ISGID) != 0 => t
                .with_passthrough_writers(key, |writers| {
                    if killpriv::unsafe_with_unseen_writers(mode, file_gid, writers) {
                        return Err(FsError::Errno(libc::ETXTBSY));
                    }
                    chmod()
                }),
            _ => chmod(),
        }
    }

    /// Clears the set-id bits `caller` must drop (killpriv.rs) from the file behind `fd`,
    /// described by `f`, durably per the durability mode. Called before the change
    /// itself, like the VFS does, so that a crash never leaves changed content with the
    /// bits still set. Concurrent callers compute the same mode; a chmod cannot interleave
    /// because the kernel holds the inode lock across both setattr and write.
    pub fn drop_setid_bits(
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
        self.sync.meta_durable_now(&[&fd])?;
        // A write or fallocate does not make the kernel forget the cached mode (it
        // invalidates only size and times), so statx(STATX_MODE) would show the bits for
        // up to ATTR_TTL. Attributes only (no page cache, no inode lock), so this is safe
        // while the kernel waits for this request.
        if let Some(n) = self.notices.get() {
            n.inode_attrs(self.dir.fuse_ino(f.ino));
        }
        Ok(())
    }

    fn count_page_open(&self, open: &PageOpen) {
        match open.service {
            Service::Passthrough => self.stats.opens_passthrough.fetch_add(1, Ordering::Relaxed),
            Service::Daemon => self.stats.opens_direct.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// EIO if backing inode `key` failed a sync before (page cache path): it takes no
    /// more changes through the daemon and no sync of it reports success (C4).
    /// Passthrough writes never reach the daemon; their fsyncs do, and fail here.
    fn refuse_if_failed(&self, key: u64) -> Result<()> {
        if self.sync.failures().failed((self.dir.dev(), key)) {
            return Err(FsError::Errno(libc::EIO));
        }
        Ok(())
    }

    /// Runs `sync` of backing inode `key` as one step with its check and its failure
    /// record (C4, failures.rs): EIO if the inode failed a sync before, one still being
    /// recorded included; otherwise its outcome, a failure recorded before this returns.
    /// `shared`: the descriptor serves every open of the mount (an engine object's backing
    /// file), whose errors only its first sync sees, so a failure fails the whole backing.
    fn sync_inode(
        &self,
        key: u64,
        shared: bool,
        what: &'static str,
        sync: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<()> {
        let of = SyncOf::Inode {
            id: (self.dir.dev(), key),
            fails_fs: shared,
        };
        self.sync
            .failures()
            .sync(of, what, sync)
            .map_err(|e| FsError::io(what, e))
            .inspect_err(|e| {
                if let Tier::Page(t) = self.tier() {
                    t.record_failure(what, e);
                }
            })
    }

    /// Runs `change` (a write or copy of backing inode `key`, page cache path) with its
    /// check and its record (C4, failures.rs): EIO if the inode failed a sync before;
    /// a failure is recorded for status, and, unless it is ENOSPC, EDQUOT or EINTR,
    /// which changed nothing (C5), as a sticky failure of the inode. `syncs_itself`: the
    /// change syncs what it wrote (`PageTier::syncs_itself`).
    fn page_change<T>(
        &self,
        key: u64,
        syncs_itself: bool,
        what: &'static str,
        change: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let id = (self.dir.dev(), key);
        self.sync.failures().change(id, syncs_itself, what, || {
            change().inspect_err(|e| {
                if let Tier::Page(t) = self.tier() {
                    t.record_failure(what, e);
                }
            })
        })
    }

    /// Makes a change of engine object `obj` durable as `ws` asks: in `sync` mode the
    /// object's writes are durable already; otherwise O_DSYNC flushes the object (its
    /// writes, and the size, fdatasync'ed) and O_SYNC also fsyncs the backing file.
    fn engine_durable(&self, obj: &Obj, ws: WriteSync) -> Result<()> {
        if ws >= WriteSync::Data && !self.sync.sync_mode() {
            obj.flush()?;
        }
        if ws == WriteSync::File {
            let file = obj.backing().file();
            let key = sys::fstat(file.as_fd())?.st_ino;
            self.sync_inode(key, true, "fsync of the backing file for O_SYNC", || {
                sys::fsync(file.as_fd())
            })?;
        }
        Ok(())
    }
}
