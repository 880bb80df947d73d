//! The cache of hybrid objects, one per regular file whose data is (being) held in RAM.
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
//! - Kernel rule for passthrough (fs/fuse/iomode.c): while an inode has passthrough opens,
//!   every new open of it must be passthrough too. Passthrough writes would bypass the
//!   daemon (and durability), so a writable open of an inode with passthrough opens is
//!   refused with ETXTBSY (like writing a running executable), decided under the map lock
//!   together with the passthrough registration so the two cannot race.
//! - A closed object whose backing file changed behind the daemon's back (size or mtime
//!   differ from what was recorded at close) is dropped at the next open and reloaded.
//!
//! Crash semantics: dropping an object calls `close()` first, which makes every write
//! durable in the non-sync modes; in sync mode every write already is.

use crate::backing::ConfinedFile;
use crate::error::Result;
use crate::sys;
use dhrd_engine::{Durability, HybridObject, ObjectConfig};
use dhrd_io::Durable as _;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Arc;

/// Closed files whose objects (RAM copy, backing fd, memfd) are kept. Each costs two or
/// three file descriptors (the daemon raises RLIMIT_NOFILE to its hard limit at start, and
/// 1024 objects stay well inside a hard limit of 4096) and a few KB of engine statistics
/// (up to about 80 KB once all its latency histograms are in use), besides its data.
pub const CLOSED_OBJECTS_MAX: usize = 1024;

pub type Obj = HybridObject<ConfinedFile>;

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
    passthrough: Option<Arc<fuser::BackingId>>,
    passthrough_opens: u32,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, Entry>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
}

pub struct Objects {
    inner: Mutex<Inner>,
    base: ObjectConfig,
}

fn signature(f: &File) -> Option<Signature> {
    let st = sys::fstat(f.as_fd()).ok()?;
    Some((st.st_size, st.st_mtime, st.st_mtime_nsec))
}

impl Objects {
    pub fn new(base: ObjectConfig) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            base,
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
        let mut dropped = Vec::new();
        let obj = {
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
                if let Some(e) = inner.map.remove(&key) {
                    if let Some(t) = e.tick {
                        inner.lru.remove(&t);
                    }
                    dropped.push(e.obj);
                }
            }
            if !inner.map.contains_key(&key) {
                let file = open()?;
                let cfg = ObjectConfig {
                    name: format!("dhrd:{name}"),
                    ..self.base.clone()
                };
                let write_through = cfg.durability == Durability::Sync;
                let backing = ConfinedFile::new(file, name.to_owned(), write_through);
                let obj = HybridObject::open(backing, cfg)?;
                inner.tick += 1;
                let tick = inner.tick;
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
                    },
                );
            }
            let Some(e) = inner.map.get_mut(&key) else {
                return Err(crate::error::FsError::Stale);
            };
            if let Some(writable) = count_open {
                if writable && e.passthrough_opens > 0 {
                    return Err(crate::error::FsError::Errno(libc::ETXTBSY));
                }
                e.opens += 1;
                if writable {
                    e.writers += 1;
                }
                if let Some(t) = e.tick.take() {
                    inner.lru.remove(&t);
                }
            }
            let obj = e.obj.clone();
            Self::evict_locked(inner, &mut dropped);
            obj
        };
        close_all(dropped);
        Ok(obj)
    }

    /// Counts one close. At the last close the object goes to the LRU, or is dropped when
    /// its file has no links left.
    pub fn release(&self, key: u64, writable: bool) {
        let mut dropped = Vec::new();
        let mut gone = None;
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let mut unlinked = false;
            if let Some(e) = inner.map.get_mut(&key) {
                e.opens = e.opens.saturating_sub(1);
                if writable {
                    e.writers = e.writers.saturating_sub(1);
                }
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
            Self::evict_locked(inner, &mut dropped);
            if unlinked {
                if let Some(e) = inner.map.remove(&key) {
                    gone = Some(e.obj);
                }
            }
        }
        if let Some(o) = gone {
            o.discard();
        }
        close_all(dropped);
    }

    fn evict_locked(inner: &mut Inner, dropped: &mut Vec<Obj>) {
        while inner.lru.len() > CLOSED_OBJECTS_MAX {
            let Some((_, key)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(e) = inner.map.remove(&key) {
                dropped.push(e.obj);
            }
        }
    }

    /// The object of `key` if one exists (open or cached), without counting an open.
    pub fn get(&self, key: u64) -> Option<Obj> {
        self.inner.lock().map.get(&key).map(|e| e.obj.clone())
    }

    /// Drops the cached object of a closed file (after unlink/rename-over removed its last
    /// link). Open objects stay until their last release.
    pub fn forget_if_closed(&self, key: u64) {
        let dropped = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            match inner.map.get(&key) {
                Some(e) if e.opens == 0 => {
                    let e = inner.map.remove(&key);
                    e.map(|e| {
                        if let Some(t) = e.tick {
                            inner.lru.remove(&t);
                        }
                        e.obj
                    })
                }
                _ => None,
            }
        };
        if let Some(o) = dropped {
            // Unlinked (or renamed over) and closed: nothing can reach the data again, so
            // it is not flushed. A file that is still linked elsewhere is closed normally.
            if has_no_links(&o) {
                o.discard();
            } else {
                close_all(vec![o]);
            }
        }
    }

    /// Registers (or reuses) the passthrough backing id of `key` for one more open.
    /// With `only_if_no_writers`, refuses (EBUSY) while the inode has writable opens.
    pub fn passthrough_id(
        &self,
        key: u64,
        only_if_no_writers: bool,
        make: impl FnOnce(&Obj) -> std::io::Result<fuser::BackingId>,
    ) -> std::io::Result<Arc<fuser::BackingId>> {
        let mut g = self.inner.lock();
        let Some(e) = g.map.get_mut(&key) else {
            return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
        };
        if only_if_no_writers && e.writers > 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
        }
        let id = match &e.passthrough {
            Some(id) => id.clone(),
            None => {
                let id = Arc::new(make(&e.obj)?);
                e.passthrough = Some(id.clone());
                id
            }
        };
        e.passthrough_opens += 1;
        Ok(id)
    }

    /// Counts one passthrough close; the backing id is closed with the last one.
    pub fn passthrough_release(&self, key: u64) {
        let mut g = self.inner.lock();
        if let Some(e) = g.map.get_mut(&key) {
            e.passthrough_opens = e.passthrough_opens.saturating_sub(1);
            if e.passthrough_opens == 0 {
                e.passthrough = None;
            }
        }
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
        self.inner.lock().lru.len() < CLOSED_OBJECTS_MAX
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

/// Whether the object's backing file has no name left (unlinked or renamed over). An
/// unreadable status counts as linked, so the object is flushed rather than discarded.
fn has_no_links(o: &Obj) -> bool {
    sys::fstat(o.backing().file().as_fd())
        .map(|s| s.st_nlink == 0)
        .unwrap_or(false)
}

fn close_all(objs: Vec<Obj>) {
    for o in objs {
        // Closing flushes in the non-sync modes; a failure leaves the object read-only and
        // the data in the backing as of the last successful flush, which is all we can do
        // for a file nobody has open. It is reported in the daemon's log.
        if let Err(e) = o.close() {
            eprintln!(
                "dhrd: flushing {} on eviction failed: {e}",
                o.backing().describe()
            );
        }
    }
}
