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
//! - Kernel rules for passthrough (fs/fuse/iomode.c), broken ones cost the application an
//!   EIO at open: while an inode has passthrough opens, every new open of it must carry
//!   the backing id; and passthrough is refused while the inode is mapped through the page
//!   cache. Passthrough writes would bypass the daemon (and durability), so a writable open
//!   of an inode with passthrough opens is refused with ETXTBSY (like writing a running
//!   executable); a first registration needs the open to be the inode's only one; both are
//!   decided under the map lock (`acquire`, `choose_passthrough`) so they cannot race.
//! - A closed object whose backing file changed behind the daemon's back (size or mtime
//!   differ from what was recorded at close) is dropped at the next open and reloaded.
//! - Parked files: an object pushed out of the LRU that was fully loaded leaves its bytes
//!   behind as a plain heap copy (no descriptor, no mapping, no statistics), charged to the
//!   RAM budget by its size plus a small per-entry charge; the preload walk parks small files the same way.
//!   When a load finds the budget full, the oldest parked copies are given back first.
//!   So every file of a large tree stays in RAM within `--mem` while only the open and
//!   recently used ones cost descriptors. A parked copy is used only while the inode has
//!   no object, and only if the backing file's size and mtime still match; every path
//!   that removes an object also removes the inode's parked copy, and a copy taken of an
//!   older object never replaces one of a newer (generations), so a stale copy is never
//!   served.
//! - Objects are created outside the map lock (opening the backing file, the memfd and an
//!   inline load of a small file take tens of microseconds and may read the disk), by one
//!   open per inode at a time (`Inner::creating`); concurrent opens of the same inode wait
//!   for it, so the parked copy it takes is never missing for a second creator, and only
//!   one object per inode is ever handed out.
//!
//! - Parked readers: a read-only open of an inode with no object may be served from its
//!   parked copy (`ParkedReader`); creating the inode's object switches every such reader
//!   to it under the map lock (D3), and an unlink or rename-over that frees the inode
//!   detaches them first (see `ParkedReader`).
//!
//! Crash semantics: dropping an object calls `close()` first, which makes every write
//! durable in the non-sync modes; in sync mode every write already is. Parked copies are
//! RAM only; the backing holds the same bytes.

use crate::backing::ConfinedFile;
use crate::error::{FsError, Result};
use crate::sys;
use dhrd_engine::{Durability, HybridObject, ObjectConfig, RamBudget};
use dhrd_io::Durable as _;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::{Arc, Weak};

/// Closed files whose objects (RAM copy, backing fd, memfd) are kept, by default
/// (`--object-cache`). Each costs two or
/// three file descriptors (the daemon raises RLIMIT_NOFILE to its hard limit at start, and
/// 1024 objects stay well inside a hard limit of 4096), a few KB of engine counters and
/// chunk slots, and up to about 80 KB once all its latency histograms are in use, besides
/// its data.
pub const CLOSED_OBJECTS_MAX: usize = 1024;

pub type Obj = HybridObject<ConfinedFile>;

/// Largest object parked when it leaves the LRU. Parking copies the object's bytes into a
/// heap buffer while its memfd still holds them, so the copy briefly doubles its RAM; a
/// larger file is dropped as before parked files existed and reloads at its next open.
pub const PARK_BYTES_MAX: u64 = 64 << 20;
/// Files up to this size are parked by the preload walk itself (one read each, no object);
/// larger ones get an object the loader threads fill (chunk by chunk, in parallel) while
/// the LRU has room, and are parked by the walk too once it is full, up to
/// `PARK_BYTES_MAX`: a tree of many mid-sized files is then in RAM as a whole, not just
/// its first `--object-cache` files.
pub const PRELOAD_PARK_BYTES_MAX: u64 = 1 << 20;
/// What one parked copy costs besides its bytes (map and order entries, allocator
/// header), counted in the budget; measured RSS was about 1.2 KB per parked 1 KiB file.
const PARKED_ENTRY_BYTES: u64 = 192;

/// Budget charge of a parked copy of `len` bytes: heap memory, not page-rounded memfd
/// pages (a page per 1 KiB file over-counted the budget fourfold).
fn parked_charge(len: u64) -> u64 {
    len.next_multiple_of(64) + PARKED_ENTRY_BYTES
}
/// A parked copy up to this size is kept beside the object made from it and parked again
/// as it is when the object goes unmodified: no copy, and no new long-lived allocation
/// between the short-lived ones of objects, which fragmented the heap (100k files of 1 KiB
/// read once: daemon RSS 118 -> 345 MB without this). Bounds the extra RAM to
/// `CLOSED_OBJECTS_MAX` (plus open files) times this.
pub const KEEP_ORIGIN_BYTES_MAX: u64 = 64 << 10;

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
    /// Opens carrying the backing id (`OpenKind::Passthrough`), among `opens`.
    passthrough_opens: u32,
    /// Read-only opens without it (`OpenKind::PlainReader`), among `opens`. Like writers,
    /// they may map the file through the page cache, which rules out a new registration.
    plain_readers: u32,
    /// Creation order; a parked copy of an older generation never replaces a newer one.
    generation: u64,
    /// The parked copy this object was made from (small files only; not charged to the
    /// budget while the object lives).
    origin: Option<Parked>,
}

/// A read-only open of a file that has no object, served from its parked copy: no
/// backing descriptor, no memfd, no mapping. Opening and closing one costs a lookup in the
/// parked map, where creating an object costs about a dozen system calls.
///
/// D3: when an object is created for the inode (a writer opens it, a truncate, a
/// passthrough open), every registered reader is switched to it under the map lock before
/// that open returns, and counted as one of its plain readers; a read that starts after
/// any write through the object reads the object. A reader whose inode lost its last link
/// is detached first (its bytes stay, as for any open of an unlinked file), so a new file
/// that reuses the inode number never takes it over; so is one whose file changed behind
/// the daemon's back (its signature no longer matches).
pub struct ParkedReader {
    key: u64,
    sig: Signature,
    state: Mutex<ReaderState>,
}

/// Where a `ParkedReader` reads from now.
#[derive(Clone)]
pub enum ReaderState {
    Bytes(Arc<Vec<u8>>),
    Object(Obj),
}

impl ParkedReader {
    pub fn state(&self) -> ReaderState {
        self.state.lock().clone()
    }
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
    Pure(Arc<fuser::BackingId>),
    /// Reads go to the daemon; the open carries the inode's backing id because the kernel
    /// demands it of every open while passthrough opens exist.
    Joined(Arc<fuser::BackingId>),
    /// No backing id: the direct or cached path.
    Plain,
}

/// The bytes of a closed file kept without an object (see the module header).
struct Parked {
    sig: Signature,
    /// Shared with the parked readers opened on it (`ParkedReader`).
    bytes: Arc<Vec<u8>>,
    /// Charged to the RAM budget (`parked_charge`).
    reserved_bytes: u64,
    generation: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, Entry>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    parked: HashMap<u64, Parked>,
    parked_bytes: u64,
    /// Parked copies by generation, oldest first: the order the budget reclaims them in.
    parked_order: BTreeMap<u64, u64>,
    /// Inodes whose object one open is creating outside the lock; other opens of them wait
    /// for it (`Objects::created`) rather than build a second object, which would find no
    /// parked copy left and load from the disk.
    creating: HashSet<u64>,
    /// Read-only opens served from parked copies, by inode; they are converted to the
    /// inode's object when one is created (`convert_parked_readers`).
    parked_readers: HashMap<u64, Vec<Weak<ParkedReader>>>,
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Removes the parked copy of `key`, returning its bytes and signature; the budget
    /// reservation is released by the caller via `budget`.
    fn unpark(&mut self, key: u64, budget: &RamBudget) -> Option<Parked> {
        let p = self.parked.remove(&key)?;
        self.parked_order.remove(&p.generation);
        self.parked_bytes -= p.bytes.len() as u64;
        budget.release(p.reserved_bytes);
        Some(p)
    }

    fn insert_parked(&mut self, key: u64, p: Parked) {
        self.parked_bytes += p.bytes.len() as u64;
        self.parked_order.insert(p.generation, key);
        self.parked.insert(key, p);
    }

    /// Switches the parked readers of `key` to `obj` (just created) and returns how many
    /// there were; readers whose file has changed since they opened are left on their
    /// bytes. Under the map lock, before the creating open replies (D3).
    fn convert_parked_readers(&mut self, key: u64, obj: &Obj) -> u32 {
        let Some(readers) = self.parked_readers.remove(&key) else {
            return 0;
        };
        let current = signature(obj.backing().file());
        let mut n = 0;
        for r in readers.iter().filter_map(Weak::upgrade) {
            if Some(r.sig) == current {
                *r.state.lock() = ReaderState::Object(obj.clone());
                n += 1;
            }
        }
        n
    }

    /// Removes the entry of `key` from the map and the LRU, and any parked copy with it.
    fn remove_entry(&mut self, key: u64, budget: &RamBudget) -> Option<Entry> {
        self.unpark(key, budget);
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
    budget: Arc<RamBudget>,
    /// Objects kept after their last close (`--object-cache`).
    closed_objects_max: usize,
}

/// An object pushed out of the LRU, on its way to being closed and parked.
struct Evicted {
    key: u64,
    obj: Obj,
    generation: u64,
    origin: Option<Parked>,
}

/// Files parked and their bytes, for status.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParkedTotals {
    pub files: u64,
    pub bytes: u64,
}

fn signature(f: &File) -> Option<Signature> {
    let st = sys::fstat(f.as_fd()).ok()?;
    Some((st.st_size, st.st_mtime, st.st_mtime_nsec))
}

impl Objects {
    /// `closed_objects_max`: objects kept after their last close (at least 1); see
    /// `CLOSED_OBJECTS_MAX`.
    pub fn new(base: ObjectConfig, closed_objects_max: usize) -> Self {
        let budget = base.budget.clone().unwrap_or_else(RamBudget::unlimited);
        Self {
            inner: Mutex::new(Inner::default()),
            created: Condvar::new(),
            base,
            budget,
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
        let dropped = Vec::new();
        let mut stale = Vec::new();
        let mut open = Some(open);
        loop {
            let (parked, generation) = {
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
                    // Closed, never parked: its bytes are the old content.
                    if let Some(e) = inner.remove_entry(key, &self.budget) {
                        stale.push(e.obj);
                    }
                }
                if inner.map.contains_key(&key) {
                    return self.finish_open(g, key, count_open, dropped, stale);
                }
                if inner.creating.contains(&key) {
                    self.created.wait(&mut g);
                    continue;
                }
                inner.creating.insert(key);
                (inner.unpark(key, &self.budget), inner.next_tick())
            };
            // Nobody else creates an object for `key` meanwhile (`creating`), and nobody can
            // be handed one before we insert ours.
            let created = match open.take() {
                Some(open) => open().and_then(|f| self.create(name, f, parked)),
                None => Err(FsError::Stale),
            };
            let mut g = self.inner.lock();
            g.creating.remove(&key);
            self.created.notify_all();
            let (obj, origin) = match created {
                Ok(o) => o,
                Err(e) => {
                    drop(g);
                    close_unparked(stale);
                    return Err(e);
                }
            };
            let inner = &mut *g;
            if inner.map.contains_key(&key) {
                // Not expected while creations are serialized; should an entry appear
                // anyway, ours was never used and is dropped without a flush.
                drop(g);
                obj.discard();
                continue;
            }
            // An older parked copy that appeared meanwhile (an eviction finishing late)
            // must not outlive the object that now exists.
            inner.unpark(key, &self.budget);
            let converted = inner.convert_parked_readers(key, &obj);
            // Converted readers are opens: an open object is never in the LRU.
            let tick = (converted == 0).then(|| inner.next_tick());
            if let Some(t) = tick {
                inner.lru.insert(t, key);
            }
            inner.map.insert(
                key,
                Entry {
                    obj,
                    opens: converted,
                    writers: 0,
                    tick,
                    closed_sig: None,
                    passthrough: None,
                    passthrough_opens: 0,
                    plain_readers: converted,
                    generation,
                    origin,
                },
            );
            return self.finish_open(g, key, count_open, dropped, stale);
        }
    }

    /// Counts the open of the existing entry `key`, evicts what no longer fits, then,
    /// with the map unlocked, closes what was dropped.
    fn finish_open(
        &self,
        mut g: parking_lot::MutexGuard<'_, Inner>,
        key: u64,
        count_open: Option<bool>,
        mut dropped: Vec<Evicted>,
        stale: Vec<Obj>,
    ) -> Result<Obj> {
        let inner = &mut *g;
        let r = Self::open_entry(inner, key, count_open);
        Self::evict_locked(inner, &mut dropped, self.closed_objects_max);
        drop(g);
        close_unparked(stale);
        self.close_all(dropped);
        r
    }

    /// Counts an open of the existing entry `key` (a writable one fails with ETXTBSY while
    /// the inode has passthrough opens), takes it out of the LRU and returns its object.
    fn open_entry(inner: &mut Inner, key: u64, count_open: Option<bool>) -> Result<Obj> {
        let Some(e) = inner.map.get_mut(&key) else {
            return Err(FsError::Stale);
        };
        if let Some(writable) = count_open {
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

    /// Builds the object over `file`, from its parked copy when that is still current;
    /// returns the copy too when it is small enough to keep (`KEEP_ORIGIN_BYTES_MAX`).
    fn create(
        &self,
        name: &str,
        file: File,
        parked: Option<Parked>,
    ) -> Result<(Obj, Option<Parked>)> {
        let cfg = ObjectConfig {
            name: format!("dhrd:{name}"),
            ..self.base.clone()
        };
        let current = parked.filter(|p| signature(&file) == Some(p.sig));
        let write_through = cfg.durability == Durability::Sync;
        let backing = ConfinedFile::new(file, name.to_owned(), write_through);
        Ok(match current {
            Some(p) => {
                let obj = HybridObject::open_with_bytes(backing, cfg, &p.bytes)?;
                let keep = p.bytes.len() as u64 <= KEEP_ORIGIN_BYTES_MAX;
                (obj, keep.then_some(p))
            }
            None => (HybridObject::open(backing, cfg)?, None),
        })
    }

    /// Counts one close. At the last close the object goes to the LRU, or is dropped when
    /// its file has no links left.
    /// The backing id is closed with the last passthrough open.
    pub fn release(&self, key: u64, kind: OpenKind) {
        let mut dropped = Vec::new();
        let mut gone = None;
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let mut unlinked = false;
            if let Some(e) = inner.map.get_mut(&key) {
                e.opens = e.opens.saturating_sub(1);
                match kind {
                    OpenKind::Writer => e.writers = e.writers.saturating_sub(1),
                    OpenKind::PlainReader => e.plain_readers = e.plain_readers.saturating_sub(1),
                    OpenKind::Passthrough => {
                        e.passthrough_opens = e.passthrough_opens.saturating_sub(1);
                        if e.passthrough_opens == 0 {
                            e.passthrough = None;
                        }
                    }
                    OpenKind::Undecided => {}
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
            Self::evict_locked(inner, &mut dropped, self.closed_objects_max);
            if unlinked {
                gone = inner.remove_entry(key, &self.budget).map(|e| e.obj);
            }
        }
        if let Some(o) = gone {
            o.discard();
        }
        self.close_all(dropped);
    }

    fn evict_locked(inner: &mut Inner, dropped: &mut Vec<Evicted>, keep: usize) {
        while inner.lru.len() > keep {
            let Some((_, key)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(e) = inner.map.remove(&key) {
                dropped.push(Evicted {
                    key,
                    obj: e.obj,
                    generation: e.generation,
                    origin: e.origin,
                });
            }
        }
    }

    /// The object of `key` if one exists (open or cached), without counting an open.
    pub fn get(&self, key: u64) -> Option<Obj> {
        self.inner.lock().map.get(&key).map(|e| e.obj.clone())
    }

    /// Drops the cached object (or parked copy) of a closed file, after unlink or
    /// rename-over removed a link. Open objects stay until their last release.
    /// Parked readers of the inode are detached: they keep their bytes, and a new file
    /// that reuses the inode number does not take them over.
    pub fn forget_if_closed(&self, key: u64) {
        let dropped = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.parked_readers.remove(&key);
            match inner.map.get(&key) {
                Some(e) if e.opens == 0 => inner.remove_entry(key, &self.budget).map(|e| e.obj),
                Some(_) => None,
                None => {
                    // Cheap to reload if other links remain; never stale.
                    inner.unpark(key, &self.budget);
                    None
                }
            }
        };
        if let Some(o) = dropped {
            // Unlinked (or renamed over) and closed: nothing can reach the data again, so
            // it is not flushed. A file that is still linked elsewhere is closed normally
            // (and not parked: the next open reloads it).
            if has_no_links(&o) {
                o.discard();
            } else {
                close_unparked(vec![o]);
            }
        }
    }

    /// Whether `key` has a parked copy and no object: worth checking the file's signature
    /// for `open_parked`.
    pub fn parked_only(&self, key: u64) -> bool {
        let g = self.inner.lock();
        g.parked.contains_key(&key) && !g.map.contains_key(&key) && !g.creating.contains(&key)
    }

    /// A read-only open of `key` served from its parked copy, if the inode has no object
    /// (nor one being created) and the copy matches the file's current signature `sig`
    /// (size and mtime). `None`: open it through `acquire`.
    pub fn open_parked(&self, key: u64, sig: (i64, i64, i64)) -> Option<Arc<ParkedReader>> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if inner.map.contains_key(&key) || inner.creating.contains(&key) {
            return None;
        }
        let p = inner.parked.get(&key).filter(|p| p.sig == sig)?;
        let r = Arc::new(ParkedReader {
            key,
            sig,
            state: Mutex::new(ReaderState::Bytes(p.bytes.clone())),
        });
        let list = inner.parked_readers.entry(key).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&r));
        Some(r)
    }

    /// Closes a parked reader: deregisters it, or, if it was converted, releases its open
    /// of the object.
    pub fn release_parked(&self, r: &ParkedReader) {
        let converted = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let state = r.state.lock().clone();
            match state {
                ReaderState::Object(_) => true,
                ReaderState::Bytes(_) => {
                    if let Some(list) = inner.parked_readers.get_mut(&r.key) {
                        list.retain(|w| !std::ptr::eq(w.as_ptr(), r));
                        if list.is_empty() {
                            inner.parked_readers.remove(&r.key);
                        }
                    }
                    false
                }
            }
        };
        if converted {
            self.release(r.key, OpenKind::PlainReader);
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
        make: impl FnOnce(&Obj) -> std::io::Result<fuser::BackingId>,
    ) -> std::io::Result<PassthroughChoice> {
        let mut g = self.inner.lock();
        let Some(e) = g.map.get_mut(&key) else {
            return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
        };
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

    pub fn parked_totals(&self) -> ParkedTotals {
        let g = self.inner.lock();
        ParkedTotals {
            files: g.parked.len() as u64,
            bytes: g.parked_bytes,
        }
    }

    /// Whether the closed LRU has room for preloading more files.
    pub fn has_room(&self) -> bool {
        self.inner.lock().lru.len() < self.closed_objects_max
    }

    /// Whether `key` has an object or a parked copy.
    pub fn is_known(&self, key: u64) -> bool {
        let g = self.inner.lock();
        g.map.contains_key(&key) || g.parked.contains_key(&key)
    }

    /// Parks the content of a closed file read by the preload walk: `file` is its
    /// backing file (inode `key`), at most `PARK_BYTES_MAX` long. `Ok(false)` when
    /// the RAM budget has no room (or the file grew), `Ok(true)` when parked or when the
    /// inode meanwhile got an object or a copy of its own.
    pub fn park_file(&self, key: u64, file: &File) -> Result<bool> {
        let before = signature(file).ok_or(FsError::Stale)?;
        let len = u64::try_from(before.0).map_err(|_| FsError::Stale)?;
        if len == 0 || len > PARK_BYTES_MAX {
            return Ok(false);
        }
        let reserved = parked_charge(len);
        // Never at the cost of other parked copies (`try_reserve` would reclaim them).
        if !self.budget.try_reserve_now(reserved) {
            return Ok(false);
        }
        // As the engine does before a load: read what the device holds, and leave no
        // page cache behind (RAM holds the copy).
        sys::drop_cache(file.as_fd());
        let mut bytes = vec![0u8; len as usize];
        let read = read_full_at(file, &mut bytes);
        sys::drop_cache(file.as_fd());
        let after = signature(file);
        if read.is_err() || after != Some(before) {
            self.budget.release(reserved);
            return read.map(|_| false);
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if inner.map.contains_key(&key) || inner.parked.contains_key(&key) {
            drop(g);
            self.budget.release(reserved);
            return Ok(true);
        }
        let generation = inner.next_tick();
        inner.insert_parked(
            key,
            Parked {
                sig: before,
                bytes: Arc::new(bytes),
                reserved_bytes: reserved,
                generation,
            },
        );
        Ok(true)
    }

    /// Flushes and drops every object and parked copy (unmount). Returns the first flush
    /// error.
    pub fn close_everything(&self) -> Result<()> {
        let all: Vec<Obj> = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.lru.clear();
            let keys: Vec<u64> = inner.parked.keys().copied().collect();
            for k in keys {
                inner.unpark(k, &self.budget);
            }
            inner.map.drain().map(|(_, e)| e.obj).collect()
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

    /// Closes objects pushed out of the LRU and parks the content of those that were
    /// fully loaded.
    fn close_all(&self, objs: Vec<Evicted>) {
        for Evicted {
            key,
            obj: o,
            generation,
            origin,
        } in objs
        {
            // Closing flushes in the non-sync modes; a failure leaves the object read-only
            // and the data in the backing as of the last successful flush, which is all we
            // can do for a file nobody has open. It is reported in the daemon's log.
            if let Err(e) = o.close() {
                log_close_failure(&o, &e);
                continue;
            }
            self.park(key, o, generation, origin);
        }
    }

    fn park(&self, key: u64, o: Obj, generation: u64, origin: Option<Parked>) {
        if o.len() > PARK_BYTES_MAX {
            return;
        }
        let Some(sig) = signature(o.backing().file()) else {
            return;
        };
        // Unmodified since it was made from `origin`: the same bytes, no copy needed.
        let bytes = match origin {
            Some(p) if !o.was_modified() && o.failure().is_none() => p.bytes,
            _ => match o.snapshot_bytes().filter(|b| !b.is_empty()) {
                Some(b) => Arc::new(b),
                None => return,
            },
        };
        // The object's own reservation goes with it (chunk-sized), before the copy's
        // (byte-sized) is taken, so a budget near its limit can still park.
        drop(o);
        let len = bytes.len() as u64;
        let reserved = parked_charge(len);
        if !self.budget.try_reserve_now(reserved) {
            return;
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let newer = inner.map.contains_key(&key)
            || inner
                .parked
                .get(&key)
                .is_some_and(|p| p.generation > generation);
        if newer {
            drop(g);
            self.budget.release(reserved);
            return;
        }
        inner.unpark(key, &self.budget);
        inner.insert_parked(
            key,
            Parked {
                sig,
                bytes,
                reserved_bytes: reserved,
                generation,
            },
        );
    }

    /// Drops parked copies, oldest first, until `bytes` of budget were released (the RAM
    /// budget's reclaimer: a file being loaded matters more than a closed file's copy,
    /// which the backing still holds). Returns the bytes released.
    pub fn reclaim_parked(&self, bytes: u64) -> u64 {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let mut released = 0;
        while released < bytes {
            let Some((_, key)) = inner.parked_order.pop_first() else {
                break;
            };
            if let Some(p) = inner.parked.remove(&key) {
                inner.parked_bytes -= p.bytes.len() as u64;
                self.budget.release(p.reserved_bytes);
                released += p.reserved_bytes;
            }
        }
        released
    }
}

fn close_unparked(objs: Vec<Obj>) {
    for o in objs {
        if let Err(e) = o.close() {
            log_close_failure(&o, &e);
        }
    }
}

fn log_close_failure(o: &Obj, e: &dhrd_engine::Error) {
    eprintln!(
        "dhrd: flushing {} on eviction failed: {e}",
        o.backing().describe()
    );
}

/// Reads `buf.len()` bytes from offset 0.
fn read_full_at(f: &File, buf: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, 0)?;
    Ok(())
}

/// Whether the object's backing file has no name left (unlinked or renamed over). An
/// unreadable status counts as linked, so the object is flushed rather than discarded.
fn has_no_links(o: &Obj) -> bool {
    sys::fstat(o.backing().file().as_fd())
        .map(|s| s.st_nlink == 0)
        .unwrap_or(false)
}
