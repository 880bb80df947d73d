//! An attached directory: what dhrd changed to keep the durability mode, the watch, the
//! warm-up, and how all of it is undone at detach.
//!
//! Order at attach (`Attached::start`): undo what a crashed daemon left that this mode
//! does not want (its record says what), write the record of what this daemon is about to
//! change (durable), change it (the `sync` option, or the flags of every inode, each
//! directory flagged before its entries are read and marked for the watch), then start
//! the watch and the warm-up. Durability is in force when `start` returns; the warm-up
//! runs in the background (reads are served by the kernel all along, from the disk until
//! a file is warm).
//!
//! Order at detach (`Attached::detach`): stop the watch and the warm-up (the pins go; the
//! pages stay cached), undo the changes, make everything durable (`syncfs`: what `fsync`
//! mode promised at detach, as at unmount), remove the record, release the lock.
//!
//! Invariants: only the holder of the directory's lock changes its flags, its file
//! system's options or its record; a change is recorded before it is made and the record
//! removed only after every change is undone. Crash semantics: a SIGKILL leaves the
//! changes (still durable: the `sync` option or the flags stay) and the record; the next
//! attach or `dhrd detach` finds and undoes them.

use crate::check::{self, Plan, SyncBy};
use crate::error::{AttachError, Context, Result};
use crate::flags::{self, FlagStats};
use crate::handle::Handle;
use crate::record::Record;
use crate::syncmount;
use crate::tree::{self, Kind};
use crate::watch::{self, Scope, Watch};
use dhrd_engine::Durability;
use dhrd_io::RamBudget;
use dhrd_pagecache::reaper::{Reaper, REAPER_THREADS};
use dhrd_pagecache::resident::{FileRef, Folios, Opener, Resident, ResidentConfig};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often, with `sync` kept by inode flags, every flag is checked again: clearing a
/// flag sends no event, so a flag someone cleared is found at the next audit.
pub const FLAG_AUDIT_INTERVAL: Duration = Duration::from_secs(60);
/// Test hook: the audit interval in milliseconds instead of `FLAG_AUDIT_INTERVAL`.
pub const AUDIT_INTERVAL_ENV: &str = "DHRD_FAULT_AUDIT_INTERVAL_MS";

/// The audit interval in force (the test hook, or `FLAG_AUDIT_INTERVAL`).
pub fn audit_interval() -> Duration {
    std::env::var(AUDIT_INTERVAL_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(FLAG_AUDIT_INTERVAL, Duration::from_millis)
}

/// What `dhrd attach` was asked for.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub dir: PathBuf,
    pub durability: Durability,
    /// RAM budget of the pinned pages.
    pub mem_bytes: u64,
    /// Warm-up threads.
    pub warm_threads: usize,
    /// Cap on the warm-up's read rate (bytes/s).
    pub load_rate: Option<u64>,
}

/// Opens walked files for the warm-up: beneath the attached directory, read-only, and
/// only if the path still names the file the walk found (same handle).
struct TreeOpener(Arc<OwnedFd>);

impl Opener for TreeOpener {
    fn open(&self, f: &FileRef) -> io::Result<File> {
        use rustix::fs::OFlags;
        let fd =
            tree::open_beneath_noatime(self.0.as_fd(), &f.path, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let st = rustix::fs::fstat(&fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || Handle::of(fd.as_fd(), None)?.key() != f.key
        {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(File::from(fd))
    }
}

/// The state of an attached directory, shared by the daemon's threads.
pub struct Attached {
    pub cfg: AttachConfig,
    pub dir: PathBuf,
    pub root: Arc<OwnedFd>,
    pub dev: u64,
    pub fstype: String,
    pub scope: Scope,
    pub sync_by: SyncBy,
    /// The record this daemon wrote (what it changed).
    pub record: Mutex<Record>,
    /// The `sync` option was set before dhrd came (then it is not dhrd's to clear).
    pub sync_option_before: bool,
    pub budget: Arc<RamBudget>,
    pub resident: Resident,
    pub watch: Watch,
    pub flags: FlagStats,
    pub shutdown: AtomicBool,
    pub walk_done: AtomicBool,
    pub walk_files: AtomicU64,
    pub walk_bytes: AtomicU64,
    pub periodic_syncs: AtomicU64,
    pub started: Instant,
    /// Seconds from the start of `start` until durability was in force.
    pub ready_after_s: Mutex<f64>,
    /// The first failure of the file system the daemon saw (sticky, for status).
    pub failure: Mutex<Option<String>>,
}

impl Attached {
    /// Checks, records, changes and starts; returns once the mode is in force.
    pub fn start(cfg: AttachConfig) -> Result<Arc<Self>> {
        let t0 = Instant::now();
        let plan = check::check(&cfg.dir, cfg.durability)?;
        let Plan {
            dir,
            root,
            dev,
            mount,
            scope,
            sync_by,
            previous,
            group,
        } = plan;
        let root = Arc::new(root);
        let flag_stats = FlagStats::default();
        let sync_option_before = mount.has_super_opt("sync");
        let previous = previous.unwrap_or_default();
        // What a crashed daemon changed and this mode does not want.
        if previous.remounted_sync && sync_by != SyncBy::MountOption && sync_option_before {
            syncmount::set_sync(&dir, false).during(|| {
                format!(
                    "restoring async on {} (left by a previous daemon)",
                    dir.display()
                )
            })?;
        }
        if previous.inode_flags && sync_by != SyncBy::InodeFlags {
            flags::clear_tree(root.as_fd(), &flag_stats);
        }
        let ours_sync =
            sync_by == SyncBy::MountOption && (!sync_option_before || previous.remounted_sync);
        let record = Record {
            remounted_sync: ours_sync,
            inode_flags: sync_by == SyncBy::InodeFlags,
            durability: cfg.durability.to_string(),
            pid: std::process::id(),
        };
        record
            .write(root.as_fd())
            .during(|| format!("writing dhrd's record on {}", dir.display()))?;
        if sync_by == SyncBy::MountOption && !sync_option_before {
            if let Err(e) = syncmount::set_sync(&dir, true) {
                let _ = Record::remove(root.as_fd());
                return Err(AttachError::io(
                    format!("remounting the file system of {} sync", dir.display()),
                    e,
                ));
            }
        }
        let watch = Watch::new(group, scope, sync_by == SyncBy::InodeFlags);
        watch
            .start(root.as_fd())
            .during(|| format!("watching {}", dir.display()))?;
        prepare_tree(&root, sync_by, scope, &watch, &flag_stats);
        if sync_by != SyncBy::Nothing {
            // What was written before the mode was in force is made durable now too.
            rustix::fs::syncfs(root.as_fd())
                .map_err(io::Error::from)
                .during(|| format!("syncfs of {}", dir.display()))?;
        }
        let budget = RamBudget::new(cfg.mem_bytes);
        let resident = start_warm_up(&cfg, &budget, &root)?;
        let a = Arc::new(Self {
            fstype: mount.fstype.clone(),
            cfg,
            dir,
            root,
            dev,
            scope,
            sync_by,
            record: Mutex::new(record),
            sync_option_before,
            budget,
            resident,
            watch,
            flags: flag_stats,
            shutdown: AtomicBool::new(false),
            walk_done: AtomicBool::new(false),
            walk_files: AtomicU64::new(0),
            walk_bytes: AtomicU64::new(0),
            periodic_syncs: AtomicU64::new(0),
            started: t0,
            ready_after_s: Mutex::new(t0.elapsed().as_secs_f64()),
            failure: Mutex::new(None),
        });
        Ok(a)
    }

    pub fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// The warm-up's walk: every regular file to the warm-up, by its handle's key; then
    /// waits for the warm-up to complete and stops the open events.
    pub fn warm_walk(&self) {
        let stop = || self.stopping();
        tree::walk(
            self.root.as_fd(),
            Path::new(""),
            (),
            &stop,
            |_, _, _| {},
            |dir, _, e| match e.kind {
                Kind::Dir => Some(()),
                Kind::File => {
                    if let Ok(h) = Handle::of(dir, Some(e.name)) {
                        self.walk_files.fetch_add(1, Ordering::Relaxed);
                        self.walk_bytes.fetch_add(e.size, Ordering::Relaxed);
                        // Followed before it is read, so a close after writing that its
                        // warm-up's size could miss is heard (`watch.rs`).
                        if !self.watch.follow_at(dir, e.name) {
                            return None;
                        }
                        self.resident.submit_walked(
                            FileRef {
                                key: h.key(),
                                path: e.rel.clone(),
                            },
                            e.size,
                        );
                    }
                    None
                }
                Kind::Other => None,
            },
        );
        self.resident.walk_done();
        self.walk_done.store(true, Ordering::Release);
        while !self.stopping() {
            if self.resident.wait_complete(Duration::from_millis(200)) {
                self.watch.stop_open_events(self.root.as_fd());
                return;
            }
        }
    }

    /// Serves the watch's events until detach.
    pub fn watch_events(&self, wake: std::os::fd::BorrowedFd<'_>) {
        let ctx = watch::Ctx {
            root: self.root.as_fd(),
            dir: &self.dir,
            resident: &self.resident,
            flags: (self.sync_by == SyncBy::InodeFlags).then_some(&self.flags),
        };
        self.watch.run(&ctx, wake, &self.shutdown);
    }

    /// `sync` by inode flags: sets every flag again (a flag someone cleared sends no
    /// event); returns how many were missing.
    pub fn audit_flags(&self) -> u64 {
        let before = FlagStats::get(&self.flags.set);
        let stop = || self.stopping();
        flags::set_tree(
            self.root.as_fd(),
            Path::new(""),
            &self.flags,
            &stop,
            |_, _| {},
        );
        let n = FlagStats::get(&self.flags.set) - before;
        self.flags.repaired.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// `periodic:N`: one `syncfs` of the file system.
    pub fn periodic_sync(&self) {
        match rustix::fs::syncfs(self.root.as_fd()) {
            Ok(()) => {
                self.periodic_syncs.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.record_failure(format!("periodic syncfs: {}", io::Error::from(e))),
        }
    }

    pub fn record_failure(&self, what: String) {
        self.failure.lock().get_or_insert(what);
    }

    /// Why the file system takes no writes, if it does not: a failure seen, or a probe
    /// now (read-only, or fsync of the directory failing as on a shut down or dead disk).
    /// A failure found is kept.
    pub fn health(&self) -> Option<String> {
        if let Some(f) = self.failure.lock().clone() {
            return Some(f);
        }
        let verdict = match rustix::fs::fstatvfs(self.root.as_fd()) {
            Ok(s) if s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) => {
                Some("the file system is mounted read-only".to_string())
            }
            _ => rustix::fs::fsync(self.root.as_fd())
                .err()
                .map(|e| format!("the file system fails: {}", io::Error::from(e))),
        };
        if let Some(v) = &verdict {
            self.record_failure(v.clone());
        }
        verdict
    }

    /// Undoes what this daemon changed and makes everything durable; the caller has
    /// stopped the threads. The record goes only if every change was undone.
    pub fn detach(&self) -> Result<()> {
        self.shutdown.store(true, Ordering::Release);
        let record = self.record.lock().clone();
        let mut first_err: Option<AttachError> = None;
        if record.remounted_sync {
            if let Err(e) = syncmount::set_sync(&self.dir, false) {
                first_err.get_or_insert(AttachError::io("remounting async", e));
            }
        }
        if record.inode_flags {
            flags::clear_tree(self.root.as_fd(), &self.flags);
        }
        if let Err(e) = rustix::fs::syncfs(self.root.as_fd()) {
            first_err.get_or_insert(AttachError::io("syncfs at detach", e.into()));
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Record::remove(self.root.as_fd()).during(|| "removing dhrd's record".into())?;
        let _ = rustix::fs::flock(self.root.as_fd(), rustix::fs::FlockOperation::Unlock);
        Ok(())
    }
}

/// The warm-up, its pins and their reaper, charging `budget`.
fn start_warm_up(
    cfg: &AttachConfig,
    budget: &Arc<RamBudget>,
    root: &Arc<OwnedFd>,
) -> Result<Resident> {
    // A deleted file whose last reference is the daemon's (its pin, the watch's
    // descriptor) is freed when that goes, and with the sync flag or the `sync` option
    // ext4 commits that synchronously: off the watch thread, which must stay free to
    // repair flags (reaper.rs).
    let reaper =
        Reaper::new(REAPER_THREADS, "dhrd-reap").during(|| "starting the reaper threads".into())?;
    Resident::new(
        ResidentConfig {
            threads: cfg.warm_threads,
            rate_bytes_per_s: cfg.load_rate,
            folios: warm_up_folios(cfg.durability),
            reaper: Some(reaper),
            ..ResidentConfig::default()
        },
        budget.clone(),
        Arc::new(TreeOpener(root.clone())),
    )
    .during(|| "starting the warm-up threads".into())
}

/// The folios the warm-up leaves for a durability mode: in `sync` mode every small write is
/// synchronous and costs far more in a large folio (see `Folios`, docs/attach.md); in the
/// other modes writes reach the disk in bulk and reads win.
fn warm_up_folios(durability: Durability) -> Folios {
    if durability == Durability::Sync {
        Folios::Order0
    } else {
        Folios::Large
    }
}

/// Before durability is declared in force: the tree's flags and marks. With `sync` by
/// flags, each directory is flagged, then marked, then read (`tree.rs`); in a subdirectory
/// in other modes, each directory is marked.
fn prepare_tree(root: &OwnedFd, sync_by: SyncBy, scope: Scope, watch: &Watch, stats: &FlagStats) {
    match (sync_by, scope) {
        (SyncBy::InodeFlags, _) => {
            flags::set_tree(root.as_fd(), Path::new(""), stats, &|| false, |d, _| {
                watch.add_dir(d)
            });
        }
        (_, Scope::Tree) => {
            tree::walk(
                root.as_fd(),
                Path::new(""),
                (),
                &|| false,
                |d, _, _| watch.add_dir(d),
                |_, _, e| (e.kind == Kind::Dir).then_some(()),
            );
        }
        (_, Scope::Filesystem) => {}
    }
}

/// `dhrd detach DIR` with no daemon: undoes what a daemon that died left, by its record.
pub fn undo_orphaned(dir: &Path) -> Result<String> {
    let canon = dir
        .canonicalize()
        .map_err(|e| AttachError::Refused(format!("{}: {e}", dir.display())))?;
    let root: OwnedFd = File::open(&canon)
        .during(|| canon.display().to_string())?
        .into();
    if rustix::fs::flock(&root, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(AttachError::Refused(format!(
            "{} is held by a daemon that does not answer on its control socket",
            canon.display()
        )));
    }
    let Some(rec) = Record::read(root.as_fd()).during(|| "reading dhrd's record".into())? else {
        return Err(AttachError::Refused(format!(
            "{} is not attached (no daemon, no record of changes)",
            canon.display()
        )));
    };
    let mut done = Vec::new();
    if rec.remounted_sync {
        let d = File::open(&canon).during(|| canon.display().to_string())?;
        let sync_now = crate::mountinfo::mount_of(d.as_fd()).is_ok_and(|m| m.has_super_opt("sync"));
        if sync_now {
            syncmount::set_sync(&canon, false).during(|| "remounting async".into())?;
            done.push("remounted async");
        }
    }
    if rec.inode_flags {
        let stats = FlagStats::default();
        flags::clear_tree(root.as_fd(), &stats);
        done.push("cleared sync flags");
    }
    rustix::fs::syncfs(&root).map_err(|e| AttachError::io("syncfs", e.into()))?;
    Record::remove(root.as_fd()).during(|| "removing dhrd's record".into())?;
    Ok(format!(
        "{}: no daemon; undid what a daemon left ({})",
        canon.display(),
        if done.is_empty() {
            "nothing left to undo".to_string()
        } else {
            done.join(", ")
        }
    ))
}
