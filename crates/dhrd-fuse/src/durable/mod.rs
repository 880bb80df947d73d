//! When a change becomes durable ([`SyncPolicy`]), per the mount's durability mode: the
//! group commit of metadata (`commit`), the directory entries not yet durable
//! (`unsynced`), and the sticky record of failed syncs (`failures`).
//!
//! Invariants:
//! - `sync` mode: every change names what must be synced for it to survive a crash (the
//!   changed inode, the directories whose entries changed, or the whole file system where
//!   an inode cannot be synced by descriptor) in the request's `SyncSet`, which the
//!   committer syncs before the reply goes out.
//! - Other modes: a change of an inode's own attributes is durable at the inode's fsync;
//!   a change of a directory's entries is recorded (`unsynced`) and made durable by an
//!   fsync of a file it names, or of the directory (`sync_names`), with the directories
//!   above it that are new too; every period and the unmount `syncfs` the backing.
//! - A `syncfs`, or any sync of names, that failed once is never reported as covering
//!   anything again (C4; failures.rs): the whole backing file system counts as failed.
//!
//! Crash semantics: a change whose reply reported success in `sync` mode is on the
//! backing device; in the other modes it is once a later sync of it returned success
//! (docs/crash-model.md).

pub mod commit;
pub mod failures;
pub mod kept;
pub mod unsynced;

use crate::error::{FsError, Result};
use crate::stats::FsStats;
use crate::sys::{self, BackingDir, Journal};
use commit::{Committer, RoundSync, SyncSet};
use failures::{Failures, SyncOf};
use rustix::fs::{Mode, OFlags};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use unsynced::{Plan, Unsynced};

/// On a backing without a shared journal, a sync of names fsyncs each new inode its
/// directories name; past this many, one syncfs costs less (one device flush).
pub const NAMED_FSYNCS_MAX: usize = 64;

/// A directory of the backing: its backing inode number and an open descriptor.
#[derive(Clone, Copy)]
pub struct DirRef<'a> {
    pub ino: u64,
    pub fd: &'a Arc<OwnedFd>,
}

/// The inode behind a new directory entry, for `SyncPolicy::entry_durable`.
pub enum NewInode<'a> {
    /// Open: fsync'ed by descriptor.
    Fd(&'a dyn AsFd),
    /// Open, with the status the caller took of it after its last change (spares a stat
    /// per create).
    Stat(&'a dyn AsFd, &'a libc::stat),
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
    /// The directory entries not yet durable (non-sync modes).
    unsynced: Unsynced,
    /// What an fsync of a directory makes durable on the backing (see `unsynced`).
    journal: Journal,
    stats: Arc<FsStats>,
}

impl SyncPolicy {
    /// Starts the committer for the backing's file system (`RoundSync::for_fs`).
    /// `dirs_max`: directories with changes not yet durable recorded at most (each holds
    /// a descriptor).
    pub fn new(
        sync_mode: bool,
        dir: Arc<BackingDir>,
        stats: Arc<FsStats>,
        dirs_max: usize,
    ) -> Result<Self> {
        let committer = Committer::start(RoundSync::for_fs(dir.root_fd()))
            .map_err(|e| FsError::Setup(format!("starting the metadata committer: {e}")))?;
        let unsynced = Unsynced::new(dirs_max);
        // What a previous daemon changed (killed before its unmount's syncfs) is in no
        // record: the first sync of names after the mount is a syncfs, once.
        unsynced.lost();
        Ok(Self {
            sync_mode,
            journal: sys::journal(dir.root_fd()),
            dir,
            committer,
            meta_dirty: AtomicBool::new(false),
            unsynced,
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

    /// The same, shared (the page cache path keeps descriptors there, kept.rs).
    pub fn failures_shared(&self) -> Arc<Failures> {
        self.committer.failures_shared()
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

    /// Makes a new directory entry `name` of `dir` durable per the mode. `sync` mode:
    /// the entry's directory and the new inode itself (on a backing without a journal
    /// nothing else writes the inode, and an entry naming an unwritten inode reads back
    /// as corrupt). An inode that can be fsync'ed by descriptor (`NewInode::Fd`: regular
    /// files, directories) joins the set; one that cannot (symlinks, FIFOs, sockets,
    /// device nodes, and a new link, whose count lives in its inode) asks for a syncfs,
    /// which covers the directory too. Other modes: the entry is recorded (`unsynced`).
    pub fn entry_durable(
        &self,
        set: &mut SyncSet,
        dir: DirRef<'_>,
        name: &OsStr,
        new: NewInode<'_>,
    ) -> Result<()> {
        if self.sync_mode {
            return match new {
                NewInode::Fd(fd) | NewInode::Stat(fd, _) => set.fsync(&[fd, dir.fd]),
                NewInode::NoFd => set.syncfs(dir.fd),
            };
        }
        self.changed();
        let st = match new {
            NewInode::Fd(fd) => sys::fstat(fd.as_fd()),
            NewInode::Stat(_, st) => Ok(*st),
            NewInode::NoFd => sys::stat_at(dir.fd.as_fd(), name),
        };
        match st {
            Ok(st) => {
                let named = (name, st.st_ino, openable(&st));
                self.unsynced.changed(dir.ino, dir.fd, Some(named))
            }
            // Not known what the entry names: only a syncfs covers it.
            Err(_) => self.unsynced.lost(),
        }
        Ok(())
    }

    /// Before an unlink or rename changes entries of `dirs`: in `sync` mode the
    /// directories join `set` (before the change: nothing may fail between the change
    /// and the node table's update).
    pub fn before_entries_change(&self, set: &mut SyncSet, dirs: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode {
            set.fsync(dirs)?;
        }
        Ok(())
    }

    /// After an unlink from `dir` (other modes: recorded, `unsynced`).
    pub fn unlinked(&self, dir: DirRef<'_>) {
        if !self.sync_mode {
            self.changed();
            self.unsynced.changed(dir.ino, dir.fd, None);
        }
    }

    /// After a rename from `from` to `newname` in `to` of the inode `moved` describes;
    /// `exchanged`: for RENAME_EXCHANGE, the old name in `from` and the inode it names now
    /// (other modes: recorded, `unsynced`).
    pub fn renamed(
        &self,
        (from, to): (DirRef<'_>, DirRef<'_>),
        newname: &OsStr,
        moved: &libc::stat,
        exchanged: Option<(&OsStr, &libc::stat)>,
    ) {
        if self.sync_mode {
            return;
        }
        self.changed();
        // The directory the file left names it too, as far as its fsync goes: without a
        // journal, an old name not written away would survive a crash beside the new.
        let moved_ino = (newname, moved.st_ino, openable(moved));
        self.unsynced.changed(from.ino, from.fd, Some(moved_ino));
        if let Some((name, st)) = exchanged {
            let back = (name, st.st_ino, openable(st));
            self.unsynced.changed(from.ino, from.fd, Some(back));
        }
        self.unsynced.changed(to.ino, to.fd, Some(moved_ino));
    }

    /// A change of the attributes of entry `name` of `dir`, an inode that cannot be synced
    /// by descriptor (a symlink, FIFO, socket): in `sync` mode a syncfs; otherwise
    /// recorded with its directory, whose sync covers it.
    pub fn node_changed(
        &self,
        set: &mut SyncSet,
        dir: DirRef<'_>,
        name: &OsStr,
        ino: u64,
    ) -> Result<()> {
        if self.sync_mode {
            return set.syncfs(dir.fd);
        }
        self.changed();
        self.unsynced
            .changed(dir.ino, dir.fd, Some((name, ino, false)));
        Ok(())
    }

    /// Like `meta_durable`, but synced before it returns: for a change that must be durable
    /// before the next step of the same request (set-id bits before data, an undo).
    pub fn meta_durable_now(&self, fds: &[&dyn AsFd]) -> Result<()> {
        let mut set = SyncSet::default();
        self.meta_durable(&mut set, fds)?;
        if !set.is_empty() {
            set.sync_now(self.failures())?;
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

    /// Directories and entries whose changes are not durable yet (non-sync modes).
    pub fn unsynced(&self) -> (usize, usize) {
        self.unsynced.len()
    }

    /// Something changed that the next `sync_metadata` must cover (non-sync modes).
    pub fn changed(&self) {
        self.meta_dirty.store(true, Ordering::Release);
    }

    /// FSYNC of a file, or FSYNCDIR, in the non-sync modes, once the inodes `inos`
    /// themselves are synced: makes the recorded directory entries that name them durable,
    /// and those naming their directories, up to the root (`unsynced`); on a backing
    /// without a shared journal the new inodes those entries name too, and a syncfs where
    /// that takes an inode no descriptor can sync. Nothing in `sync` mode: every change is
    /// durable at its reply there.
    pub fn sync_names(&self, inos: &[u64]) -> Result<()> {
        if self.sync_mode {
            return Ok(());
        }
        self.refuse_if_failed()?;
        let plan = self.unsynced.plan(inos);
        if plan.dirs.is_empty() && !plan.syncfs {
            return Ok(());
        }
        let r = match self.named_inodes(&plan) {
            // A failure fails the whole file system: these syncs are one step against
            // every other sync of it (failures.rs).
            Some(named) if !plan.syncfs => self.failures().sync(
                SyncOf::Fs(self.dir.dev()),
                "sync of directory entries",
                || fsync_plan(&plan, &named),
            ),
            _ => {
                self.changed();
                return self.sync_metadata();
            }
        };
        if let Err(e) = r {
            return Err(FsError::io("fsync of a directory of the backing", e));
        }
        self.unsynced.done(&plan);
        self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The new inodes the plan's entries name that must be fsync'ed on their own (none on
    /// a backing with a shared journal, whose commit covers them); None where only a
    /// syncfs covers them: an inode no descriptor can sync, one that cannot be opened,
    /// or more than `NAMED_FSYNCS_MAX`.
    fn named_inodes(&self, plan: &Plan) -> Option<Vec<OwnedFd>> {
        if self.journal == Journal::Shared {
            return Some(Vec::new());
        }
        let mut fds = Vec::new();
        for (_, dir, named) in &plan.dirs {
            for n in named {
                if !n.openable || fds.len() >= NAMED_FSYNCS_MAX {
                    return None;
                }
                let flags = OFlags::RDONLY | OFlags::NONBLOCK;
                match sys::open_confined(dir.as_fd(), &n.name, flags, Mode::empty()) {
                    Ok(fd) => match sys::fstat(fd.as_fd()) {
                        // The same inode still has that name: it goes first.
                        Ok(st) if st.st_ino == n.ino => fds.push(fd),
                        // Another inode has the name now (its own entry is recorded):
                        // the directory's sync writes what changed.
                        Ok(_) => {}
                        Err(_) => return None,
                    },
                    // The name is gone: the directory's sync writes its removal.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(_) => return None,
                }
            }
        }
        Some(fds)
    }

    /// EIO once a sync of the whole backing failed (C4, failures.rs).
    fn refuse_if_failed(&self) -> Result<()> {
        if self.failures().fs_has_failed(self.dir.dev()) {
            return Err(FsError::io(
                "a sync of the backing file system failed before",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        Ok(())
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
            // Everything recorded before the syncfs starts is covered by it.
            let seq = self.unsynced.seq_now();
            let kept = failures.kept_now();
            let dev = self.dir.dev();
            let r = failures.sync(SyncOf::Fs(dev), "syncfs", || {
                sys::syncfs(self.dir.root_fd())
            });
            if let Err(e) = r {
                self.changed();
                return Err(FsError::io("syncfs of the backing file system", e));
            }
            self.unsynced.all_synced(seq);
            // Through the root descriptor, open since the start: it reported every
            // writeback error of the backing since (failures.rs, kept.rs).
            failures.release_kept(kept);
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Ends the committer once its queue is empty (unmount).
    pub fn shutdown(&self) {
        self.committer.shutdown();
    }
}

/// The new inodes, then each directory, nearest the synced inode first.
fn fsync_plan(plan: &Plan, named: &[OwnedFd]) -> std::io::Result<()> {
    for fd in named {
        sys::fsync(fd.as_fd())?;
    }
    for (_, dir, _) in &plan.dirs {
        sys::fsync(dir.as_fd())?;
    }
    Ok(())
}

/// Whether an inode of this status can be opened and fsync'ed (a regular file or a
/// directory); symlinks, FIFOs, sockets and device nodes cannot.
fn openable(st: &libc::stat) -> bool {
    matches!(st.st_mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFDIR)
}
