//! The engine data path's cache of hybrid objects, one per regular file whose data is
//! (being) held in the engine's RAM tier (a memfd per file). Used when the mount runs on
//! the engine (`--read-path engine-*`, or a kernel or backing file system that cannot pass
//! files through, see `page`).
//!
//! Invariants:
//! - At most one `HybridObject` exists per backing inode (the map is keyed by the backing
//!   inode number and objects are created under the map lock), so every open of a file,
//!   through any name or hard link, reads and writes the same RAM copy (SPEC D3).
//! - Objects of open files are never dropped. Objects of closed files stay in a bounded LRU
//!   (`CLOSED_OBJECTS_MAX`); beyond it the oldest is flushed and dropped, and its data is
//!   served from the backing again on the next open until it is reloaded.
//! - An object whose backing file has no links left is dropped at its last close without a
//!   flush (`HybridObject::discard`): its data can never be read again.
//! - Kernel rules for passthrough (fs/fuse/iomode.c), broken ones cost the application an
//!   EIO at open: while an inode has passthrough opens, every new open of it must carry
//!   the backing id; and passthrough is refused while the inode is mapped through the page
//!   cache. Passthrough writes would bypass the daemon (and durability), so a writable open
//!   of an inode with passthrough opens is refused with ETXTBSY (like writing a running
//!   executable); a first registration needs the open to be the inode's only one; both are
//!   decided under the map lock (`acquire`, `choose_passthrough`) so they cannot race.
//! - A closed object whose backing file changed behind the daemon's back (size or mtime
//!   differ from what was recorded at close) is dropped at the next open and reloaded.
//! - Objects are created outside the map lock (opening the backing file and the memfd, and
//!   an inline load of a small file, take tens of microseconds and may read the disk), by
//!   one open per inode at a time (`Inner::creating`); concurrent opens of the same inode
//!   wait for it, so only one object per inode is ever handed out.
//!
//! Crash semantics: dropping an object calls `close()` first, which makes every write
//! durable in the non-sync modes; in sync mode every write already is.

use crate::error::{FsError, Result};
use crate::kernel::BackingId;
use crate::sys;
use dhrd_engine::{HybridObject, ObjectConfig};
use dhrd_io::{Durable as _, FileBacking, FileOptions};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Arc;

/// Closed files whose objects (RAM copy, backing fd, memfd) are kept, by default
/// (`--object-cache`). Each costs two or three file descriptors (the daemon raises
/// RLIMIT_NOFILE to its hard limit at start, and 1024 objects stay well inside a hard
/// limit of 4096), a few KB of engine counters and chunk slots, and up to about 80 KB
/// once all its latency histograms are in use, besides its data.
pub const CLOSED_OBJECTS_MAX: usize = 1024;

pub type Obj = HybridObject<FileBacking>;

/// What identifies the content of a closed backing file: size, mtime seconds, mtime ns.
type Signature = (i64, i64, i64);

struct Entry {
    obj: Obj,
    opens: u32,
    /// Writable opens among `opens`.
    writers: u32,
    /// Position in the LRU while closed.
    tick: Option<u64>,
    closed_sig: Option<Signature>,
    /// Passthrough registration shared by all passthrough opens of this inode (the kernel
    /// requires one backing id per inode).
    passthrough: Option<Arc<BackingId>>,
    /// Opens carrying the backing id (`OpenKind::Passthrough`), among `opens`.
    passthrough_opens: u32,
    /// Read-only opens without it (`OpenKind::PlainReader`), among `opens`. Like writers,
    /// they may map the file through the page cache, which rules out a new registration.
    plain_readers: u32,
}

/// What an open was counted as, for `Objects::release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenKind {
    /// Writable: always without a backing id.
    Writer,
    /// Read-only without a backing id (direct or cached path).
    PlainReader,
    /// Carries the inode's backing id (`PassthroughChoice::Pure` or `Joined`).
    Passthrough,
    /// Read-only, counted by `acquire` but released before `choose_passthrough` decided
    /// (an open that failed after `acquire`).
    Undecided,
}

/// How one open of a regular file reaches its data (see `Objects::choose_passthrough`).
pub enum PassthroughChoice {
    /// The kernel reads the memfd itself.
    Pure(Arc<BackingId>),
    /// Reads go to the daemon; the open carries the inode's backing id because the kernel
    /// demands it of every open while passthrough opens exist.
    Joined(Arc<BackingId>),
    /// No backing id: the direct or cached path.
    Plain,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, Entry>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    /// Inodes whose object one open is creating outside the lock; other opens of them wait
    /// for it (`Objects::created`) rather than build a second object.
    creating: HashSet<u64>,
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Removes the entry of `key` from the map and the LRU.
    fn remove_entry(&mut self, key: u64) -> Option<Entry> {
        let e = self.map.remove(&key)?;
        if let Some(t) = e.tick {
            self.lru.remove(&t);
        }
        Some(e)
    }
}

pub struct Objects {
    inner: Mutex<Inner>,
    /// Signalled whenever an entry leaves `Inner::creating`.
    created: Condvar,
    base: ObjectConfig,
    /// Objects kept after their last close (`--object-cache`).
    closed_objects_max: usize,
}

fn signature(f: &File) -> Option<Signature> {
    let st = sys::fstat(f.as_fd()).ok()?;
    Some((st.st_size, st.st_mtime, st.st_mtime_nsec))
}

impl Objects {
    /// `closed_objects_max`: objects kept after their last close (at least 1); see
    /// `CLOSED_OBJECTS_MAX`.
    pub fn new(base: ObjectConfig, closed_objects_max: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            created: Condvar::new(),
            base,
            closed_objects_max: closed_objects_max.max(1),
        }
    }

    /// Returns the object of backing inode `key`, creating it with the file `open` returns
    /// when there is none. Counts one open; pair with [`release`](Self::release).
    /// A writable open fails with ETXTBSY while the inode has passthrough opens.
    pub fn acquire(
        &self,
        key: u64,
        name: &str,
        writable: bool,
        open: impl FnOnce() -> Result<File>,
    ) -> Result<Obj> {
        self.get_or_create(key, name, open, Some(writable))
    }

    /// Like `acquire` without counting an open (preloader, truncate of a closed file).
    /// The object lands in the closed LRU.
    pub fn touch(&self, key: u64, name: &str, open: impl FnOnce() -> Result<File>) -> Result<Obj> {
        self.get_or_create(key, name, open, None)
    }

    fn get_or_create(
        &self,
        key: u64,
        name: &str,
        open: impl FnOnce() -> Result<File>,
        count_open: Option<bool>,
    ) -> Result<Obj> {
        let mut stale = Vec::new();
        let mut open = Some(open);
        loop {
            {
                let mut g = self.inner.lock();
                let inner = &mut *g;
                // A closed object whose file changed behind our back is reloaded.
                let changed = match inner.map.get(&key) {
                    Some(e) if e.opens == 0 => match e.closed_sig {
                        Some(sig) => signature(e.obj.backing().file()) != Some(sig),
                        None => false,
                    },
                    _ => false,
                };
                if changed {
                    if let Some(e) = inner.remove_entry(key) {
                        stale.push(e.obj);
                    }
                }
                if inner.map.contains_key(&key) {
                    return self.finish_open(g, key, count_open, stale);
                }
                if inner.creating.contains(&key) {
                    self.created.wait(&mut g);
                    continue;
                }
                inner.creating.insert(key);
            }
            // Nobody else creates an object for `key` meanwhile (`creating`), and nobody can
            // be handed one before we insert ours.
            let created = match open.take() {
                Some(open) => open().and_then(|f| self.create(name, f)),
                None => Err(FsError::Stale),
            };
            let mut g = self.inner.lock();
            g.creating.remove(&key);
            self.created.notify_all();
            let obj = match created {
                Ok(o) => o,
                Err(e) => {
                    drop(g);
                    close_all(stale);
                    return Err(e);
                }
            };
            let inner = &mut *g;
            // One object per inode (D3): entries of `key` are made only here, and only by
            // the one open that put `key` in `creating`.
            assert!(
                !inner.map.contains_key(&key),
                "a second object for backing inode {key}"
            );
            let tick = inner.next_tick();
            inner.lru.insert(tick, key);
            inner.map.insert(
                key,
                Entry {
                    obj,
                    opens: 0,
                    writers: 0,
                    tick: Some(tick),
                    closed_sig: None,
                    passthrough: None,
                    passthrough_opens: 0,
                    plain_readers: 0,
                },
            );
            return self.finish_open(g, key, count_open, stale);
        }
    }

    /// Counts the open of the existing entry `key`, evicts what no longer fits, then,
    /// with the map unlocked, closes what was dropped.
    fn finish_open(
        &self,
        mut g: parking_lot::MutexGuard<'_, Inner>,
        key: u64,
        count_open: Option<bool>,
        mut stale: Vec<Obj>,
    ) -> Result<Obj> {
        let inner = &mut *g;
        let r = Self::open_entry(inner, key, count_open);
        Self::evict_locked(inner, &mut stale, self.closed_objects_max);
        drop(g);
        close_all(stale);
        r
    }

    /// Counts an open of the existing entry `key` (a writable one fails with ETXTBSY while
    /// the inode has passthrough opens), takes it out of the LRU and returns its object.
    fn open_entry(inner: &mut Inner, key: u64, count_open: Option<bool>) -> Result<Obj> {
        let Some(e) = inner.map.get_mut(&key) else {
            return Err(FsError::Stale);
        };
        if let Some(writable) = count_open {
            // The kernel's rule (fs/fuse/iomode.c), decided here under the map lock.
            debug_assert!(
                e.passthrough_opens == 0 || e.passthrough.is_some(),
                "passthrough opens of {key} without a backing id"
            );
            if writable && e.passthrough_opens > 0 {
                return Err(FsError::Errno(libc::ETXTBSY));
            }
            e.opens += 1;
            if writable {
                e.writers += 1;
            }
            if let Some(t) = e.tick.take() {
                inner.lru.remove(&t);
            }
        }
        Ok(e.obj.clone())
    }

    /// Builds the object over `file`.
    fn create(&self, name: &str, file: File) -> Result<Obj> {
        let cfg = ObjectConfig {
            name: format!("dhrd:{name}"),
            ..self.base.clone()
        };
        // Block-aligned writes go through O_DIRECT, so they leave no second copy in the page
        // cache; in `sync` mode with RWF_DSYNC, exactly a raw O_DIRECT|O_DSYNC write
        // (durable on return, concurrent writers flushed together by the block layer),
        // which measured at least as fast as a shared fdatasync (docs/fuse.md).
        let opts = FileOptions {
            write_sync: cfg.durability.file_write_sync(),
            direct_writes: true,
            ..FileOptions::default()
        };
        let backing = FileBacking::from_file(file, name.to_owned(), &opts)
            .map_err(|e| FsError::io("backing file", e))?;
        Ok(HybridObject::open(backing, cfg)?)
    }

    /// Counts one close. At the last close the object goes to the LRU, or is dropped when
    /// its file has no links left. The backing id is closed with the last passthrough
    /// open.
    pub fn release(&self, key: u64, kind: OpenKind) {
        let mut dropped = Vec::new();
        let mut gone = None;
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let mut unlinked = false;
            // Objects of open files are never dropped, so the open being released has one.
            debug_assert!(
                inner.map.contains_key(&key),
                "release of {key} without an object"
            );
            if let Some(e) = inner.map.get_mut(&key) {
                // Each counted open is released once, under the kind it was counted as.
                debug_assert!(e.opens > 0, "release of {key} with no open counted");
                e.opens = e.opens.saturating_sub(1);
                match kind {
                    OpenKind::Writer => {
                        debug_assert!(e.writers > 0, "release of a writer of {key} never counted");
                        e.writers = e.writers.saturating_sub(1);
                    }
                    OpenKind::PlainReader => {
                        debug_assert!(e.plain_readers > 0, "release of an uncounted reader");
                        e.plain_readers = e.plain_readers.saturating_sub(1);
                    }
                    OpenKind::Passthrough => {
                        debug_assert!(e.passthrough_opens > 0, "release of an uncounted open");
                        e.passthrough_opens = e.passthrough_opens.saturating_sub(1);
                        if e.passthrough_opens == 0 {
                            e.passthrough = None;
                        }
                    }
                    OpenKind::Undecided => {}
                }
                debug_assert!(
                    e.writers + e.plain_readers + e.passthrough_opens <= e.opens,
                    "open kinds of {key} outnumber its opens"
                );
                if e.opens == 0 {
                    unlinked = has_no_links(&e.obj);
                    if !unlinked {
                        e.closed_sig = signature(e.obj.backing().file());
                        inner.tick += 1;
                        e.tick = Some(inner.tick);
                        inner.lru.insert(inner.tick, key);
                    }
                }
            }
            Self::evict_locked(inner, &mut dropped, self.closed_objects_max);
            if unlinked {
                gone = inner.remove_entry(key).map(|e| e.obj);
            }
        }
        if let Some(o) = gone {
            o.discard();
        }
        close_all(dropped);
    }

    fn evict_locked(inner: &mut Inner, dropped: &mut Vec<Obj>, keep: usize) {
        while inner.lru.len() > keep {
            let Some((_, key)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(e) = inner.map.remove(&key) {
                // Only closed objects are in the LRU: an open one is never dropped.
                assert_eq!(e.opens, 0, "object of {key} evicted while open");
                dropped.push(e.obj);
            }
        }
        assert!(
            inner.lru.len() <= keep,
            "closed-object cache over its bound"
        );
    }

    /// The object of `key` if one exists (open or cached), without counting an open.
    pub fn get(&self, key: u64) -> Option<Obj> {
        self.inner.lock().map.get(&key).map(|e| e.obj.clone())
    }

    /// Drops the cached object of a closed file, after unlink or rename-over removed a
    /// link. Open objects stay until their last release.
    pub fn forget_if_closed(&self, key: u64) {
        let dropped = {
            let mut g = self.inner.lock();
            match g.map.get(&key) {
                Some(e) if e.opens == 0 => g.remove_entry(key).map(|e| e.obj),
                _ => None,
            }
        };
        if let Some(o) = dropped {
            // Unlinked (or renamed over) and closed: nothing can reach the data again, so
            // it is not flushed. A file that is still linked elsewhere is closed normally
            // (the next open reloads it).
            if has_no_links(&o) {
                o.discard();
            } else {
                close_all(vec![o]);
            }
        }
    }

    /// Decides how one more read-only open of `key` (already counted by `acquire`) reaches
    /// the data, registering the backing id with `make` for the first passthrough open,
    /// and counts it for `release` under the returned kind. Under the map lock, so it
    /// cannot race another open's choice or a release.
    ///
    /// The kernel fails an open with EIO when the reply does not fit the inode's I/O mode
    /// (fs/fuse/iomode.c), so:
    /// - while the inode has passthrough opens, every open must carry the backing id: `Pure`
    ///   if `pure_ok` (the file is fully loaded), else `Joined` (FOPEN_DIRECT_IO on top:
    ///   reads go to the daemon, only mmap uses the memfd). Writable opens never get here
    ///   then: `acquire` refuses them with ETXTBSY.
    /// - a new registration needs no writer and no plain reader: either may have mapped the
    ///   file through the page cache, and the kernel refuses passthrough then. Opens that
    ///   are counted but not yet decided do not matter: they decide after this one.
    ///
    /// A failed registration counts the open as a plain reader and returns the error (the
    /// caller serves it on the direct path).
    pub fn choose_passthrough(
        &self,
        key: u64,
        pure_ok: bool,
        make: impl FnOnce(&Obj) -> std::io::Result<BackingId>,
    ) -> std::io::Result<PassthroughChoice> {
        let mut g = self.inner.lock();
        // `acquire` counted the open, and an object with opens is never dropped.
        debug_assert!(
            g.map.contains_key(&key),
            "passthrough choice for {key} without acquire"
        );
        let Some(e) = g.map.get_mut(&key) else {
            return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
        };
        debug_assert!(
            e.opens > 0,
            "passthrough choice for {key} with no open counted"
        );
        let choice = match &e.passthrough {
            Some(id) if pure_ok => PassthroughChoice::Pure(id.clone()),
            Some(id) => PassthroughChoice::Joined(id.clone()),
            None if pure_ok && e.writers == 0 && e.plain_readers == 0 => match make(&e.obj) {
                Ok(id) => {
                    let id = Arc::new(id);
                    e.passthrough = Some(id.clone());
                    PassthroughChoice::Pure(id)
                }
                Err(err) => {
                    e.plain_readers += 1;
                    return Err(err);
                }
            },
            None => {
                e.plain_readers += 1;
                return Ok(PassthroughChoice::Plain);
            }
        };
        e.passthrough_opens += 1;
        Ok(choice)
    }

    /// Number of objects (open and cached).
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Clones of every object, for status and flush.
    pub fn snapshot(&self) -> Vec<Obj> {
        self.inner
            .lock()
            .map
            .values()
            .map(|e| e.obj.clone())
            .collect()
    }

    /// Whether the closed LRU has room for preloading more files.
    pub fn has_room(&self) -> bool {
        self.inner.lock().lru.len() < self.closed_objects_max
    }

    /// Whether `key` has an object.
    pub fn is_known(&self, key: u64) -> bool {
        self.inner.lock().map.contains_key(&key)
    }

    /// Flushes and drops every object (unmount). Returns the first flush error.
    pub fn close_everything(&self) -> Result<()> {
        let all: Vec<Obj> = {
            let mut g = self.inner.lock();
            g.lru.clear();
            g.map.drain().map(|(_, e)| e.obj).collect()
        };
        let mut first = Ok(());
        for o in all {
            if let Err(e) = o.close() {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        first
    }
}

/// Closes objects pushed out of the LRU (or found stale). Closing flushes in the non-sync
/// modes; a failure leaves the object read-only and the data in the backing as of the last
/// successful flush, which is all we can do for a file nobody has open. It is reported in
/// the daemon's log.
fn close_all(objs: Vec<Obj>) {
    for o in objs {
        if let Err(e) = o.close() {
            eprintln!(
                "dhrd: flushing {} on eviction failed: {e}",
                o.backing().describe()
            );
        }
    }
}

/// Whether the object's backing file has no name left (unlinked or renamed over). An
/// unreadable status counts as linked, so the object is flushed rather than discarded.
fn has_no_links(o: &Obj) -> bool {
    sys::fstat(o.backing().file().as_fd())
        .map(|s| s.st_nlink == 0)
        .unwrap_or(false)
}
