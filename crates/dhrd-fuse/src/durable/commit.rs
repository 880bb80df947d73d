//! Group commit of metadata changes (`sync` mode), off the FUSE worker threads.
//!
//! A metadata request (create, mkdir, unlink, rename, setattr, ...) makes its change on the
//! backing directory in the worker that received it, collects what must be synced for the
//! change to be durable (the changed inode, its parent directory, or the whole file system
//! where an inode cannot be synced by descriptor) in a [`SyncSet`], and hands the set and
//! its reply to the committer. The worker is then free for the next request: a lookup or
//! getattr never waits behind another request's sync. The committer takes every set that
//! arrived while its previous round ran, makes them durable together, and only then sends
//! the replies.
//!
//! How a round syncs depends on the backing file system ([`RoundSync`], measured on
//! ext4 over the same disk, docs/fuse.md):
//! - A journal that one fsync commits for everyone (ext4's default, xfs): the committer
//!   changes a private unnamed file of its own (O_TMPFILE, never in the tree) and fsyncs
//!   it. That change joins the journal's running transaction, which is at least as new
//!   as every change of the round, so its commit covers them all: one commit and one
//!   device flush per round, however many inodes it names. An fsync per inode costs the
//!   same commit plus a flush for every further inode (an fsync whose change is committed
//!   already still flushes the cache); a `syncfs` also writes every dirty metadata block
//!   home (`sync_blockdev`), which made sync-mode creates 1.9x slower with one thread and
//!   3.6x with eight than fsyncs.
//!   A journal commit makes metadata durable, not the data of other inodes: an
//!   application's fsync (`SyncSet::fsync_data`) still fsyncs its file.
//! - A per-inode log (btrfs): each distinct inode is fsync'ed.
//! - No journal (an ext4 made without one, as on some cloud images): every fsync writes
//!   its inode and parent blocks in place and flushes the device cache, so a round of 8
//!   creates cost 16 flushes, while one `syncfs` flushes once for the whole round. But
//!   syncfs also writes back every other dirty page of that file system, which on a
//!   backing shared with other programs may be gigabytes: so a round with more than one
//!   inode uses syncfs only while the machine's dirty and under-writeback memory is small
//!   ([`SYNCFS_DIRTY_MAX_BYTES`]), and fsyncs each distinct inode otherwise. In `sync`
//!   mode dhrd's own files have no dirty pages (their writes are synchronous), so the
//!   bound is about other programs.
//!
//! Invariants:
//! - A reply is sent only after a sync that started after its change was made: sets are
//!   queued after their change, and a round takes its sets before it starts syncing.
//! - Every set of a round is covered by that round's syncs: a syncfs of a file system
//!   covers every inode on it; otherwise an inode is fsync'ed once per round however many
//!   sets name it.
//! - A failed sync fails the replies of the sets that needed it (EIO; the change may or
//!   may not survive a crash, as after any failed fsync); other sets of the round are
//!   answered normally. The failure is sticky (failures.rs): the inode, or for a failed
//!   syncfs or journal commit the whole file system, is never synced again, and every
//!   later set naming it fails.
//!
//! Crash semantics: a crash before a round's syncs return may lose any change of that
//! round, none of which was acknowledged; nothing acknowledged is lost.

use crate::durable::failures::{Failures, InodeId, SyncOf};
use crate::error::{FsError, Result};
use crate::sys;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What one change needs synced to be durable.
#[derive(Default)]
pub struct SyncSet {
    /// Inodes to fsync (changed inodes and the directories whose entries changed).
    fsync: Vec<OwnedFd>,
    /// A file system to syncfs (symlinks, FIFOs, link counts: inodes that cannot be
    /// fsync'ed by descriptor), given by any descriptor on it.
    syncfs: Option<OwnedFd>,
    /// The `fsync` inodes need their data written too (an application's fsync: stores
    /// into shared mappings are in the page cache only), which a journal commit does not
    /// do; without it the set is metadata only.
    data: bool,
}

impl SyncSet {
    /// Adds the inodes behind `fds` (duplicated: the caller keeps its descriptors).
    pub fn fsync(&mut self, fds: &[&dyn AsFd]) -> Result<()> {
        for fd in fds {
            let dup = dup_for_sync(fd.as_fd())?;
            self.fsync.push(dup);
        }
        Ok(())
    }

    /// Adds the inodes behind `fds` with their data (`data` above).
    pub fn fsync_data(&mut self, fds: &[&dyn AsFd]) -> Result<()> {
        self.data = true;
        self.fsync(fds)
    }

    /// Adds a syncfs of the file system `fd` lives on.
    pub fn syncfs(&mut self, fd: &dyn AsFd) -> Result<()> {
        if self.syncfs.is_none() {
            let dup = dup_for_sync(fd.as_fd())?;
            self.syncfs = Some(dup);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.fsync.is_empty() && self.syncfs.is_none()
    }

    /// Syncs the set now, on the calling thread (for steps whose durability must come
    /// before the next step of the same request, such as set-id bits before data).
    /// Each sync is checked and its failure recorded in `failures` (C4), like the
    /// committer's; one whose inode cannot be identified (fstat failed) is only run.
    pub fn sync_now(self, failures: &Failures) -> Result<()> {
        if let Some(fd) = &self.syncfs {
            let syncfs = || sys::syncfs(fd.as_fd());
            match identity(fd) {
                Some((dev, _)) => failures.sync(SyncOf::Fs(dev), "syncfs", syncfs),
                None => syncfs(),
            }
            .map_err(|e| FsError::io("syncfs", e))?;
            return Ok(());
        }
        for fd in &self.fsync {
            let fsync = || sys::fsync(fd.as_fd());
            match identity(fd) {
                Some(id) => failures.sync(SyncOf::inode(id), "fsync", fsync),
                None => fsync(),
            }
            .map_err(|e| FsError::io("fsync after metadata change", e))?;
        }
        Ok(())
    }
}

/// A descriptor of the set's own (the caller keeps its one). Fails like `dup` does when the
/// process is out of descriptors (EMFILE), which tests make happen on their own thread
/// (`FAIL_DUPS`).
fn dup_for_sync(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd> {
    #[cfg(test)]
    if FAIL_DUPS.with(|f| f.get()) {
        return Err(FsError::io(
            "dup for the metadata sync",
            std::io::Error::from_raw_os_error(libc::EMFILE),
        ));
    }
    fd.try_clone_to_owned()
        .map_err(|e| FsError::io("dup for the metadata sync", e))
}

#[cfg(test)]
thread_local! {
    /// Tests: every `dup_for_sync` on this thread fails with EMFILE while set.
    pub(crate) static FAIL_DUPS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

type Done = Box<dyn FnOnce(Result<()>) + Send>;
/// One sync's outcome: Ok, or its errno.
type Errno = std::result::Result<(), i32>;

/// What a round names: the identity (device, inode) of every set's descriptors (None
/// where fstat failed: that one is fsync'ed on its own), and the device of every set's
/// syncfs request (None where there is none or fstat failed).
struct Plan {
    ids: Vec<Vec<Option<(u64, u64)>>>,
    fs_devs: Vec<Option<u64>>,
}

impl Plan {
    fn of(round: &[(SyncSet, Done)]) -> Self {
        Plan {
            ids: round
                .iter()
                .map(|(set, _)| set.fsync.iter().map(identity).collect())
                .collect(),
            fs_devs: round
                .iter()
                .map(|(set, _)| set.syncfs.as_ref().and_then(identity).map(|(dev, _)| dev))
                .collect(),
        }
    }

    fn distinct_inodes(&self) -> usize {
        let all: std::collections::HashSet<(u64, u64)> =
            self.ids.iter().flatten().flatten().copied().collect();
        all.len()
    }

    /// Whether the round has a metadata change on the journal's file system `jdev` (data
    /// sets fsync their inodes instead: a commit does not write other inodes' data).
    fn touches_journal(&self, round: &[(SyncSet, Done)], jdev: u64) -> bool {
        round
            .iter()
            .zip(self.ids.iter().zip(&self.fs_devs))
            .any(|((set, _), (set_ids, fs_dev))| {
                (!set.data && set_ids.iter().flatten().any(|(dev, _)| *dev == jdev))
                    || *fs_dev == Some(jdev)
            })
    }
}

/// What the committer does to make an inode or a file system durable: `fsync` and
/// `syncfs` of the descriptor (tests put a stalled or failing one in its place).
pub trait Syncer: Send + Sync + 'static {
    fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()>;
    fn syncfs(&self, fd: &OwnedFd) -> std::io::Result<()>;
    /// Dirty and under-writeback memory of the machine now, if known.
    fn dirty_bytes(&self) -> Option<u64>;
}

/// How the committer makes a round of several inodes durable (see the module header).
pub enum RoundSync {
    /// fsync each distinct inode: right everywhere.
    FsyncEach,
    /// One syncfs per file system when the round names several inodes and little is dirty:
    /// for file systems without a journal.
    SyncfsWhenMany,
    /// Change this unnamed file on the backing and fsync it: one journal commit covering
    /// every change of the round on that file system (a journal shared by all inodes).
    JournalCommit(OwnedFd),
}

impl RoundSync {
    /// The policy for the file system of directory `dir` (`sys::journal`).
    pub fn for_fs(dir: std::os::fd::BorrowedFd<'_>) -> Self {
        match sys::journal(dir) {
            sys::Journal::Shared => match rustix::fs::openat(
                dir,
                ".",
                rustix::fs::OFlags::TMPFILE
                    | rustix::fs::OFlags::RDWR
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            ) {
                Ok(fd) => RoundSync::JournalCommit(fd),
                Err(_) => RoundSync::FsyncEach,
            },
            sys::Journal::Without => RoundSync::SyncfsWhenMany,
            sys::Journal::PerInode | sys::Journal::Unknown => RoundSync::FsyncEach,
        }
    }

    /// For status and logs.
    pub fn name(&self) -> &'static str {
        match self {
            RoundSync::FsyncEach => "fsync per inode",
            RoundSync::SyncfsWhenMany => "syncfs per round",
            RoundSync::JournalCommit(_) => "one journal commit per round",
        }
    }
}

/// A round with this many distinct inodes or more may be made durable with one syncfs per
/// file system instead of an fsync per inode (see the module header).
pub const SYNCFS_INODES_MIN: usize = 2;
/// ... but only while the machine has at most this much dirty or under-writeback memory,
/// which bounds what a syncfs may have to write for other programs.
pub const SYNCFS_DIRTY_MAX_BYTES: u64 = 16 << 20;

/// `Dirty` + `Writeback` of /proc/meminfo, in bytes.
fn meminfo_dirty_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut total = 0u64;
    let mut found = 0;
    for line in s.lines() {
        let (key, rest) = line.split_once(':')?;
        if key == "Dirty" || key == "Writeback" {
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            total = total.saturating_add(kib.saturating_mul(1024));
            found += 1;
            if found == 2 {
                return Some(total);
            }
        }
    }
    None
}

/// Fault injection for tests: while the file this variable names exists, every metadata
/// sync waits (polling), as on a stalled device. Read once, when the committer starts;
/// unset in normal use.
pub const SYNC_STALL_ENV: &str = "DHRD_FAULT_SYNC_STALL_FILE";
/// How often a stalled sync looks at the file again.
const SYNC_STALL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// The real one.
pub struct KernelSyncer {
    stall_while: Option<std::path::PathBuf>,
}

impl KernelSyncer {
    fn stall(&self) {
        if let Some(p) = &self.stall_while {
            while p.exists() {
                std::thread::sleep(SYNC_STALL_POLL);
            }
        }
    }
}

impl Syncer for KernelSyncer {
    fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()> {
        self.stall();
        sys::fsync(fd.as_fd())
    }
    fn syncfs(&self, fd: &OwnedFd) -> std::io::Result<()> {
        self.stall();
        sys::syncfs(fd.as_fd())
    }
    fn dirty_bytes(&self) -> Option<u64> {
        meminfo_dirty_bytes()
    }
}

struct Queue {
    sets: Vec<(SyncSet, Done)>,
    shutdown: bool,
}

/// The committer: one thread that syncs queued sets in rounds.
pub struct Committer {
    q: Mutex<Queue>,
    cv: Condvar,
    syncer: Box<dyn Syncer>,
    policy: RoundSync,
    /// JournalCommit: which mode the private file gets next (a change every round).
    toggle: std::sync::atomic::AtomicBool,
    /// Inodes and file systems that failed a sync: never synced again, their sets fail
    /// (failures.rs). Shared with the data requests, which record what they see too.
    failures: Arc<Failures>,
    /// Rounds run and sets they covered, for status.
    rounds: AtomicU64,
    sets: AtomicU64,
    syncs: AtomicU64,
}

/// What the committer did so far, for status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounts {
    /// Sets (changes) made durable.
    pub sets: u64,
    /// Rounds they were made durable in.
    pub rounds: u64,
    /// fsync and syncfs calls of those rounds.
    pub syncs: u64,
}

impl Committer {
    pub fn start(policy: RoundSync) -> std::io::Result<Arc<Self>> {
        Self::start_with(
            Box::new(KernelSyncer {
                stall_while: std::env::var_os(SYNC_STALL_ENV).map(Into::into),
            }),
            policy,
        )
    }

    pub fn start_with(syncer: Box<dyn Syncer>, policy: RoundSync) -> std::io::Result<Arc<Self>> {
        let c = Arc::new(Self {
            q: Mutex::new(Queue {
                sets: Vec::new(),
                shutdown: false,
            }),
            cv: Condvar::new(),
            syncer,
            policy,
            toggle: std::sync::atomic::AtomicBool::new(false),
            failures: Arc::default(),
            rounds: AtomicU64::new(0),
            sets: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        });
        let me = c.clone();
        std::thread::Builder::new()
            .name("dhrd-commit".into())
            .spawn(move || me.run())?;
        Ok(c)
    }

    /// Runs `done` once `set` is durable (or failed to be). An empty set runs it at once.
    pub fn submit(&self, set: SyncSet, done: impl FnOnce(Result<()>) + Send + 'static) {
        if set.is_empty() {
            done(Ok(()));
            return;
        }
        let mut q = self.q.lock();
        if q.shutdown {
            drop(q);
            // After shutdown (unmount) nobody waits for the thread: sync here.
            let r = self.commit_one(set);
            done(r);
            return;
        }
        q.sets.push((set, Box::new(done)));
        drop(q);
        self.cv.notify_one();
    }

    /// Inodes and file systems that failed a sync (failures.rs).
    pub fn failures(&self) -> &Failures {
        &self.failures
    }

    /// The same, shared (the page cache path keeps descriptors there, kept.rs).
    pub fn failures_shared(&self) -> Arc<Failures> {
        self.failures.clone()
    }

    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            sets: self.sets.load(Ordering::Relaxed),
            rounds: self.rounds.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }

    /// How rounds are made durable on this backing (`RoundSync::name`).
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Stops the thread once the queue is empty (every queued reply is sent first).
    pub fn shutdown(&self) {
        self.q.lock().shutdown = true;
        self.cv.notify_all();
    }

    fn run(&self) {
        loop {
            let round = {
                let mut q = self.q.lock();
                while q.sets.is_empty() && !q.shutdown {
                    self.cv.wait(&mut q);
                }
                if q.sets.is_empty() {
                    return;
                }
                std::mem::take(&mut q.sets)
            };
            self.commit(round);
        }
    }

    /// One round: makes every set durable (see the module header for how), then answers
    /// them.
    fn commit(&self, round: Vec<(SyncSet, Done)>) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.sets.fetch_add(round.len() as u64, Ordering::Relaxed);
        let plan = Plan::of(&round);
        // Every set of the round is covered: the loops below zip each set's descriptors
        // with their identities, so a short list would skip a sync silently.
        debug_assert!(
            plan.ids.len() == round.len()
                && plan.fs_devs.len() == round.len()
                && round
                    .iter()
                    .zip(&plan.ids)
                    .all(|((set, _), ids)| ids.len() == set.fsync.len()),
            "a round's plan does not match its sets"
        );
        // The file system whose journal one commit makes durable for everyone, if any:
        // syncfs requests there are covered by that commit.
        let journal = match &self.policy {
            RoundSync::JournalCommit(anchor) => identity(anchor).map(|(dev, _)| (dev, anchor)),
            _ => None,
        };
        let fs_done = self.sync_file_systems(&round, &plan, journal.map(|(dev, _)| dev));
        let journal_done = journal.and_then(|(jdev, anchor)| {
            plan.touches_journal(&round, jdev)
                .then(|| (jdev, self.journal_commit_dev(anchor, jdev)))
        });
        let covered = |dev: u64, data: bool| {
            fs_done.get(&dev).copied().or(match journal_done {
                Some((jdev, r)) if jdev == dev && !data => Some(r),
                _ => None,
            })
        };
        // Per inode: Ok, or the errno of its failed fsync.
        let mut synced: HashMap<(u64, u64), Errno> = HashMap::new();
        let mut results = Vec::with_capacity(round.len());
        for (i, (set, done)) in round.into_iter().enumerate() {
            let mut r = Ok(());
            if let Some(fd) = &set.syncfs {
                // A set that asked for a syncfs whose file system is unknown gets its own.
                let one = match plan.fs_devs[i].and_then(|d| covered(d, false)) {
                    Some(x) => x,
                    None => self.sync_fs_now(fd),
                };
                r = r.and(one);
            }
            for (fd, id) in set.fsync.iter().zip(&plan.ids[i]) {
                let one = match id {
                    // Failed before: never reported as synced again (C4). A failure
                    // still being recorded is waited for by `fsync_inode` below.
                    Some(id) if self.failures.failed(*id) => Err(libc::EIO),
                    Some((dev, ino)) => match covered(*dev, set.data) {
                        Some(x) => x,
                        None => *synced
                            .entry((*dev, *ino))
                            .or_insert_with(|| self.fsync_inode(fd, (*dev, *ino))),
                    },
                    None => self.fsync(fd),
                };
                r = r.and(one);
            }
            results.push((r, done));
        }
        // Replies only now, after every sync of the round returned.
        for (r, done) in results {
            done(r.map_err(|e| {
                FsError::io(
                    "sync after metadata change",
                    std::io::Error::from_raw_os_error(e),
                )
            }));
        }
    }

    /// The syncfs calls of a round: every file system a set asks for (but the journal's,
    /// `journal_dev`, which its commit covers), and, when the round is worth it and cheap
    /// enough, every file system the round touches. Their outcomes by device.
    fn sync_file_systems(
        &self,
        round: &[(SyncSet, Done)],
        plan: &Plan,
        journal_dev: Option<u64>,
    ) -> HashMap<u64, Errno> {
        let mut fs: HashMap<u64, &OwnedFd> = HashMap::new();
        for ((set, _), dev) in round.iter().zip(&plan.fs_devs) {
            if let (Some(fd), Some(dev)) = (&set.syncfs, *dev) {
                if journal_dev != Some(dev) {
                    fs.entry(dev).or_insert(fd);
                }
            }
        }
        let whole = matches!(self.policy, RoundSync::SyncfsWhenMany)
            && plan.distinct_inodes() >= SYNCFS_INODES_MIN
            && self
                .syncer
                .dirty_bytes()
                .is_some_and(|b| b <= SYNCFS_DIRTY_MAX_BYTES);
        if whole {
            for ((set, _), set_ids) in round.iter().zip(&plan.ids) {
                for (fd, id) in set.fsync.iter().zip(set_ids) {
                    if let Some((dev, _)) = id {
                        fs.entry(*dev).or_insert(fd);
                    }
                }
            }
        }
        fs.into_iter()
            .map(|(dev, fd)| (dev, self.syncfs_dev(fd, dev)))
            .collect()
    }

    /// syncfs of file system `dev` (through `fd`), unless it failed before; a failure is
    /// recorded (failures.rs).
    fn syncfs_dev(&self, fd: &OwnedFd, dev: u64) -> Errno {
        self.recorded(SyncOf::Fs(dev), "syncfs", || self.sync_fs_now(fd))
    }

    /// `sync` as one step with its check and its record (`Failures::sync`).
    fn recorded(&self, of: SyncOf, what: &str, sync: impl FnOnce() -> Errno) -> Errno {
        self.failures
            .sync(of, what, || {
                sync().map_err(std::io::Error::from_raw_os_error)
            })
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// `journal_commit` on file system `dev`, unless it failed before; a failed commit
    /// fails the file system.
    fn journal_commit_dev(&self, anchor: &OwnedFd, dev: u64) -> std::result::Result<(), i32> {
        self.recorded(SyncOf::Fs(dev), "journal commit", || {
            self.journal_commit(anchor)
        })
    }

    /// fsync of inode `id`; a failure is recorded (failures.rs).
    fn fsync_inode(&self, fd: &OwnedFd, id: InodeId) -> std::result::Result<(), i32> {
        self.recorded(SyncOf::inode(id), "fsync", || self.fsync(fd))
    }

    fn sync_fs_now(&self, fd: &OwnedFd) -> std::result::Result<(), i32> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.syncer
            .syncfs(fd)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Changes the private file (its mode, alternately 0600 and 0400: a change the file
    /// system must log) and fsyncs it, which commits the journal up to that change.
    fn journal_commit(&self, anchor: &OwnedFd) -> std::result::Result<(), i32> {
        let ro = self.toggle.fetch_xor(true, Ordering::Relaxed);
        let mode = if ro {
            rustix::fs::Mode::RUSR
        } else {
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR
        };
        rustix::fs::fchmod(anchor, mode).map_err(|e| e.raw_os_error())?;
        self.fsync(anchor)
    }

    fn fsync(&self, fd: &OwnedFd) -> std::result::Result<(), i32> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.syncer
            .fsync(fd)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// One set on the calling thread (after shutdown).
    fn commit_one(&self, set: SyncSet) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.commit(vec![(
            set,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )]);
        rx.recv().unwrap_or_else(|_| {
            Err(FsError::io(
                "sync after metadata change",
                std::io::Error::from_raw_os_error(libc::EIO),
            ))
        })
    }
}

/// (device, inode) of a descriptor.
fn identity(fd: &OwnedFd) -> Option<(u64, u64)> {
    sys::fstat(fd.as_fd()).ok().map(|st| (st.st_dev, st.st_ino))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Syncs that wait until the test lets them go, counting what they were asked.
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        fsyncs: Arc<AtomicU64>,
        syncfs_calls: Arc<AtomicU64>,
        /// Calls that reached the gate (counted before waiting at it).
        entered: Arc<AtomicU64>,
        fail_ino: Option<u64>,
        /// What `dirty_bytes` says: None keeps rounds on per-inode fsyncs.
        dirty: Option<u64>,
    }

    impl Syncer for Gate {
        fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()> {
            self.entered.fetch_add(1, Ordering::Relaxed);
            let (m, cv) = &*self.open;
            let mut g = m.lock();
            while !*g {
                cv.wait(&mut g);
            }
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
            let ino = sys::fstat(fd.as_fd())?.st_ino;
            if Some(ino) == self.fail_ino {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(())
        }
        fn syncfs(&self, fd: &OwnedFd) -> std::io::Result<()> {
            self.syncfs_calls.fetch_add(1, Ordering::Relaxed);
            self.fsync(fd)
        }
        fn dirty_bytes(&self) -> Option<u64> {
            self.dirty
        }
    }

    type Door = Arc<(Mutex<bool>, Condvar)>;

    struct Rig {
        c: Arc<Committer>,
        open: Door,
        fsyncs: Arc<AtomicU64>,
        syncfs_calls: Arc<AtomicU64>,
        entered: Arc<AtomicU64>,
    }

    fn gate(fail_ino: Option<u64>, dirty: Option<u64>, policy: RoundSync) -> Rig {
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let fsyncs = Arc::new(AtomicU64::new(0));
        let syncfs_calls = Arc::new(AtomicU64::new(0));
        let entered = Arc::new(AtomicU64::new(0));
        let c = Committer::start_with(
            Box::new(Gate {
                open: open.clone(),
                fsyncs: fsyncs.clone(),
                syncfs_calls: syncfs_calls.clone(),
                entered: entered.clone(),
                fail_ino,
                dirty,
            }),
            policy,
        )
        .unwrap();
        Rig {
            c,
            open,
            fsyncs,
            syncfs_calls,
            entered,
        }
    }

    fn release(open: &(Mutex<bool>, Condvar)) {
        *open.0.lock() = true;
        open.1.notify_all();
    }

    /// A stalled sync holds back only the replies that wait for it: submitting returns at
    /// once (the worker is free), and nothing is answered before the sync returned.
    #[test]
    fn submit_never_waits_for_a_stalled_sync_and_replies_follow_it() {
        let d = tempfile::tempdir().unwrap();
        let Rig {
            c, open, fsyncs, ..
        } = gate(None, None, RoundSync::SyncfsWhenMany);
        let (tx, rx) = mpsc::channel();
        let dir = std::fs::File::open(d.path()).unwrap();
        for i in 0..5 {
            let mut set = SyncSet::default();
            set.fsync(&[&dir]).unwrap();
            let tx = tx.clone();
            let t = std::time::Instant::now();
            c.submit(set, move |r| tx.send((i, r.is_ok())).unwrap());
            assert!(t.elapsed() < Duration::from_millis(100), "submit waited");
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "answered before the sync"
        );
        release(&open);
        let mut got: Vec<_> = (0..5)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, (0..5).map(|i| (i, true)).collect::<Vec<_>>());
        // The first round synced the directory once; the four queued meanwhile shared the
        // next round's single fsync of it.
        assert!(fsyncs.load(Ordering::Relaxed) <= 2, "{fsyncs:?}");
        c.shutdown();
    }

    /// A failed fsync fails exactly the sets that needed that inode.
    #[test]
    fn a_failed_fsync_fails_only_the_sets_that_needed_it() {
        let d = tempfile::tempdir().unwrap();
        let a = std::fs::File::create(d.path().join("a")).unwrap();
        let b = std::fs::File::create(d.path().join("b")).unwrap();
        let bad = a
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap();
        let Rig { c, open, .. } = gate(Some(bad), None, RoundSync::SyncfsWhenMany);
        let (tx, rx) = mpsc::channel();
        for (name, f) in [("a", &a), ("b", &b)] {
            let mut set = SyncSet::default();
            set.fsync(&[f]).unwrap();
            let tx = tx.clone();
            c.submit(set, move |r| tx.send((name, r.is_ok())).unwrap());
        }
        release(&open);
        let mut got: Vec<_> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, vec![("a", false), ("b", true)]);
        // An empty set is answered at once.
        let (tx2, rx2) = mpsc::channel();
        c.submit(SyncSet::default(), move |r| tx2.send(r.is_ok()).unwrap());
        assert!(rx2.try_recv().unwrap());
        c.shutdown();
    }

    /// Fails the first fsync and the first syncfs, as a writeback error is reported once
    /// per open file description, then succeeds.
    struct FailOnce {
        fsyncs: Arc<AtomicU64>,
        syncfs_calls: Arc<AtomicU64>,
    }

    impl Syncer for FailOnce {
        fn fsync(&self, _: &OwnedFd) -> std::io::Result<()> {
            match self.fsyncs.fetch_add(1, Ordering::Relaxed) {
                0 => Err(std::io::Error::from_raw_os_error(libc::EIO)),
                _ => Ok(()),
            }
        }
        fn syncfs(&self, _: &OwnedFd) -> std::io::Result<()> {
            match self.syncfs_calls.fetch_add(1, Ordering::Relaxed) {
                0 => Err(std::io::Error::from_raw_os_error(libc::EIO)),
                _ => Ok(()),
            }
        }
        fn dirty_bytes(&self) -> Option<u64> {
            None
        }
    }

    /// A sync that failed once fails every later set that names the same inode (or, for a
    /// syncfs, any inode of that file system), without syncing again: the backing would
    /// report success the second time for data it never got (C4).
    #[test]
    fn a_failed_sync_stays_failed_for_every_later_set() {
        let d = tempfile::tempdir().unwrap();
        let a = std::fs::File::create(d.path().join("a")).unwrap();
        let b = std::fs::File::create(d.path().join("b")).unwrap();
        let (fsyncs, syncfs_calls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let c = Committer::start_with(
            Box::new(FailOnce {
                fsyncs: fsyncs.clone(),
                syncfs_calls: syncfs_calls.clone(),
            }),
            RoundSync::FsyncEach,
        )
        .unwrap();
        let run = |set: SyncSet| {
            let (tx, rx) = mpsc::channel();
            c.submit(set, move |r| tx.send(r.is_ok()).unwrap());
            rx.recv_timeout(Duration::from_secs(10)).unwrap()
        };
        let one = |f: &std::fs::File| {
            let mut set = SyncSet::default();
            set.fsync(&[f]).unwrap();
            set
        };
        assert!(!run(one(&a)), "the failing fsync");
        assert!(!run(one(&a)), "a later set of the failed inode succeeded");
        assert_eq!(
            fsyncs.load(Ordering::Relaxed),
            1,
            "the failed inode was synced again"
        );
        assert!(run(one(&b)), "another inode is unaffected");
        let mut fs_set = SyncSet::default();
        fs_set.syncfs(&b).unwrap();
        assert!(!run(fs_set), "the failing syncfs");
        assert!(
            !run(one(&b)),
            "an inode of a file system whose syncfs failed"
        );
        assert!(c.failures().first_failure().is_some());
        c.shutdown();
    }

    /// Without a journal, a round of several inodes on one file system is one syncfs when
    /// little is dirty, and an fsync per distinct inode when the machine has much dirty
    /// memory; with a journal, always an fsync per distinct inode.
    #[test]
    fn a_round_of_many_inodes_is_one_syncfs_unless_much_is_dirty() {
        let d = tempfile::tempdir().unwrap();
        let files: Vec<_> = (0..4)
            .map(|i| std::fs::File::create(d.path().join(format!("f{i}"))).unwrap())
            .collect();
        use RoundSync::{FsyncEach, SyncfsWhenMany};
        for (policy, dirty, want_syncfs, want_calls) in [
            (SyncfsWhenMany, Some(0), 1, 1),
            (SyncfsWhenMany, Some(1 << 40), 0, 4),
            (SyncfsWhenMany, None, 0, 4),
            (FsyncEach, Some(0), 0, 4),
        ] {
            let rig = gate(None, dirty, policy);
            let (tx, rx) = mpsc::channel();
            // The first round takes one set and waits at the gate; the second round gets
            // the other three inodes plus a repeat of the first.
            for (i, f) in files.iter().chain(std::iter::once(&files[0])).enumerate() {
                let mut set = SyncSet::default();
                set.fsync(&[f]).unwrap();
                let tx = tx.clone();
                rig.c.submit(set, move |r| tx.send(r.is_ok()).unwrap());
                while i == 0 && rig.entered.load(Ordering::Relaxed) == 0 {
                    std::thread::yield_now();
                }
            }
            release(&rig.open);
            for _ in 0..5 {
                assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
            }
            let (fs, all) = (
                rig.syncfs_calls.load(Ordering::Relaxed),
                rig.fsyncs.load(Ordering::Relaxed),
            );
            // The first round (one inode) is one fsync either way.
            assert_eq!(fs, want_syncfs, "dirty {dirty:?}");
            assert_eq!(all, 1 + want_calls, "dirty {dirty:?}");
            rig.c.shutdown();
        }
    }

    /// With a journal shared by every inode, a round of several inodes is one change of
    /// the private file and one fsync of it, whatever the round names.
    #[test]
    fn a_round_on_a_shared_journal_is_one_commit() {
        let d = tempfile::tempdir().unwrap();
        let files: Vec<_> = (0..4)
            .map(|i| std::fs::File::create(d.path().join(format!("f{i}"))).unwrap())
            .collect();
        let anchor: OwnedFd = std::fs::File::create(d.path().join("anchor"))
            .unwrap()
            .into();
        let rig = gate(None, Some(0), RoundSync::JournalCommit(anchor));
        let (tx, rx) = mpsc::channel();
        for (i, f) in files.iter().enumerate() {
            let mut set = SyncSet::default();
            set.fsync(&[f]).unwrap();
            if i == 3 {
                set.syncfs(f).unwrap();
            }
            let tx = tx.clone();
            rig.c.submit(set, move |r| tx.send(r.is_ok()).unwrap());
            while i == 0 && rig.entered.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
        }
        release(&rig.open);
        for _ in 0..4 {
            assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        }
        // Two rounds (the first waited at the gate with one set), one fsync each; the
        // syncfs asked for by the last set is covered by the commit too.
        assert_eq!(rig.fsyncs.load(Ordering::Relaxed), 2);
        assert_eq!(rig.syncfs_calls.load(Ordering::Relaxed), 0);
        rig.c.shutdown();
    }

    /// A set with data (an application's fsync) is not covered by the journal commit:
    /// its file is fsync'ed, and a round of only such sets needs no commit of its own.
    #[test]
    fn data_sets_fsync_their_files_under_a_journal_commit() {
        let d = tempfile::tempdir().unwrap();
        let a = std::fs::File::create(d.path().join("a")).unwrap();
        let b = std::fs::File::create(d.path().join("b")).unwrap();
        let anchor: OwnedFd = std::fs::File::create(d.path().join("anchor"))
            .unwrap()
            .into();
        let rig = gate(None, Some(0), RoundSync::JournalCommit(anchor));
        release(&rig.open);
        let (tx, rx) = mpsc::channel();
        let mut set = SyncSet::default();
        set.fsync_data(&[&a]).unwrap();
        let t = tx.clone();
        rig.c.submit(set, move |r| t.send(r.is_ok()).unwrap());
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        assert_eq!(rig.fsyncs.load(Ordering::Relaxed), 1, "the file, no commit");
        let mut set = SyncSet::default();
        set.fsync(&[&b]).unwrap();
        set.fsync_data(&[&a]).unwrap();
        rig.c.submit(set, move |r| tx.send(r.is_ok()).unwrap());
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        // The data set's inodes (a and b: the set is one unit) each fsync'ed; no commit.
        assert_eq!(rig.fsyncs.load(Ordering::Relaxed), 3);
        rig.c.shutdown();
    }
}
