//! When a change becomes durable ([`SyncPolicy`]), per the mount's durability mode: the
//! group commit of metadata (`commit`) and the sticky record of failed syncs
//! (`failures`).
//!
//! Invariants:
//! - `sync` mode: every change names what must be synced for it to survive a crash (the
//!   changed inode, the directories whose entries changed, or the whole file system where
//!   an inode cannot be synced by descriptor) in the request's `SyncSet`, which the
//!   committer syncs before the reply goes out.
//! - Other modes: a change only marks the backing dirty; the next fsync, fsyncdir, period
//!   or unmount covers it with a `syncfs` of the backing file system.
//! - A `syncfs` that failed once is never reported as covering anything again (C4;
//!   failures.rs).
//!
//! Crash semantics: a change whose reply reported success in `sync` mode is on the
//! backing device; in the other modes it is once a later sync of it returned success.

pub mod commit;
pub mod failures;

use crate::error::{FsError, Result};
use crate::stats::FsStats;
use crate::sys::{self, BackingDir};
use commit::{Committer, RoundSync, SyncSet};
use failures::Failures;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The inode behind a new directory entry, for `SyncPolicy::entry_durable`.
pub enum NewInode<'a> {
    /// Open: fsync'ed by descriptor.
    Fd(&'a dyn AsFd),
    /// No descriptor can sync it (symlink, FIFO, socket, device node, a link count).
    NoFd,
}

/// How the mount makes changes durable (see the module header).
pub struct SyncPolicy {
    sync_mode: bool,
    dir: Arc<BackingDir>,
    /// Syncs metadata changes in rounds, off the worker threads (`sync` mode).
    committer: Arc<Committer>,
    /// Metadata changed since the last syncfs (non-sync modes).
    meta_dirty: AtomicBool,
    stats: Arc<FsStats>,
}

impl SyncPolicy {
    /// Starts the committer for the backing's file system (`RoundSync::for_fs`).
    pub fn new(sync_mode: bool, dir: Arc<BackingDir>, stats: Arc<FsStats>) -> Result<Self> {
        let committer = Committer::start(RoundSync::for_fs(dir.root_fd()))
            .map_err(|e| FsError::Setup(format!("starting the metadata committer: {e}")))?;
        Ok(Self {
            sync_mode,
            dir,
            committer,
            meta_dirty: AtomicBool::new(false),
            stats,
        })
    }

    /// `sync` durability: every change is durable before its reply.
    pub fn sync_mode(&self) -> bool {
        self.sync_mode
    }

    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    /// Inodes and file systems that failed a sync (failures.rs).
    pub fn failures(&self) -> &Failures {
        self.committer.failures()
    }

    /// Makes a metadata change durable per the durability mode (see module header): in
    /// `sync` mode the inodes behind `fds` join the request's `set`, which the committer
    /// syncs before the reply (commit.rs); otherwise the next syncfs covers the change.
    pub fn meta_durable(&self, set: &mut SyncSet, fds: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode {
            set.fsync(fds)?;
        } else {
            self.changed();
        }
        Ok(())
    }

    /// Like `meta_durable` for a change that leaves data in the page cache too (a size
    /// inside a page zeroes the rest of that page): in `sync` mode the files are fsync'ed
    /// with their data, which a journal commit alone would not write (commit.rs).
    pub fn data_durable(&self, set: &mut SyncSet, fds: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode {
            set.fsync_data(fds)?;
        } else {
            self.changed();
        }
        Ok(())
    }

    /// Like `meta_durable` for a change whose inode cannot be synced by descriptor
    /// (symlinks, FIFOs, link counts): a syncfs of the file system `fd` is on.
    pub fn meta_durable_fs(&self, set: &mut SyncSet, fd: &dyn AsFd) -> Result<()> {
        if self.sync_mode {
            set.syncfs(fd)?;
        } else {
            self.changed();
        }
        Ok(())
    }

    /// Makes a new directory entry durable per the mode: the entry's directory and the
    /// new inode itself (on a backing without a journal nothing else writes the inode,
    /// and an entry naming an unwritten inode reads back as corrupt). An inode that can
    /// be fsync'ed by descriptor (`NewInode::Fd`: regular files, directories) joins the
    /// set; one that cannot (symlinks, FIFOs, sockets, device nodes, and a new link,
    /// whose count lives in its inode) asks for a syncfs, which covers the directory too.
    pub fn entry_durable(
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
    pub fn meta_durable_now(&self, fds: &[&dyn AsFd]) -> Result<()> {
        let mut set = SyncSet::default();
        self.meta_durable(&mut set, fds)?;
        if !set.is_empty() {
            set.sync_now()?;
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs `done` once `set` is durable (commit.rs), counting the sync.
    pub fn submit(&self, set: SyncSet, done: impl FnOnce(Result<()>) + Send + 'static) {
        let stats = self.stats.clone();
        self.committer.submit(set, move |r| {
            stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
            done(r)
        });
    }

    /// Something changed that the next `sync_metadata` must cover (non-sync modes).
    pub fn changed(&self) {
        self.meta_dirty.store(true, Ordering::Release);
    }

    /// syncfs of the backing file system if metadata changed (non-sync modes).
    pub fn sync_metadata(&self) -> Result<()> {
        // A syncfs that failed once is never reported as covering anything again (C4):
        // its error was reported to one descriptor only (failures.rs).
        let failures = self.failures();
        if failures.fs_has_failed(self.dir.dev()) {
            return Err(FsError::io(
                "syncfs of the backing file system failed before",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        if self.meta_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = sys::syncfs(self.dir.root_fd()) {
                self.changed();
                failures.fs_failed(self.dir.dev(), format!("syncfs: {e}"));
                return Err(FsError::io("syncfs of the backing file system", e));
            }
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Ends the committer once its queue is empty (unmount).
    pub fn shutdown(&self) {
        self.committer.shutdown();
    }
}
