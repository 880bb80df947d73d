//! The page-cache data path (the default): the RAM tier is the kernel's page cache of the
//! backing files themselves, and the kernel serves reads and writes of every open regular
//! file from it through FUSE passthrough, without a daemon round trip.
//!
//! How each open is served:
//! - Every open of a regular file carries the inode's backing id (FOPEN_PASSTHROUGH; the
//!   kernel wants one per inode, shared by all its opens, fs/fuse/iomode.c). The kernel
//!   opens the backing file with the application's own flags and reads and writes it.
//! - `sync` durability: the backing inode carries `FS_SYNC_FL` (`dhrd_pagecache`), so
//!   the backing file system makes every write synchronous (`IS_SYNC`), also those the
//!   kernel makes for an application through passthrough. A write returns once its data
//!   is on the device; nothing of it ever sits dirty in the page cache.
//! - O_DIRECT opens, writable opens of a set-id file (the kernel leaves dropping set-id
//!   bits on a write to the daemon, which passthrough writes never reach; killpriv.rs),
//!   and writable opens of a file whose flag could not be set in `sync` mode, are served
//!   by the daemon (FOPEN_DIRECT_IO on top of the backing id): reads are
//!   `pread` of the same page cache (O_DIRECT through passthrough would read the disk and
//!   drop cached pages), writes `pwritev2` with RWF_DSYNC in `sync` mode, through a
//!   description of the open's own (`PageOpen::write_file`), never the one syncs ask. The kernel lets
//!   such writes of one file run in parallel (FOPEN_PARALLEL_DIRECT_WRITES), unlike
//!   passthrough writes, which it serializes on the inode lock. mmap of such an open still
//!   maps the backing file (the backing id), so every mapping shares the one page cache.
//!
//! Invariants:
//! - One registration (`Reg`: backing descriptor and backing id) per backing inode while
//!   any open of it exists; created by the first open. After the last release it lingers
//!   (at most `LINGER_MAX` of them, oldest dropped first), so that the next open of the
//!   inode reuses its descriptor and backing id: open, append, close, open, read, close
//!   (mail spools, build caches, the fileserver workload) then costs the backing no open,
//!   registration, flag check or close per open. A lingering registration goes as soon as
//!   its inode loses its last name (`unlinked`), so it never keeps a deleted file's space;
//!   a first open that races the unlink looks at the link count once its registration is
//!   in, since the unlink may have come before it and found nothing to mark.
//! - A registration that was ever opened for writing is not closed when dropped past the
//!   kept ones: its descriptor goes to `Failures::keep` (durable/kept.rs) before the
//!   table's lock is released, so a writeback error unseen on it is still asked by the
//!   next sync of the inode. An unlink of the last name lets the kept ones go.
//! - D3 by construction: every read and write of every open, by the kernel or the daemon,
//!   goes through the backing file's one page cache.
//! - The sync flag set by dhrd is marked with the `trusted.dhrd.sync` xattr, so a mount in
//!   `fsync` or `periodic:N` mode clears it again (and only it: a flag an administrator
//!   set stays). The xattr is hidden from the mount's xattr calls.
//!
//! Crash semantics: `sync` mode: a write that returned is on the device (the file system's
//! synchronous write path); a failing write returns EIO to the application from the
//! backing file system directly. Other modes: like the backing file system's own buffered
//! writes (a write the daemon serves keeps the open's O_DSYNC / O_SYNC and the write's
//! RWF_DSYNC / RWF_SYNC, `kernel::WriteSync`); `fsync` of a file runs `fdatasync`/`fsync` of its backing file, whatever this
//! daemon instance wrote (a previous instance may have left dirty pages), and unmount runs
//! `syncfs`.
//! A sync of a backing file (or of the backing) that failed is sticky (failures.rs): every
//! later fsync of that file through any open fails with EIO, and the daemon takes no more
//! changes of it; passthrough writes of opens made before go on reaching the page cache,
//! and their fsyncs fail. The kernel reports a writeback error once per open file
//! description, and a write that syncs itself (RWF_DSYNC, O_DSYNC, the sync flag) takes
//! it on the description it writes through: the kernel's own per passthrough open, the
//! open's `write_file` for a daemon-served one. Neither is the registration's descriptor,
//! which every sync of the inode asks, so the next sync still sees the error and records
//! it, whatever errno the write returned.

mod opener;

pub use opener::BackingOpener;

use crate::config::COPY_STEP_BYTES;
use crate::durable::failures::Failures;
use crate::error::{FsError, Result};
use crate::kernel::{OpenReply, ReplyFlags, WriteSync};
use crate::killpriv::Caller;
use dhrd_pagecache as pagecache;
use dhrd_pagecache::reaper::Reaper;
use dhrd_pagecache::resident::Resident;

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Registrations kept after their inode's last close, at most (see the module header).
pub const LINGER_MAX: usize = 1024;

/// The xattr marking a sync flag dhrd set (and may therefore clear).
pub use dhrd_pagecache::SYNC_MARK_XATTR;
/// Xattr names of the daemon's own, never shown through the mount.
pub const PRIVATE_XATTR_PREFIX: &str = "trusted.dhrd.";

/// How the kernel reaches one open's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Kernel passthrough of reads and writes to the backing file.
    Passthrough,
    /// Reads and writes through the daemon (from the same page cache); mmap passed through.
    Daemon,
}

/// One open regular file.
#[derive(Clone)]
pub struct PageOpen {
    /// The registration's descriptor: reads, syncs, and the backing id.
    pub file: Arc<File>,
    /// A daemon-served writable open: the description its writes go through, its own
    /// (`sys::reopen`). A write that syncs itself takes the file's writeback error on
    /// the description it writes through, and the kernel reports an error once per
    /// description; on `file` the error is left for the next sync of the inode, which
    /// then records it, whatever the write's error said (an ENOSPC of the write itself
    /// changes nothing, C5; one of its sync lost pages, C4).
    write_file: Option<Arc<File>>,
    pub service: Service,
    pub writable: bool,
    /// A writable passthrough open: who opened it (`Reg::passthrough_writers`).
    pub passthrough_writer: Option<Caller>,
}

impl PageOpen {
    /// What the daemon writes this open's data through (see `write_file`).
    fn write_file(&self) -> &File {
        self.write_file.as_deref().unwrap_or(&self.file)
    }
}

/// Counters of the page-cache path.
#[derive(Default)]
pub struct PageStats {
    pub sync_flags_set: AtomicU64,
    pub sync_flags_cleared: AtomicU64,
    pub sync_flag_failures: AtomicU64,
    pub registration_failures: AtomicU64,
}

struct Reg<B> {
    file: Arc<File>,
    id: Option<Arc<B>>,
    opens: u32,
    writers: u32,
    /// `sync` mode: the inode has FS_SYNC_FL, so passthrough writes are durable.
    sync_ok: bool,
    /// The inode lost its last name while open: dropped at its last close, not kept.
    unlinked: bool,
    /// When it last became idle (a stamp of `Regs::idle`), to tell a stale queue entry
    /// from the current one.
    idle_stamp: u64,
    /// It was opened for writing: when dropped, its descriptor is kept until asked for
    /// its writeback error (`Failures::keep`), which a later open's would not report.
    written: bool,
    /// Who holds each writable passthrough open: their writes never reach the daemon, so
    /// a set-id bit they would drop is not given while they hold it
    /// (`with_passthrough_writers`).
    passthrough_writers: Vec<Caller>,
}

/// Registrations by backing inode number, and the idle ones in the order they became
/// idle.
struct Regs<B> {
    map: HashMap<u64, Reg<B>>,
    idle: VecDeque<(u64, u64)>,
    next_stamp: u64,
    /// Idle registrations kept at most (`LINGER_MAX` unless the descriptor limit is low).
    linger_max: usize,
}

impl<B> Regs<B> {
    /// Takes idle registrations past `linger_max` out of the table, oldest first; the
    /// caller drops them once the table's lock is released: dropping one closes its
    /// descriptor and backing id (two system calls), and every open and close of the
    /// mount waits for the lock meanwhile (measured: one `sched_yield` of a spinning
    /// worker per open of a stream of files past the kept ones).
    #[must_use]
    fn trim(&mut self) -> Vec<(u64, Reg<B>)> {
        let mut gone = Vec::new();
        while self.idle.len() > self.linger_max {
            let Some((key, stamp)) = self.idle.pop_front() else {
                break;
            };
            if self
                .map
                .get(&key)
                .is_some_and(|r| r.opens == 0 && r.idle_stamp == stamp)
            {
                gone.extend(self.map.remove(&key).map(|r| (key, r)));
            }
        }
        gone
    }
}

/// What the first open of an inode learnt of it.
#[derive(Clone, Copy)]
struct FirstOpen {
    /// Its mode (for the set-id rule), whether it was just created (nothing to warm),
    /// and its size when it was opened (for the warm-up).
    known: (u32, bool, u64),
    /// This open made the registration (it may race an unlink, see `opened`).
    inserted: bool,
}

/// Where an open's backing file comes from when its inode has no registration.
pub struct Opened {
    pub file: File,
    /// The inode's `st_mode` when it was opened.
    pub mode: u32,
    /// The inode was created by this request: it has no flag or mark of a previous mount,
    /// and its size is 0.
    pub fresh: bool,
    /// Its `st_size` when it was opened (a hint for the warm-up, which sizes the file
    /// again when it reads it).
    pub size: u64,
}

/// The page-cache path's state. `B` is the kernel's backing-id token (`kernel::BackingId`;
/// tests use a plain number).
pub struct PageTier<B = crate::kernel::BackingId> {
    sync_mode: bool,
    regs: Mutex<Regs<B>>,
    resident: Resident,
    stats: PageStats,
    /// The first failure of the backing the daemon saw itself (an fsync, a write it
    /// served, a truncate): passthrough writes report theirs to the application only.
    failure: Mutex<Option<String>>,
    /// Drops what held a deleted file (its registration, the last open's descriptor) off
    /// the request threads: with the sync flag, freeing the inode is a journal commit.
    reaper: Reaper,
    /// Sticky sync failures, and the descriptors of dropped registrations kept there.
    failures: Arc<Failures>,
    /// The backing file system (inodes are `(dev, key)` there).
    dev: u64,
}

/// Where the page cache path records and keeps: the mount's failures and its backing
/// file system (`PageTier::new`).
pub struct Backing {
    pub failures: Arc<Failures>,
    pub dev: u64,
}

impl<B: Send + Sync + 'static> PageTier<B> {
    pub fn new(
        sync_mode: bool,
        resident: Resident,
        linger_max: usize,
        reaper: Reaper,
        backing: Backing,
    ) -> Self {
        Self {
            sync_mode,
            regs: Mutex::new(Regs {
                map: HashMap::new(),
                idle: VecDeque::new(),
                next_stamp: 0,
                linger_max,
            }),
            resident,
            stats: PageStats::default(),
            failure: Mutex::new(None),
            reaper,
            failures: backing.failures,
            dev: backing.dev,
        }
    }

    /// The warm-up and pinning of the files (dhrd_pagecache).
    pub fn resident(&self) -> &Resident {
        &self.resident
    }

    pub fn stats(&self) -> &PageStats {
        &self.stats
    }

    /// Records a failure of the backing seen by the daemon (the first one is kept); ENOSPC
    /// and EDQUOT fail only their request and are not recorded (C5).
    pub fn record_failure(&self, what: &str, e: &FsError) {
        if matches!(e.errno(), libc::ENOSPC | libc::EDQUOT | libc::EINTR) {
            return;
        }
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(format!("{what}: {e}"));
        }
    }

    /// Why the backing cannot take writes, if it cannot: a failure the daemon saw, or a
    /// probe of the backing file system now (read-only, or failing fsync as a shut down
    /// or dead disk does). A failure found is kept (sticky, C4). Applications learn of it
    /// from their own writes' errors; this is for status.
    pub fn health(&self, root: BorrowedFd<'_>) -> Option<String> {
        if let Some(f) = self.failure.lock().clone() {
            return Some(f);
        }
        let verdict = match rustix::fs::fstatvfs(root) {
            Ok(s) if s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) => {
                Some("the backing file system is mounted read-only".to_string())
            }
            // fsync of the root directory: nothing to write on a healthy file system (a
            // cache flush at most); EIO on one that was shut down or lost its disk.
            _ => rustix::fs::fsync(root)
                .err()
                .map(|e| format!("the backing file system fails: {}", io::Error::from(e))),
        };
        if let Some(v) = &verdict {
            self.failure.lock().get_or_insert_with(|| v.clone());
        }
        verdict
    }

    /// Opens one regular file: `open_file` opens its backing file (read-write where
    /// possible) if its inode has no registration, `register` makes the backing id.
    /// `writer`: the caller, for an open that may write.
    pub fn open(
        &self,
        key: u64,
        open_flags: i32,
        writer: Option<Caller>,
        open_file: impl FnOnce() -> Result<Opened>,
        register: impl FnOnce(BorrowedFd<'_>) -> io::Result<B>,
    ) -> Result<(PageOpen, OpenReply<B>)> {
        let writable = writer.is_some();
        let (mut regs, first) = self.registered(key, open_file)?;
        let known = first.map(|f| f.known);
        let inserted = first.is_some_and(|f| f.inserted);
        let Some(reg) = regs.map.get_mut(&key) else {
            return Err(FsError::Stale);
        };
        if reg.id.is_none() {
            match register(reg.file.as_fd()) {
                Ok(id) => reg.id = Some(Arc::new(id)),
                Err(e) => {
                    // Served by the daemon instead: correct, only slower.
                    self.stats
                        .registration_failures
                        .fetch_add(1, Ordering::Relaxed);
                    eprintln!("dhrd: passthrough registration failed ({e}); reads and writes of this file go through the daemon");
                }
            }
        }
        // A writer of a set-id file goes through the daemon: the kernel leaves dropping
        // the bits to a KILLPRIV_V2 server, and passthrough writes never reach it. The
        // mode is read under the table's lock (a chmod adding a bit takes it too, see
        // `with_passthrough_writers`), except for a file this request created, which
        // nobody else can reach yet; without timestamps: a stat that returns ctime would
        // make the next write store a fine-grained one (sys::mode_owner).
        let setid = writable
            && match known {
                Some((mode, true, _)) => mode,
                _ => crate::sys::mode_owner(reg.file.as_fd()).map_or(0, |m| m.mode),
            } & (libc::S_ISUID | libc::S_ISGID)
                != 0;
        let by_daemon = open_flags & libc::O_DIRECT != 0
            || (writable && self.sync_mode && !reg.sync_ok)
            || setid
            || reg.id.is_none();
        reg.opens += 1;
        if writable {
            reg.writers += 1;
            reg.written = true;
        }
        debug_assert!(reg.writers <= reg.opens, "more writers than opens of {key}");
        let passthrough_writer = writer.filter(|_| !by_daemon && reg.id.is_some());
        if let Some(c) = passthrough_writer {
            reg.passthrough_writers.push(c);
        }
        let daemon_flags = ReplyFlags::DIRECT_IO | ReplyFlags::PARALLEL_DIRECT_WRITES;
        let (service, reply) = match (&reg.id, by_daemon) {
            (Some(id), false) => (
                Service::Passthrough,
                OpenReply::Passthrough(ReplyFlags::empty(), id.clone()),
            ),
            (Some(id), true) => (
                Service::Daemon,
                OpenReply::Passthrough(daemon_flags, id.clone()),
            ),
            (None, _) => (Service::Daemon, OpenReply::Plain(daemon_flags)),
        };
        let file = reg.file.clone();
        drop(regs);
        let mut open = PageOpen {
            file,
            write_file: None,
            service,
            writable,
            passthrough_writer,
        };
        if service == Service::Daemon && writable {
            match crate::sys::reopen(open.file.as_fd()) {
                Ok(f) => open.write_file = Some(Arc::new(f)),
                Err(e) => {
                    self.release(key, open);
                    return Err(FsError::io("reopen of the backing file for writes", e));
                }
            }
        }
        self.opened(key, &open.file, inserted, known);
        Ok((open, reply))
    }

    /// The registration table, locked, with inode `key` registered unless it lost its
    /// name meanwhile; and what the first open learnt, when this open was one. The backing
    /// file is opened and its flag settled outside the lock; a racing first open does the
    /// same, and the one that inserts first wins.
    fn registered(
        &self,
        key: u64,
        open_file: impl FnOnce() -> Result<Opened>,
    ) -> Result<(parking_lot::MutexGuard<'_, Regs<B>>, Option<FirstOpen>)> {
        let regs = self.regs.lock();
        if regs.map.contains_key(&key) {
            return Ok((regs, None));
        }
        drop(regs);
        let o = open_file()?;
        let sync_ok = self.settle_sync_flag(o.file.as_fd(), o.fresh);
        let mut regs = self.regs.lock();
        let mut inserted = false;
        if let std::collections::hash_map::Entry::Vacant(v) = regs.map.entry(key) {
            v.insert(Reg {
                file: Arc::new(o.file),
                id: None,
                opens: 0,
                writers: 0,
                sync_ok,
                unlinked: false,
                written: false,
                idle_stamp: 0,
                passthrough_writers: Vec::new(),
            });
            inserted = true;
        }
        let first = FirstOpen {
            known: (o.mode, o.fresh, o.size),
            inserted,
        };
        Ok((regs, Some(first)))
    }

    /// After an open of inode `key` (backing `file`) is counted: the warm-up hears of it,
    /// unless the inode has no name any more. `inserted`, `known`: see `FirstOpen`.
    fn opened(&self, key: u64, file: &Arc<File>, inserted: bool, known: Option<(u32, bool, u64)>) {
        match known {
            // A file this request created is its own, under the parent's lock, and empty.
            Some((_, true, _)) => self.resident.demand_sized(key, file, 0),
            // The file opened by this request may have lost its last name before its
            // registration went in; the unlink then found none to mark. The warm-up's
            // entry goes in first, then one look at the link count covers both: an
            // unlink from here on finds the registration and the entry.
            Some((_, false, size)) if inserted => {
                self.resident.demand_unchecked(key, file, size);
                if pagecache::link_count(file.as_fd()).is_ok_and(|n| n == 0) {
                    if let Some(reg) = self.regs.lock().map.get_mut(&key) {
                        if Arc::ptr_eq(&reg.file, file) {
                            reg.unlinked = true;
                        }
                    }
                    self.resident.forget(key);
                }
            }
            // A file already known to the warm-up is skipped there.
            _ => self.resident.demand(key, file),
        }
    }

    /// Counts one close. The last one leaves the registration idle (kept, see the module
    /// header) or drops it if its inode has no name any more. A writer's last close lets
    /// the warm-up pick up a changed size.
    pub fn release(&self, key: u64, open: PageOpen) {
        let mut regs = self.regs.lock();
        // A registration with opens is never dropped (`trim` and `unlinked` take idle
        // ones only), so the open being released finds its own.
        debug_assert!(
            regs.map.contains_key(&key),
            "release of {key} without a registration"
        );
        let Some(reg) = regs.map.get_mut(&key) else {
            return;
        };
        // D3: one registration, one backing file (one page cache) per inode while open.
        debug_assert!(
            Arc::ptr_eq(&reg.file, &open.file),
            "an open of {key} outside its registration's file"
        );
        debug_assert!(reg.opens > 0, "release of {key} with no open counted");
        reg.opens = reg.opens.saturating_sub(1);
        if let Some(c) = &open.passthrough_writer {
            let i = reg.passthrough_writers.iter().position(|w| w == c);
            debug_assert!(
                i.is_some(),
                "a passthrough writer of {key} was not recorded"
            );
            if let Some(i) = i {
                reg.passthrough_writers.swap_remove(i);
            }
        }
        let mut refresh = false;
        if open.writable {
            debug_assert!(
                reg.writers > 0,
                "release of a writer of {key} never counted"
            );
            reg.writers = reg.writers.saturating_sub(1);
            refresh = reg.writers == 0 && !reg.unlinked;
        }
        let mut gone = None;
        let mut trimmed = Vec::new();
        if reg.opens == 0 {
            if reg.unlinked {
                gone = regs.map.remove(&key);
            } else {
                let stamp = regs.next_stamp;
                regs.next_stamp += 1;
                if let Some(r) = regs.map.get_mut(&key) {
                    r.idle_stamp = stamp;
                }
                regs.idle.push_back((key, stamp));
                trimmed = regs.trim();
                debug_assert!(
                    regs.idle.len() <= regs.linger_max,
                    "idle registrations over bound"
                );
            }
        }
        // Kept before the table's lock goes: a new registration of the inode, and its
        // syncs, can only come after, and find it.
        let evicted = self.keep_written(&trimmed);
        drop(regs);
        drop(trimmed);
        for e in evicted {
            let failures = self.failures.clone();
            self.reaper.run_later(move || failures.check_evicted(e));
        }
        if let Some(reg) = gone {
            // The file's last name and last open are gone: whichever of these goes last
            // frees the inode.
            self.reaper.drop_later((reg, open));
            return;
        }
        if refresh {
            // One statx of what the decision needs; a file whose last name went meanwhile
            // (nlink 0) has nothing to warm.
            if let Ok((size, nlink)) = size_and_links(open.file.as_fd()) {
                if nlink > 0 {
                    self.resident.refresh_sized(key, &open.file, size);
                }
            }
        }
    }

    /// Keeps the descriptors of the dropped registrations `gone` that were opened for
    /// writing (`Reg::written`); returns those past the bound, to be checked.
    fn keep_written(
        &self,
        gone: &[(u64, Reg<B>)],
    ) -> Vec<crate::durable::kept::Evicted<Arc<File>>> {
        gone.iter()
            .filter(|(_, r)| r.written)
            .filter_map(|(key, r)| self.failures.keep((self.dev, *key), r.file.clone()))
            .collect()
    }

    /// Descriptors of dropped registrations kept now (`Failures::keep`; status).
    pub fn kept_files(&self) -> usize {
        self.failures.kept_len()
    }

    /// Inode `key` lost its last name: an idle registration is dropped now, an open one at
    /// its last close, and the warm-up forgets the file. Descriptors kept of it go too:
    /// nothing can open it again to ask, and they would keep its space.
    pub fn unlinked(&self, key: u64) {
        if self.still_named(key) {
            return;
        }
        let mut regs = self.regs.lock();
        let mut gone = None;
        if let Some(reg) = regs.map.get_mut(&key) {
            if reg.opens == 0 {
                gone = regs.map.remove(&key);
            } else {
                reg.unlinked = true;
            }
        }
        drop(regs);
        let kept = self.failures.forget_kept((self.dev, key));
        let gone = (gone.is_some() || !kept.is_empty()).then_some((gone, kept));
        // The registration goes to the reaper with the warm-up's pin, in one handoff.
        self.resident.forget_with(key, gone);
    }

    /// Whether inode `key`, said to have lost its last name, has one after all. The caller
    /// judged from a link count read before its unlink, and a link made meanwhile (another
    /// request, or a program outside the mount) leaves the file a name: dropping its
    /// descriptors then would leave a writeback error unasked. A descriptor held of the
    /// inode (its registration's or a kept one) tells for certain, and a count of 0 is
    /// final: a file whose last name went can never be linked again (only an O_TMPFILE
    /// file can). With no descriptor held there is nothing to lose but the warm-up's pin.
    fn still_named(&self, key: u64) -> bool {
        let held = self
            .held_file(key)
            .or_else(|| self.failures.kept_of((self.dev, key)));
        held.is_some_and(|f| pagecache::link_count(f.as_fd()).is_ok_and(|n| n > 0))
    }

    /// Runs `f` with the callers holding writable passthrough opens of inode `key` (none
    /// if it has no registration), under the table's lock: no open can be passed through
    /// for writing meanwhile. For a chmod that adds a set-id bit (`Files::chmod_file`).
    pub fn with_passthrough_writers<R>(&self, key: u64, f: impl FnOnce(&[Caller]) -> R) -> R {
        let regs = self.regs.lock();
        let writers = regs
            .map
            .get(&key)
            .map_or(&[][..], |r| r.passthrough_writers.as_slice());
        f(writers)
    }

    /// The backing file of an open inode, if any open of it exists.
    pub fn open_file(&self, key: u64) -> Option<Arc<File>> {
        self.regs
            .lock()
            .map
            .get(&key)
            .filter(|r| r.opens > 0)
            .map(|r| r.file.clone())
    }

    /// The backing file of inode `key` if the tier holds it open (an open file or an idle
    /// registration): for requests that only need a descriptor of the inode.
    pub fn held_file(&self, key: u64) -> Option<Arc<File>> {
        self.regs.lock().map.get(&key).map(|r| r.file.clone())
    }

    /// Inodes with open files right now.
    pub fn open_inodes(&self) -> usize {
        self.regs
            .lock()
            .map
            .values()
            .filter(|r| r.opens > 0)
            .count()
    }

    /// Backing files of every open inode (for flushes and status).
    pub fn open_files(&self) -> Vec<Arc<File>> {
        self.regs
            .lock()
            .map
            .values()
            .filter(|r| r.opens > 0)
            .map(|r| r.file.clone())
            .collect()
    }

    /// Makes the inode's sync flag match the durability mode; returns whether writes to it
    /// are synchronous (`sync` mode) or need nothing (other modes: always true). A `fresh`
    /// inode (created by this request) cannot carry a mark of ours, so outside `sync`
    /// mode there is nothing to look at.
    fn settle_sync_flag(&self, fd: BorrowedFd<'_>, fresh: bool) -> bool {
        let s = &self.stats;
        if fresh && !self.sync_mode {
            return true;
        }
        if self.sync_mode {
            match pagecache::sync_flag(fd) {
                Ok(true) => true,
                Ok(false) => {
                    // The mark first, the flag second: once the flag is set, the backing
                    // file system makes every change of the inode synchronous, and an
                    // xattr written after it cost a journal commit of its own in the
                    // worker (2 ms per create on a journalled ext4), outside the group
                    // commit. Best effort: without the mark an fsync-mode mount leaves
                    // the flag (slower, never less durable); a mark without the flag (a
                    // crash in between, or a refused flag) changes nothing.
                    let marked = rustix::fs::fsetxattr(
                        fd,
                        SYNC_MARK_XATTR,
                        b"1",
                        rustix::fs::XattrFlags::empty(),
                    )
                    .is_ok();
                    match pagecache::set_sync_flag(fd, true) {
                        Ok(_) => {
                            s.sync_flags_set.fetch_add(1, Ordering::Relaxed);
                            true
                        }
                        Err(_) => {
                            if marked {
                                let _ = rustix::fs::fremovexattr(fd, SYNC_MARK_XATTR);
                            }
                            s.sync_flag_failures.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                }
                Err(_) => {
                    s.sync_flag_failures.fetch_add(1, Ordering::Relaxed);
                    false
                }
            }
        } else {
            if pagecache::sync_flag(fd).unwrap_or(false) {
                let mut v = [0u8; 1];
                let ours = rustix::fs::fgetxattr(fd, SYNC_MARK_XATTR, &mut v).is_ok();
                if ours && pagecache::set_sync_flag(fd, false).is_ok() {
                    let _ = rustix::fs::fremovexattr(fd, SYNC_MARK_XATTR);
                    s.sync_flags_cleared.fetch_add(1, Ordering::Relaxed);
                }
            }
            true
        }
    }

    /// A read served by the daemon: from the page cache of the backing file.
    pub fn read(&self, open: &PageOpen, offset: u64, size: u32) -> Result<Vec<u8>> {
        let len = open.file.metadata()?.len();
        let want = u64::from(size).min(len.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match open.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::io("read of the backing file", e)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// A write served by the daemon: durable on return in `sync` mode (RWF_DSYNC, whether
    /// or not the inode has the sync flag) and whenever the open or the write asks for it
    /// (`ws`: RWF_DSYNC for O_DSYNC, RWF_SYNC for O_SYNC), in every mode.
    pub fn write(&self, open: &PageOpen, offset: u64, data: &[u8], ws: WriteSync) -> Result<u32> {
        let flags = self.write_flags(ws);
        let mut done = 0;
        while done < data.len() {
            let iov = [io::IoSlice::new(&data[done..])];
            match rustix::io::pwritev2(open.write_file(), &iov, offset + done as u64, flags) {
                Ok(0) => return Err(FsError::Errno(libc::EIO)),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(done as u32)
    }

    /// What a daemon-served write asks of the backing for `ws` (see `write`).
    fn write_flags(&self, ws: WriteSync) -> rustix::io::ReadWriteFlags {
        use rustix::io::ReadWriteFlags as F;
        match ws {
            WriteSync::File => F::SYNC,
            WriteSync::Data => F::DSYNC,
            WriteSync::Mode if self.sync_mode => F::DSYNC,
            WriteSync::Mode => F::empty(),
        }
    }

    /// Whether a daemon-served write (or copy) for `ws` syncs what it wrote, and so may
    /// take the backing file's writeback error (failures.rs).
    pub fn syncs_itself(&self, ws: WriteSync) -> bool {
        !self.write_flags(ws).is_empty()
    }

    /// COPY_FILE_RANGE between two opens of this path: read and write through the page
    /// cache in steps of `COPY_STEP_BYTES`; in `sync` mode, and for a destination opened
    /// O_DSYNC or O_SYNC (`ws`), each step is durable before the next (a crash leaves a
    /// copied prefix, as during `cp`). Returns the bytes copied; a failure after some
    /// bytes were copied returns the short count.
    pub fn copy(
        &self,
        src: &PageOpen,
        offset_in: u64,
        dst: &PageOpen,
        offset_out: u64,
        want: u64,
        ws: WriteSync,
    ) -> Result<u64> {
        let mut buf = vec![0u8; want.min(COPY_STEP_BYTES) as usize];
        let mut done = 0u64;
        while done < want {
            let n = (want - done).min(buf.len() as u64) as usize;
            let step = src
                .file
                .read_at(&mut buf[..n], offset_in + done)
                .map_err(FsError::from)
                .and_then(|got| {
                    if got == 0 {
                        return Ok(0);
                    }
                    self.write(dst, offset_out + done, &buf[..got], ws)
                        .map(|_| got)
                });
            match step {
                Ok(0) => break,
                Ok(got) => {
                    done += got as u64;
                    if got < n {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    pub fn sync_mode(&self) -> bool {
        self.sync_mode
    }
}

/// Size and link count of an open file, in one `statx` that asks for nothing else (no
/// timestamps: see `sys::mode_owner`).
fn size_and_links(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let x = statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::SIZE | StatxFlags::NLINK,
    )?;
    Ok((x.stx_size, u64::from(x.stx_nlink)))
}

#[cfg(test)]
mod tests;
