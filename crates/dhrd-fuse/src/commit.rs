//! Group commit of metadata changes (`sync` mode), off the FUSE worker threads.
//!
//! A metadata request (create, mkdir, unlink, rename, setattr, ...) makes its change on the
//! backing directory in the worker that received it, collects what must be synced for the
//! change to be durable (the changed inode, its parent directory, or the whole file system
//! where an inode cannot be synced by descriptor) in a [`SyncSet`], and hands the set and
//! its reply to the committer. The worker is then free for the next request: a lookup or
//! getattr never waits behind another request's sync. The committer takes every set that
//! arrived while its previous round ran, syncs each distinct inode once (or the file
//! system once, where a set asks for it), and only then sends the replies.
//!
//! Invariants:
//! - A reply is sent only after a sync that started after its change was made: sets are
//!   queued after their change, and a round takes its sets before it starts syncing.
//! - Every set of a round is covered by that round's syncs: an inode is synced once per
//!   round however many sets name it; a `syncfs` in a round covers every set of it.
//! - A failed sync fails the replies of the sets that needed it (EIO; the change may or
//!   may not survive a crash, as after any failed fsync); other sets of the round are
//!   answered normally.
//!
//! Crash semantics: a crash before a round's syncs return may lose any change of that
//! round, none of which was acknowledged; nothing acknowledged is lost.

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
}

impl SyncSet {
    /// Adds the inodes behind `fds` (duplicated: the caller keeps its descriptors).
    pub fn fsync(&mut self, fds: &[&dyn AsFd]) -> Result<()> {
        for fd in fds {
            let dup = fd
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| FsError::io("dup for the metadata sync", e))?;
            self.fsync.push(dup);
        }
        Ok(())
    }

    /// Adds a syncfs of the file system `fd` lives on.
    pub fn syncfs(&mut self, fd: &dyn AsFd) -> Result<()> {
        if self.syncfs.is_none() {
            let dup = fd
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| FsError::io("dup for the metadata sync", e))?;
            self.syncfs = Some(dup);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.fsync.is_empty() && self.syncfs.is_none()
    }

    /// Syncs the set now, on the calling thread (for steps whose durability must come
    /// before the next step of the same request, such as set-id bits before data).
    pub fn sync_now(self) -> Result<()> {
        if let Some(fd) = &self.syncfs {
            sys::syncfs(fd.as_fd()).map_err(|e| FsError::io("syncfs", e))?;
            return Ok(());
        }
        for fd in &self.fsync {
            sys::fsync(fd.as_fd()).map_err(|e| FsError::io("fsync after metadata change", e))?;
        }
        Ok(())
    }
}

type Done = Box<dyn FnOnce(Result<()>) + Send>;

/// What the committer does to make an inode or a file system durable: `fsync` and
/// `syncfs` of the descriptor (tests put a stalled or failing one in its place).
pub trait Syncer: Send + Sync + 'static {
    fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()>;
    fn syncfs(&self, fd: &OwnedFd) -> std::io::Result<()>;
}

/// The real one.
pub struct KernelSyncer;

impl Syncer for KernelSyncer {
    fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()> {
        sys::fsync(fd.as_fd())
    }
    fn syncfs(&self, fd: &OwnedFd) -> std::io::Result<()> {
        sys::syncfs(fd.as_fd())
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
    /// Rounds run and sets they covered, for status.
    pub rounds: AtomicU64,
    pub sets: AtomicU64,
    pub syncs: AtomicU64,
}

impl Committer {
    pub fn start() -> std::io::Result<Arc<Self>> {
        Self::start_with(Box::new(KernelSyncer))
    }

    pub fn start_with(syncer: Box<dyn Syncer>) -> std::io::Result<Arc<Self>> {
        let c = Arc::new(Self {
            q: Mutex::new(Queue {
                sets: Vec::new(),
                shutdown: false,
            }),
            cv: Condvar::new(),
            syncer,
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
            let r = self.commit_one(&set);
            done(r);
            return;
        }
        q.sets.push((set, Box::new(done)));
        drop(q);
        self.cv.notify_one();
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

    /// One round: syncs what the sets name, each inode once (or the file system once, if
    /// a set asks for that, which covers every set of the round), then answers them.
    fn commit(&self, round: Vec<(SyncSet, Done)>) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.sets.fetch_add(round.len() as u64, Ordering::Relaxed);
        let fs = round.iter().find_map(|(s, _)| s.syncfs.as_ref());
        let fs_result = fs.map(|fd| {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            self.syncer
                .syncfs(fd)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        // Per inode (device, inode number): Ok, or the errno of its failed fsync.
        let mut synced: HashMap<(u64, u64), std::result::Result<(), i32>> = HashMap::new();
        let mut results = Vec::with_capacity(round.len());
        for (set, done) in round {
            let r = match &fs_result {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) if set.syncfs.is_some() => Err(*e),
                _ => self.fsync_each(&set, &mut synced),
            };
            results.push((r, done));
        }
        for (r, done) in results {
            done(r.map_err(|e| {
                FsError::io(
                    "sync after metadata change",
                    std::io::Error::from_raw_os_error(e),
                )
            }));
        }
    }

    /// Fsyncs the inodes of one set that this round has not synced yet.
    fn fsync_each(
        &self,
        set: &SyncSet,
        synced: &mut HashMap<(u64, u64), std::result::Result<(), i32>>,
    ) -> std::result::Result<(), i32> {
        let mut r = Ok(());
        for fd in &set.fsync {
            let one = match sys::fstat(fd.as_fd()) {
                Ok(st) => *synced
                    .entry((st.st_dev, st.st_ino))
                    .or_insert_with(|| self.fsync(fd)),
                // Identity unknown: synced on its own.
                Err(_) => self.fsync(fd),
            };
            if r.is_ok() {
                r = one;
            }
        }
        r
    }

    fn fsync(&self, fd: &OwnedFd) -> std::result::Result<(), i32> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.syncer
            .fsync(fd)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// One set on the calling thread (after shutdown).
    fn commit_one(&self, set: &SyncSet) -> Result<()> {
        let r = match &set.syncfs {
            Some(fd) => self
                .syncer
                .syncfs(fd)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)),
            None => self.fsync_each(set, &mut HashMap::new()),
        };
        r.map_err(|e| {
            FsError::io(
                "sync after metadata change",
                std::io::Error::from_raw_os_error(e),
            )
        })
    }
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
        fail_ino: Option<u64>,
    }

    impl Syncer for Gate {
        fn fsync(&self, fd: &OwnedFd) -> std::io::Result<()> {
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
            self.fsync(fd)
        }
    }

    type Door = Arc<(Mutex<bool>, Condvar)>;

    fn gate(fail_ino: Option<u64>) -> (Arc<Committer>, Door, Arc<AtomicU64>) {
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let fsyncs = Arc::new(AtomicU64::new(0));
        let c = Committer::start_with(Box::new(Gate {
            open: open.clone(),
            fsyncs: fsyncs.clone(),
            fail_ino,
        }))
        .unwrap();
        (c, open, fsyncs)
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
        let (c, open, fsyncs) = gate(None);
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
        let (c, open, _) = gate(Some(bad));
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
}
