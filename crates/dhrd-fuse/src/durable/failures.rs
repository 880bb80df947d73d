//! Sticky sync failures of the backing (SPEC C4): which backing inodes, and which backing
//! file systems, have failed a sync, so that no later sync of them is reported as success.
//!
//! Why the daemon keeps this: a writeback error is reported once per open file
//! description of the backing (errseq), and the daemon syncs one shared descriptor per
//! inode (the page cache path's registration, duplicated into the committer's sets) for
//! every open of it through the mount, and one root descriptor for every syncfs. Whoever
//! syncs first takes the error; every other open, and every later sync, would then read
//! success for pages that never reached the disk (marked clean, still readable from the
//! cache). So every sync error is recorded here by whoever sees it, and every sync
//! through the mount looks here first.
//!
//! Invariants:
//! - An inode or file system recorded stays recorded until the daemon exits.
//! - A sync of a recorded inode, or of any inode of a recorded file system, fails with
//!   EIO without asking the backing (a failed fsync is never retried as if it had
//!   succeeded).
//! - Check, sync and record are one step (`Failures::sync`, through which the mount runs
//!   every sync of the backing but those under "Not covered"): a sync of an inode holds
//!   that inode's stripe lock (one of `SYNC_STRIPES`, by its id) exclusively and `whole`
//!   shared, a sync of a whole file system (syncfs, a journal commit, a batch of directory
//!   fsyncs) holds `whole` exclusively, each from its check until its failure, if any, is
//!   recorded. So a sync that overlaps a failing one of the same inode, or any sync that
//!   overlaps a failing syncfs, waits and then fails: none runs in the window after
//!   another took the error and before it was recorded, when it would have read success
//!   for pages that never reached the disk. Holding two of these (a sync inside a sync)
//!   would wait for itself; debug builds assert it never happens.
//! - A change the daemon serves that syncs itself (a write or copy with RWF_DSYNC or
//!   RWF_SYNC: O_DSYNC and O_SYNC opens and writes, `sync` mode) is one step with its
//!   check and record too (`Failures::change`): it holds its inode's stripe shared, so
//!   such changes of one file run side by side, and a sync of the inode waits for those
//!   in flight and then sees what they recorded. A change that does not sync cannot take
//!   a writeback error and takes no lock; its failure is recorded all the same. The
//!   page cache path writes through a description its syncs never use (page/mod.rs), so
//!   a writeback error a write's sync took is also reported to the next sync of the inode,
//!   which records it: also when the write returned ENOSPC or EDQUOT (not sticky as a
//!   change's error, C5), which a failed device write can report although pages were
//!   lost.
//! - A sync of an inode also asks, in the same step, the descriptors the page cache path
//!   kept of it after dropping their registrations (kept.rs), and records what they
//!   report: a writeback error unseen on a closed registration's descriptor is never
//!   lost to a later open's new one, which would not report it.
//! - The first failure's description is kept for status.
//!
//! Cost: a lock is held only while its sync (or self-syncing change) runs, by the sync
//! that would otherwise have raced. Syncs of different inodes share a stripe for about 1
//! pair in `SYNC_STRIPES`, and then one waits for at most the other's sync (or the
//! self-syncing changes in flight). Only whole-file-system syncs exclude all other syncs,
//! and they are the rare ones (a periodic or unmount flush, directory entries that
//! changed, a committer round that chose syncfs as cheaper than its fsyncs). The
//! uncontended path is two uncontended lock acquisitions, next to a sync's device flush.
//!
//! Not covered: a sync whose descriptor cannot be identified (fstat failed) has no inode
//! to lock or record and is only run (commit.rs), and the status probe's fsync of the
//! backing root (page/mod.rs) reports health, not a request's durability. A write the
//! kernel serves by passthrough never reaches the daemon; the kernel writes through a
//! description of its own per open, so its sync's error is still reported to the
//! daemon's next sync of the inode, which records it.
//!
//! Crash semantics: none of its own; after a restart the backing is read again as it is.

use super::kept::{Evicted, Kept, KEPT_FDS_MAX};
use crate::error::{FsError, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// (device, inode) of a backing inode.
pub type InodeId = (u64, u64);

/// How many locks the inode syncs are spread over: two syncs of different inodes wait for
/// each other only when their inodes share one (about 1 in this many pairs), and then
/// for no longer than one sync.
pub const SYNC_STRIPES: usize = 64;

/// See the module header.
pub struct Failures {
    /// Anything recorded at all: the lock-free answer for the (usual) healthy backing.
    any: AtomicBool,
    inodes: Mutex<HashSet<InodeId>>,
    devs: Mutex<HashSet<u64>>,
    first: Mutex<Option<FirstFailure>>,
    /// Exclusive for a sync of an inode, shared for a change that syncs itself, each from
    /// its check until its failure is recorded.
    stripes: Box<[RwLock<()>]>,
    /// Shared by every inode sync, exclusive for a sync of a whole file system, from its
    /// check until its failure is recorded. One for every file system of the backing.
    whole: RwLock<()>,
    /// Descriptors of dropped registrations not asked for their writeback error yet
    /// (kept.rs). Lock order: after the locks above, and after the page cache path's
    /// registration table; nothing is locked while it is held.
    kept: Mutex<Kept<Arc<File>>>,
}

/// The first failure recorded: which sync and its error, and the inode whose sync it was
/// (None: a sync of a whole file system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstFailure {
    pub what: String,
    pub inode: Option<InodeId>,
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            any: AtomicBool::new(false),
            inodes: Mutex::default(),
            devs: Mutex::default(),
            first: Mutex::default(),
            stripes: (0..SYNC_STRIPES).map(|_| RwLock::new(())).collect(),
            whole: RwLock::new(()),
            kept: Mutex::new(Kept::new(KEPT_FDS_MAX)),
        }
    }
}

impl Failures {
    /// A sync of inode `id` failed (`what`: which sync, and its error).
    pub fn inode_failed(&self, id: InodeId, what: String) {
        self.inodes.lock().insert(id);
        self.any.store(true, Ordering::Release);
        self.first.lock().get_or_insert(FirstFailure {
            what,
            inode: Some(id),
        });
    }

    /// A sync of the whole file system `dev` failed (syncfs, a journal commit): which
    /// inode lost data is unknown, so every inode on it counts as failed.
    pub fn fs_failed(&self, dev: u64, what: String) {
        self.devs.lock().insert(dev);
        self.any.store(true, Ordering::Release);
        self.first
            .lock()
            .get_or_insert(FirstFailure { what, inode: None });
    }

    /// Whether inode `id` (or its file system) has failed a sync.
    pub fn failed(&self, id: InodeId) -> bool {
        self.any.load(Ordering::Acquire)
            && (self.devs.lock().contains(&id.0) || self.inodes.lock().contains(&id))
    }

    /// Whether file system `dev` as a whole has failed a sync.
    pub fn fs_has_failed(&self, dev: u64) -> bool {
        self.any.load(Ordering::Acquire) && self.devs.lock().contains(&dev)
    }

    /// `failed` for the inode behind `fd`; false where it cannot be stat'ed.
    pub fn fd_failed(&self, fd: BorrowedFd<'_>) -> bool {
        id_of(fd).is_some_and(|id| self.failed(id))
    }

    /// The first failure recorded, and how many inodes failed on their own (status: one
    /// file's failure is told from the whole file system's).
    pub fn first_failure(&self) -> Option<(FirstFailure, usize)> {
        let first = self.first.lock().clone()?;
        Some((first, self.inodes.lock().len()))
    }

    /// Runs `sync` (of what `of` names) as one step with its check and its record: EIO
    /// without running it if `of` failed before; otherwise its outcome, an error being
    /// recorded (`what`, and the error) before this returns. The only way a sync of the
    /// backing is run and recorded through the mount.
    pub fn sync(
        &self,
        of: SyncOf,
        what: &str,
        sync: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        hook(Point::Start);
        debug_assert!(
            !IN_SYNC.with(|s| s.replace(true)),
            "a sync inside a sync would wait for itself"
        );
        let _done = InSyncReset;
        hook(Point::Waiting);
        // Lock order: `whole`, then one stripe; never a second sync while held.
        let (_whole_shared, _whole_own, _stripe) = match of {
            SyncOf::Inode { id, .. } => (
                Some(self.whole.read()),
                None,
                Some(self.stripes[stripe_of(id)].write()),
            ),
            SyncOf::Fs(_) => (None, Some(self.whole.write()), None),
        };
        let failed_before = match of {
            SyncOf::Inode { id, .. } => self.failed(id),
            SyncOf::Fs(dev) => self.fs_has_failed(dev),
        };
        if failed_before {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let r = sync();
        // The descriptors kept of the inode are asked too (kept.rs): one of them may hold
        // an error this sync's descriptor was opened too late to see.
        let r = match of {
            SyncOf::Inode {
                id,
                fails_fs: false,
            } => r.and_then(|()| self.check_kept(id)),
            _ => r,
        };
        hook(Point::Returned);
        if let Err(e) = &r {
            let what = format!("{what}: {e}");
            match of {
                SyncOf::Inode {
                    id,
                    fails_fs: false,
                } => self.inode_failed(id, what),
                SyncOf::Inode { id, fails_fs: true } => self.fs_failed(id.0, what),
                SyncOf::Fs(dev) => self.fs_failed(dev, what),
            }
        }
        r
    }

    /// Runs `change` (a write or copy of inode `id` the daemon serves) with its check and
    /// its record: EIO without running it if `id` failed before; otherwise its outcome, a
    /// failure that may have lost data (`change_error_is_sticky`) recorded (`what`, and
    /// the error) before this returns. `syncs_itself`: the change syncs what it wrote
    /// (RWF_DSYNC, RWF_SYNC), so it may take the inode's writeback error.
    pub fn change<T>(
        &self,
        id: InodeId,
        syncs_itself: bool,
        what: &str,
        change: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        hook(Point::Start);
        // A change that does not sync cannot take a writeback error: no lock.
        let _in_sync = syncs_itself.then(|| {
            debug_assert!(
                !IN_SYNC.with(|s| s.replace(true)),
                "a change inside a sync would wait for itself"
            );
            InSyncReset
        });
        hook(Point::Waiting);
        let _stripe = syncs_itself.then(|| self.stripes[stripe_of(id)].read());
        if self.failed(id) {
            return Err(FsError::Errno(libc::EIO));
        }
        let r = change();
        hook(Point::Returned);
        if let Err(e) = &r {
            if change_error_is_sticky(e.errno()) {
                self.inode_failed(id, format!("{what}: {e}"));
            }
        }
        r
    }
}

/// The descriptors the page cache path keeps after dropping a registration (kept.rs).
impl Failures {
    /// Sets the bound of descriptors kept unchecked (at start).
    pub fn set_kept_max(&self, max: usize) {
        self.kept.lock().set_max(max);
    }

    /// Keeps `fd` of inode `id` until a sync of the inode, or a syncfs, asks it for its
    /// writeback error. Returns the oldest one past the bound, which the caller hands to
    /// `check_evicted` off the request threads.
    #[must_use]
    pub fn keep(&self, id: InodeId, fd: Arc<File>) -> Option<Evicted<Arc<File>>> {
        self.kept.lock().keep(id, fd)
    }

    /// Asks a kept descriptor past the bound for its writeback error, recording it like
    /// any sync of its inode (the sync itself has nothing to write), and lets it go.
    pub fn check_evicted(&self, e: Evicted<Arc<File>>) {
        let _ = self.sync(
            SyncOf::inode(e.id),
            "writeback check of a closed file",
            || Ok(()),
        );
        // Gone already if that sync checked it; still here if the inode had failed.
        drop(self.kept.lock().remove(e.stamp));
    }

    /// A stamp to take before a syncfs of the backing starts (`release_kept`).
    pub fn kept_now(&self) -> u64 {
        self.kept.lock().now()
    }

    /// A syncfs that started at stamp `before` succeeded through a descriptor open since
    /// before anything was kept: it reported every writeback error of the file system
    /// since then, so the descriptors kept before it have nothing left to tell.
    pub fn release_kept(&self, before: u64) {
        let gone = self.kept.lock().release_before(before);
        drop(gone);
    }

    /// Takes the descriptors kept of inode `id` out (it lost its last name: nothing can
    /// open it again); the caller drops them where freeing the inode may block.
    pub fn forget_kept(&self, id: InodeId) -> Vec<Arc<File>> {
        self.kept.lock().take(id)
    }

    /// A descriptor kept of inode `id`, if any (to look at the inode through it).
    pub fn kept_of(&self, id: InodeId) -> Option<Arc<File>> {
        self.kept.lock().any_of(id).cloned()
    }

    /// Descriptors kept now, those being checked included (status).
    pub fn kept_len(&self) -> usize {
        self.kept.lock().len()
    }

    /// Asks every descriptor kept of inode `id` for its writeback error (after a sync of
    /// the inode, which wrote its dirty pages) and lets them go.
    fn check_kept(&self, id: InodeId) -> std::io::Result<()> {
        let fds = self.kept.lock().take(id);
        for fd in &fds {
            crate::sys::writeback_check(fd.as_fd())?;
        }
        Ok(())
    }
}

/// Whether a change (write, copy) that failed with `errno` may have lost data: all but
/// ENOSPC, EDQUOT and EINTR, which changed nothing (C5).
pub fn change_error_is_sticky(errno: i32) -> bool {
    !matches!(errno, libc::ENOSPC | libc::EDQUOT | libc::EINTR)
}

/// The stripe of inode `id`.
fn stripe_of(id: InodeId) -> usize {
    let mixed = id.1 ^ id.0.rotate_left(32);
    (mixed % SYNC_STRIPES as u64) as usize
}

thread_local! {
    /// Whether this thread is inside `Failures::sync` (debug check against nesting).
    static IN_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears `IN_SYNC` when a sync ends, however it ends.
struct InSyncReset;

impl Drop for InSyncReset {
    fn drop(&mut self) {
        IN_SYNC.with(|s| s.set(false));
    }
}

/// What a sync covers, and what its failure fails.
#[derive(Clone, Copy, Debug)]
pub enum SyncOf {
    /// An fsync (or fdatasync, or a writeback error check) of inode `id`. Its failure fails
    /// the inode, or with `fails_fs` the whole file system (a descriptor shared by
    /// every open of the mount, like the engine's backing files).
    Inode { id: InodeId, fails_fs: bool },
    /// A sync of file system `dev` as a whole (syncfs, a journal commit, a batch of
    /// directory syncs): which inode lost data is unknown, so its failure fails them all.
    Fs(u64),
}

impl SyncOf {
    /// An inode whose failure fails only itself.
    pub fn inode(id: InodeId) -> Self {
        SyncOf::Inode {
            id,
            fails_fs: false,
        }
    }
}

/// Test-only pause points of `Failures::sync`.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// Entered, nothing checked yet.
    Start,
    /// About to wait for the syncs this one must not overlap.
    Waiting,
    /// The sync returned; its failure, if any, not yet recorded.
    Returned,
}

/// Tests: what a thread runs at each `Point` of its syncs.
#[cfg(test)]
pub(crate) type SyncHook = Box<dyn Fn(Point)>;

#[cfg(test)]
thread_local! {
    /// Tests: called at each `Point` of a sync on this thread.
    pub(crate) static SYNC_HOOK: std::cell::RefCell<Option<SyncHook>> =
        const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn hook(p: Point) {
    SYNC_HOOK.with(|h| {
        if let Some(f) = &*h.borrow() {
            f(p)
        }
    });
}

#[cfg(not(test))]
#[inline(always)]
fn hook(_: Point) {}

/// Where `Failures::sync` may pause in tests (nowhere otherwise).
#[cfg(not(test))]
#[derive(Clone, Copy)]
enum Point {
    Start,
    Waiting,
    Returned,
}

/// (device, inode) of a descriptor.
pub fn id_of(fd: BorrowedFd<'_>) -> Option<InodeId> {
    crate::sys::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn a_failed_inode_or_file_system_stays_failed() {
        let f = Failures::default();
        assert!(!f.failed((1, 2)));
        f.inode_failed((1, 2), "fsync: EIO".into());
        assert!(f.failed((1, 2)) && !f.failed((1, 3)) && !f.fs_has_failed(1));
        f.fs_failed(4, "syncfs: EIO".into());
        assert!(f.failed((4, 9)) && f.fs_has_failed(4));
        let (first, inodes) = f.first_failure().unwrap();
        assert_eq!(first.what, "fsync: EIO");
        assert_eq!(
            (first.inode, inodes),
            (Some((1, 2)), 1),
            "one file's, not the file system's"
        );
    }

    fn eio() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EIO)
    }

    /// What thread B saw: it waited for A's sync (it can only go on once A's failure is
    /// recorded), or its own sync ran and returned this.
    enum Seen {
        Waiting,
        Done(std::io::Result<()>),
    }

    /// The window: A's sync of `a` fails and pauses before its failure is recorded; B's
    /// sync of `b` starts then. B must not report success: either it waits for A's
    /// record, or its own sync ran in the window and the test fails. Deterministic: A is
    /// let go only once B reached one or the other.
    fn overlapping(a: SyncOf, b: SyncOf) -> std::io::Result<()> {
        overlapping_with(move |f| f.sync(a, "fsync", || Err(eio())), b)
    }

    /// `overlapping`, with A's failing step given: `a` runs it on its own thread and must
    /// fail, passing `Point::Returned` of the step that fails.
    fn overlapping_with(
        a: impl FnOnce(&Failures) -> std::io::Result<()> + Send + 'static,
        b: SyncOf,
    ) -> std::io::Result<()> {
        use std::sync::mpsc::channel;
        let f = std::sync::Arc::new(Failures::default());
        let (ta, go) = park_in_window(&f, a);
        let (seen_tx, seen) = channel();
        let fb = f.clone();
        let probe = f.clone();
        let tb = std::thread::spawn(move || {
            let tx = seen_tx.clone();
            SYNC_HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |p| {
                    // Only if B is sure to wait: A holds what B is about to take, and
                    // keeps it until it is let go. Else B runs on and reports its end.
                    if p == Point::Waiting && would_wait(&probe, b) {
                        let _ = tx.send(Seen::Waiting);
                    }
                }))
            });
            let r = fb.sync(b, "fsync", || Ok(()));
            let eio = r.as_ref().err().and_then(|e| e.raw_os_error());
            let _ = seen_tx.send(Seen::Done(
                eio.map_or(Ok(()), |e| Err(std::io::Error::from_raw_os_error(e))),
            ));
            r
        });
        if let Seen::Done(Ok(())) = seen.recv().expect("B waits or ends") {
            panic!("B's sync ran while A's failure was not recorded yet, and reported success");
        }
        go.send(()).expect("A waits");
        assert!(ta.join().expect("A ends").is_err());
        tb.join().expect("B ends")
    }

    /// Runs `a` (A) on its own thread and returns once A is in its window: its failing
    /// step returned (`Point::Returned`) and the failure is not recorded yet. A stays there
    /// until the returned sender lets it go.
    fn park_in_window<T: Send + 'static>(
        f: &std::sync::Arc<Failures>,
        a: impl FnOnce(&Failures) -> T + Send + 'static,
    ) -> (std::thread::JoinHandle<T>, std::sync::mpsc::Sender<()>) {
        use std::sync::mpsc::channel;
        let (in_window_tx, in_window) = channel();
        let (go, go_rx) = channel::<()>();
        let fa = f.clone();
        let ta = std::thread::spawn(move || {
            SYNC_HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |p| {
                    if p == Point::Returned {
                        in_window_tx.send(()).expect("test waits");
                        go_rx.recv().expect("test lets go");
                    }
                }))
            });
            a(&fa)
        });
        in_window.recv().expect("A reaches the window");
        (ta, go)
    }

    /// Whether a sync of `of` would wait now for what another holds.
    fn would_wait(f: &Failures, of: SyncOf) -> bool {
        match of {
            SyncOf::Inode { id, .. } => {
                f.whole.try_read().is_none() || f.stripes[stripe_of(id)].try_write().is_none()
            }
            SyncOf::Fs(_) => f.whole.try_write().is_none(),
        }
    }

    #[test]
    fn a_sync_in_the_window_of_a_failing_sync_of_the_same_inode_fails() {
        let r = overlapping(SyncOf::inode((1, 2)), SyncOf::inode((1, 2)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn a_syncfs_in_the_window_of_a_failing_syncfs_fails() {
        let r = overlapping(SyncOf::Fs(1), SyncOf::Fs(1));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn an_inode_sync_in_the_window_of_a_failing_syncfs_fails() {
        let r = overlapping(SyncOf::Fs(1), SyncOf::inode((1, 2)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn a_sync_in_the_window_of_a_failing_shared_descriptor_sync_fails() {
        let shared = SyncOf::Inode {
            id: (1, 2),
            fails_fs: true,
        };
        let r = overlapping(shared, SyncOf::inode((1, 2)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    /// A write the daemon serves with RWF_DSYNC (an O_DSYNC open, `sync` mode) fails with
    /// EIO: its own sync took the inode's writeback error, which the kernel reports once
    /// per open file description, so an fsync of the same description that runs before
    /// the write's failure is recorded reads success for pages the disk never got
    /// (modelled here by B's sync returning Ok). B must wait for the record and fail.
    #[test]
    fn a_sync_in_the_window_of_a_failing_self_syncing_write_fails() {
        let failing_write = |f: &Failures| {
            f.change((1, 2), true, "write", || -> Result<()> {
                Err(FsError::Errno(libc::EIO))
            })
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
        };
        let r = overlapping_with(failing_write, SyncOf::inode((1, 2)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    /// Self-syncing writes of one file are not serialised: while one is in its window
    /// (failed, not yet recorded), another write of the same inode runs and returns.
    #[test]
    fn self_syncing_writes_of_one_inode_do_not_wait_for_each_other() {
        use std::sync::mpsc::channel;
        let f = std::sync::Arc::new(Failures::default());
        let (ta, go) = park_in_window(&f, |fa: &Failures| {
            fa.change((1, 2), true, "write", || -> Result<()> {
                Err(FsError::Errno(libc::EIO))
            })
        });
        let (done_tx, done) = channel();
        let fb = f.clone();
        let tb = std::thread::spawn(move || {
            let r = fb.change((1, 2), true, "write", || Ok(7u32));
            done_tx.send(()).expect("test waits");
            r
        });
        // A stays in its window until B is done; a B that waited for A would never be.
        // The bound only turns that deadlock into a failure; it measures nothing.
        let bound = std::time::Duration::from_secs(120);
        let b_done = done.recv_timeout(bound).is_ok();
        go.send(()).expect("A waits");
        assert!(ta.join().expect("A ends").is_err());
        assert!(
            b_done,
            "a self-syncing write waited for another one of the same inode"
        );
        assert_eq!(tb.join().expect("B ends").ok(), Some(7));
    }

    /// C5: a write that failed with ENOSPC or EDQUOT changed nothing; the inode stays
    /// writable and syncable. Any other failure of a change is sticky.
    #[test]
    fn a_change_failing_with_enospc_is_not_sticky_and_eio_is() {
        let f = Failures::default();
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let r = f.change((1, 2), true, "write", || -> Result<()> {
                Err(FsError::Errno(errno))
            });
            assert_eq!(r.unwrap_err().errno(), errno);
            assert!(!f.failed((1, 2)));
        }
        let r = f.change((1, 2), true, "write", || -> Result<()> {
            Err(FsError::Errno(libc::EIO))
        });
        assert_eq!(r.unwrap_err().errno(), libc::EIO);
        assert!(f.failed((1, 2)));
        let r = f.change((1, 2), false, "write", || -> Result<()> {
            panic!("a failed inode takes no change")
        });
        assert_eq!(r.unwrap_err().errno(), libc::EIO);
    }

    #[test]
    fn syncs_of_other_inodes_do_not_wait_for_each_other() {
        let f = Failures::default();
        f.inode_failed((1, 2), "fsync: EIO".into());
        assert!(f.sync(SyncOf::inode((1, 3)), "fsync", || Ok(())).is_ok());
        let r = f.sync(SyncOf::inode((1, 2)), "fsync", || {
            panic!("a failed inode is not synced")
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    /// A descriptor past the bound is checked like a sync of its inode and let go; it
    /// is found by every sync of the inode until then.
    #[test]
    fn an_evicted_descriptor_is_checked_and_let_go() {
        let d = tempfile::tempdir().expect("tempdir");
        let file = |n: &str| Arc::new(File::create(d.path().join(n)).expect("create"));
        let f = Failures::default();
        f.set_kept_max(1);
        assert!(f.keep((1, 2), file("a")).is_none());
        let e = f.keep((1, 3), file("b")).expect("past the bound");
        assert_eq!((e.id, f.kept_len()), ((1, 2), 2));
        f.check_evicted(e);
        assert_eq!(f.kept_len(), 1);
        assert!(!f.failed((1, 2)), "a clean file checks clean");
        // A syncfs that started after it lets go of the rest.
        let started = f.kept_now();
        f.release_kept(started);
        assert_eq!(f.kept_len(), 0);
    }
}
