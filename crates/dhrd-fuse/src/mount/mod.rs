//! One mounted backing directory ([`Mount`]): the owner of the mount's state, and the
//! request API a transport calls: requests in (`names`, `files`), replies out. Below it
//! the namespace (`meta::Namespace`: nodes, names, attributes, listings, xattrs) and the
//! file data (`data::Files`: open files on the page cache path or the engine), both on
//! the durability policy (`durable::SyncPolicy`).
//!
//! A request that changes something makes its change, then hands its reply to
//! `Durable::reply`, which sends it once the change is durable per the mode (in `sync` mode
//! after the committer's round, off the transport's worker threads). A request that only
//! reads replies by returning.
//!
//! Invariants:
//! - The data path is chosen once, at `init` (the kernel's INIT), before any other
//!   request; nothing else changes what the mount negotiated.
//! - A request that fails after giving the kernel something (a lookup counted, a handle
//!   opened) takes it back before its error is sent: the kernel never learns of it.
//! - Shutdown order: flush every file and sync the backing, unmount, then (`destroy`)
//!   close every object; the first failure is kept (`final_error`). The order is the
//!   daemon's (`daemon/threads.rs`), which alone calls these in turn; nothing here can
//!   tell whether the kernel has unmounted.
//!
//! Crash semantics: a reply that reported success in `sync` mode is on the backing
//! device; in the other modes per docs/crash-model.md. A crash between the backing
//! operation and its sync leaves whatever the backing file system recovers, which is
//! either the old or the new state of that one operation.

mod files;
mod names;
#[cfg(test)]
mod tests;
pub mod walk;

use crate::config::{FsConfig, ReadPath};
use crate::data::{Files, Tier};
use crate::durable::commit::{Committer, SyncSet};
use crate::durable::SyncPolicy;
use crate::error::Result;
use crate::kernel::{Invalidate, Negotiated};
use crate::meta::Namespace;
use crate::stats::FsStats;
use crate::sys::BackingDir;
use dhrd_engine::{Durability, RamBudget};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Directories with changes not yet durable recorded at least, however low the
/// descriptor limit (`SyncPolicy::new`); past the bound an fsync is a syncfs.
pub const UNSYNCED_DIRS_MIN: usize = 16;

/// Progress of the background walk that finds and preloads files.
#[derive(Default)]
pub struct PreloadState {
    pub files_seen: AtomicU64,
    pub bytes_seen: AtomicU64,
    pub files_preloaded: AtomicU64,
    pub done: AtomicBool,
}

/// One mounted backing directory: the state shared by the transport's workers, the
/// control socket and the background threads.
pub struct Mount {
    cfg: FsConfig,
    dir: Arc<BackingDir>,
    /// RAM budget of whichever data path runs: pinned page cache, or engine chunks.
    budget: Arc<RamBudget>,
    stats: Arc<FsStats>,
    sync: Arc<SyncPolicy>,
    files: Arc<Files>,
    ns: Namespace,
    preload: PreloadState,
    /// What INIT agreed on; set once, by `init`.
    negotiated: OnceLock<Negotiated>,
    /// Why the mount does not run on the page cache though it was the default, if so.
    fallback: Mutex<Option<String>>,
    /// `sync` mode: whether the backing file system keeps FS_SYNC_FL (probed at start).
    sync_flag_probe: std::result::Result<(), String>,
    shutdown: AtomicBool,
    /// First failure of the flush at unmount; makes the daemon exit non-zero.
    final_error: Mutex<Option<String>>,
}

impl Mount {
    pub fn new(dir: BackingDir, cfg: FsConfig) -> Result<Arc<Self>> {
        let dir = Arc::new(dir);
        let budget = RamBudget::new(cfg.mem_bytes);
        let stats = Arc::new(FsStats::default());
        let sync_mode = cfg.durability == Durability::Sync;
        // Directories with changes not yet durable hold a descriptor each, shared with the
        // node table's while it keeps the directory: a quarter of its bound besides.
        let unsynced_dirs_max = (cfg.dir_fds_max / 4).max(UNSYNCED_DIRS_MIN);
        let sync = Arc::new(SyncPolicy::new(
            sync_mode,
            dir.clone(),
            stats.clone(),
            unsynced_dirs_max,
        )?);
        // The page cache path needs the flag only to make writes durable (`sync` mode).
        let sync_flag_probe = if sync_mode {
            dhrd_pagecache::probe_sync_flag(dir.root_fd()).map_err(|e| {
                format!("the backing file system does not keep the sync flag (FS_SYNC_FL): {e}")
            })
        } else {
            Ok(())
        };
        let files = Arc::new(Files::new(
            dir.clone(),
            cfg.clone(),
            budget.clone(),
            sync.clone(),
            stats.clone(),
        ));
        let ns = Namespace::new(
            dir.clone(),
            cfg.dir_fds_max,
            sync.clone(),
            files.clone(),
            stats.clone(),
        )?;
        Ok(Arc::new(Self {
            cfg,
            dir,
            budget,
            stats,
            sync,
            files,
            ns,
            preload: PreloadState::default(),
            negotiated: OnceLock::new(),
            fallback: Mutex::new(None),
            sync_flag_probe,
            shutdown: AtomicBool::new(false),
            final_error: Mutex::new(None),
        }))
    }

    /// Whether the transport should ask the kernel for passthrough: every path but
    /// engine-direct and engine-cached can use it (the page cache path needs it;
    /// engine-auto and engine-passthrough hand the kernel memfds).
    pub fn wants_passthrough(&self) -> bool {
        !matches!(
            self.cfg.read_path,
            ReadPath::EngineDirect | ReadPath::EngineCached
        )
    }

    /// INIT: what the kernel and the transport agreed on; chooses the data path (the page
    /// cache where possible). Err: the mount cannot serve (the message says why).
    pub fn init(&self, negotiated: Negotiated) -> std::result::Result<(), String> {
        if self.negotiated.set(negotiated).is_err() {
            return Err("INIT came twice".to_string());
        }
        let fallback = self
            .files
            .choose_tier(negotiated.passthrough, &self.sync_flag_probe)?;
        if let Some(why) = fallback {
            eprintln!(
                "dhrd: {why}; file data is served by the engine (engine-auto) instead of the page cache"
            );
            *self.fallback.lock() = Some(why);
        }
        Ok(())
    }

    /// DESTROY (unmount): every request is answered by now. Closes every file, syncs the
    /// backing, and ends the committer once its queue is empty.
    pub fn destroy(&self) {
        self.shutdown.store(true, Ordering::Release);
        if let Err(e) = self.files.close_everything() {
            self.record_final_error(format!("flushing file data at unmount failed: {e}"));
        }
        self.sync.shutdown();
    }

    /// Where the core's notices to the kernel go, once the transport's session exists.
    pub fn set_notices(&self, n: Box<dyn Invalidate>) {
        self.files.set_notices(n);
    }

    /// Flushes every file's data and syncs the backing (a signal, `dhrd umount`, the
    /// periodic flusher). Returns the first error.
    pub fn flush_all(&self) -> Result<()> {
        self.files.flush_all()
    }

    /// The mount is going away: background threads stop.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
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

    pub fn cfg(&self) -> &FsConfig {
        &self.cfg
    }

    pub fn dir(&self) -> &BackingDir {
        &self.dir
    }

    pub fn budget(&self) -> &RamBudget {
        &self.budget
    }

    pub fn stats(&self) -> &FsStats {
        &self.stats
    }

    pub fn preload(&self) -> &PreloadState {
        &self.preload
    }

    pub fn committer(&self) -> &Committer {
        self.sync.committer()
    }

    /// Directories and entries whose changes are not durable yet (non-sync modes).
    pub fn unsynced(&self) -> (usize, usize) {
        self.sync.unsynced()
    }

    /// What INIT agreed on (all false before it).
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated.get().copied().unwrap_or_default()
    }

    /// Why the mount runs on the engine though the page cache was the default, if so.
    pub fn fallback(&self) -> Option<String> {
        self.fallback.lock().clone()
    }

    /// Whether the backing keeps the sync flag, in `sync` mode (Ok in other modes).
    pub fn sync_flag_probe(&self) -> &std::result::Result<(), String> {
        &self.sync_flag_probe
    }

    /// The data path, if INIT has chosen it.
    pub fn tier_if_set(&self) -> Option<&Tier> {
        self.files.tier_if_set()
    }

    /// Waits until INIT has chosen the data path, or the mount is shutting down (None).
    pub fn wait_tier(&self) -> Option<&Tier> {
        self.files.wait_tier(&self.shutdown)
    }

    /// Counts a failed request.
    fn counted<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// The outcome `r` of a request whose change `set` must make durable; `undo` takes
    /// back what the request made if the sync fails.
    fn durable<T>(
        self: &Arc<Self>,
        set: SyncSet,
        r: Result<T>,
        undo: impl FnOnce(&Mount, T) + Send + 'static,
    ) -> Durable<T> {
        Durable {
            m: self.clone(),
            set,
            r,
            undo: Box::new(undo),
        }
    }
}

/// The outcome of a request that changed something: its reply goes out once the change
/// is durable per the mode (`Durable::reply`).
#[must_use = "a request's outcome must be replied to"]
pub struct Durable<T> {
    m: Arc<Mount>,
    set: SyncSet,
    r: Result<T>,
    undo: Undo<T>,
}

/// Takes back what a request made when its sync failed.
type Undo<T> = Box<dyn FnOnce(&Mount, T) + Send>;

impl<T: Send + 'static> Durable<T> {
    /// Sends `r` to `reply` once the change is durable, or the sync's failure (then `undo`
    /// gets what the request made, which the kernel will never learn of). The calling
    /// worker is free at once (commit.rs). Failures are counted.
    pub fn reply(self, reply: impl FnOnce(Result<T>) + Send + 'static) {
        let Durable { m, set, r, undo } = self;
        let stats = m.stats.clone();
        let reply = move |r: Result<T>| {
            if r.is_err() {
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            reply(r)
        };
        match r {
            Err(e) => reply(Err(e)),
            Ok(v) if set.is_empty() => reply(Ok(v)),
            Ok(v) => {
                let sync = m.sync.clone();
                sync.submit(set, move |sr| match sr {
                    Ok(()) => reply(Ok(v)),
                    Err(e) => {
                        // A failed sync: the change may not survive a crash, and the
                        // caller is told so.
                        undo(&m, v);
                        reply(Err(e))
                    }
                });
            }
        }
    }
}
