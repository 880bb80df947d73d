//! File data: which data path (`Tier`) serves the mount, the table of open files, and the
//! data requests (open, create, read, write, fsync, lseek, fallocate, copy_file_range,
//! truncate, release), each dispatched to the page cache path (`page_tier.rs`) or the
//! engine path (`engine_tier.rs`).
//!
//! Why two paths: the page cache path is the default and serves reads and writes in the
//! kernel; it needs FUSE passthrough (kernel >= 6.9) and, in `sync` mode, a backing file
//! system that keeps the sync flag. Where either is missing the mount runs on the engine
//! (a RAM copy per file in a memfd, every write through the daemon), and says so. The
//! engine paths also stay selectable (`--read-path engine-*`) for the paper's comparison.
//!
//! Invariants:
//! - The tier is chosen once at INIT and never changes while mounted.
//! - Every handle belongs to the tier of the mount; a handle holds what its requests need
//!   (the backing file, or the engine object) so a request never takes the handle table's
//!   lock across I/O.
//! - Set-id bits a data change must drop are dropped before the change (killpriv.rs).
//!
//! Crash semantics: those of the tier (see `page_tier.rs`, `engine_tier.rs` and
//! docs/crash-model.md); this module adds none.

use crate::config::{ReadPath, COPY_REQUEST_BYTES_MAX};
use crate::durable::commit::SyncSet;
use crate::engine::objects::{Obj, OpenKind};
use crate::engine::EngineTier;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, OpenReply, Register, ReplyFlags, SetAttr, SetTime, WriteSync};
use crate::kernel::{Fh, Ino};
use crate::killpriv::{Caller, Fsetid};
use crate::mount::walk::BackingOpener;
use crate::mount::Shared;
use crate::page::{Opened, PageOpen, PageTier, Service};
use crate::sys;
use dhrd_pagecache::reaper::{Reaper, REAPER_THREADS};
use dhrd_pagecache::resident::{Resident, ResidentConfig};
use std::ffi::OsStr;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The data path of the mount.
pub enum Tier {
    Page(PageTier),
    Engine(EngineTier),
}

/// One open file.
pub struct Handle {
    pub key: u64,
    pub data: HandleData,
    /// What the open's flags (O_DSYNC, O_SYNC) ask of every change made through it.
    pub sync: WriteSync,
}

/// What a handle's requests use.
#[derive(Clone)]
pub enum HandleData {
    Page(PageOpen),
    Engine { obj: Obj, kind: OpenKind },
}

impl Shared {
    /// Chooses the data path once the kernel's INIT said what it offers. Err: the mount
    /// asked for the page cache (`--read-path pagecache`) and cannot have it.
    pub(crate) fn choose_tier(self: &Arc<Self>) -> std::result::Result<(), String> {
        let wanted = self.cfg.read_path;
        let engine_path = match wanted {
            ReadPath::Auto | ReadPath::PageCache => {
                let why = if !self.passthrough_negotiated.load(Ordering::Acquire) {
                    Some("this kernel offers no FUSE passthrough (needs Linux >= 6.9)".to_string())
                } else {
                    self.sync_flag_probe.clone().err()
                };
                match why {
                    None => {
                        // Deleted files are let go off the request threads (reaper.rs):
                        // with the sync flag, freeing one is a journal commit.
                        let reaper = Reaper::new(REAPER_THREADS, "dhrd-reap")
                            .map_err(|e| format!("starting the reaper threads: {e}"))?;
                        let resident = Resident::new(
                            ResidentConfig {
                                threads: self.cfg.loader_threads,
                                pin: self.cfg.pin,
                                rate_bytes_per_s: self.cfg.load_rate,
                                reaper: Some(reaper.clone()),
                                ..ResidentConfig::default()
                            },
                            self.budget.clone(),
                            Arc::new(BackingOpener(self.dir.clone())),
                        )
                        .map_err(|e| format!("starting the warm-up threads: {e}"))?;
                        self.set_tier(Tier::Page(PageTier::new(
                            self.sync_mode(),
                            resident,
                            self.cfg.linger_max,
                            reaper,
                        )));
                        return Ok(());
                    }
                    Some(why) if wanted == ReadPath::PageCache => {
                        return Err(format!("--read-path pagecache: {why}"));
                    }
                    Some(why) => {
                        eprintln!(
                            "dhrd: {why}; file data is served by the engine (engine-auto) instead of the page cache"
                        );
                        *self.fallback.lock() = Some(why);
                        ReadPath::EngineAuto
                    }
                }
            }
            p => p,
        };
        let t = EngineTier::new(&self.cfg, engine_path, self.budget.clone())
            .map_err(|e| format!("starting the engine: {e}"))?;
        self.set_tier(Tier::Engine(t));
        Ok(())
    }

    /// The data of open handle `fh`.
    pub(crate) fn handle(&self, fh: Fh) -> Result<(u64, HandleData)> {
        self.handle_sync(fh).map(|(key, data, _)| (key, data))
    }

    /// Like `handle`, with what the open asks of each change's durability.
    pub(crate) fn handle_sync(&self, fh: Fh) -> Result<(u64, HandleData, WriteSync)> {
        let handles = self.handles.read();
        let h = handles.get(&fh).ok_or(FsError::Errno(libc::EBADF))?;
        Ok((h.key, h.data.clone(), h.sync))
    }

    fn insert_handle(&self, key: u64, data: HandleData, open_flags: i32) -> Fh {
        let fh = self.new_fh();
        let sync = WriteSync::of_flags(open_flags);
        self.handles.write().insert(fh, Handle { key, data, sync });
        fh
    }

    /// OPEN of regular file `ino`.
    pub(crate) fn open_file(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        ino: Ino,
        flags: i32,
        register: Register<'_>,
    ) -> Result<(Fh, OpenReply)> {
        let key = self.dir.backing_ino(ino.0);
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        // The kernel has checked write permission for O_TRUNC, whatever the access mode,
        // and passes it only once FUSE_ATOMIC_O_TRUNC is negotiated.
        let truncate = flags & libc::O_TRUNC != 0;
        let (data, reply) = match self.tier() {
            Tier::Page(t) => {
                let (open, reply) = t.open(
                    key,
                    flags,
                    writable.then_some(*caller),
                    || {
                        let (file, st) = self.open_backing_file_stat(ino)?;
                        Ok(Opened {
                            file,
                            mode: st.st_mode,
                            fresh: false,
                        })
                    },
                    register,
                )?;
                self.count_page_open(&open);
                (HandleData::Page(open), reply)
            }
            Tier::Engine(t) => {
                let name = self.display_name(ino);
                let obj = t
                    .objects
                    .acquire(key, &name, writable, || self.open_backing_file(ino))?;
                let kind = if writable {
                    OpenKind::Writer
                } else {
                    OpenKind::Undecided
                };
                (
                    HandleData::Engine { obj, kind },
                    OpenReply::Plain(ReplyFlags::empty()),
                )
            }
        };
        // What the SETATTR of a non-atomic open(O_TRUNC) would do: size 0, mtime and ctime
        // now (even when the file was empty already), set-id bits dropped, durable in sync
        // mode; after the open's own checks, so a refused open changes nothing.
        if truncate {
            let change = SetAttr {
                size: Some(0),
                mtime: Some(SetTime::Now),
                ..SetAttr::default()
            };
            let done = self.do_setattr(set, caller, ino, &change);
            if let Err(e) = done {
                self.release_data(key, data);
                return Err(e);
            }
            self.stats.open_truncates.fetch_add(1, Ordering::Relaxed);
        }
        match data {
            HandleData::Page(open) => {
                let fh = self.insert_handle(key, HandleData::Page(open), flags);
                Ok((fh, reply))
            }
            HandleData::Engine { obj, .. } => {
                let Tier::Engine(t) = self.tier() else {
                    unreachable!("an engine handle on the page cache path");
                };
                let (kind, reply) = t.choose_reply(self, key, &obj, writable, register);
                let fh = self.insert_handle(key, HandleData::Engine { obj, kind }, flags);
                Ok((fh, reply))
            }
        }
    }

    /// CREATE: the entry (meta.rs), then an open of it on the data path.
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE create request
    pub(crate) fn create_file(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        register: Register<'_>,
    ) -> Result<(Attr, Fh, OpenReply)> {
        let c = self.create_entry(set, caller, parent, name, mode, umask, flags)?;
        let key = c.key;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (pfd, made) = (c.pfd, c.made);
        let file = c.file;
        let opened = Opened {
            file,
            mode: c.mode,
            fresh: made,
        };
        let r = match self.tier() {
            Tier::Page(t) => {
                let writer = writable.then_some(*caller);
                t.open(key, flags, writer, || Ok(opened), register)
                    .map(|(open, reply)| {
                        self.count_page_open(&open);
                        (HandleData::Page(open), reply)
                    })
            }
            Tier::Engine(t) => {
                let label = self.display_name(Ino(c.attr.ino));
                t.objects
                    .acquire(key, &label, true, || Ok(opened.file))
                    .map(|obj| {
                        (
                            HandleData::Engine {
                                obj,
                                kind: OpenKind::Writer,
                            },
                            OpenReply::Plain(t.data_open_flags(&self.stats)),
                        )
                    })
            }
        };
        match r {
            Ok((data, reply)) => {
                let fh = self.insert_handle(key, data, flags);
                Ok((c.attr, fh, reply))
            }
            Err(e) => {
                if made {
                    self.undo_create(parent, &pfd, name, key, true);
                }
                Err(e)
            }
        }
    }

    fn count_page_open(&self, open: &PageOpen) {
        match open.service {
            Service::Passthrough => self.stats.opens_passthrough.fetch_add(1, Ordering::Relaxed),
            Service::Daemon => self.stats.opens_direct.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// RELEASE: drops the handle and counts the close on its data path.
    pub(crate) fn release_file(&self, fh: Fh) {
        let h = self.handles.write().remove(&fh);
        if let Some(h) = h {
            self.release_data(h.key, h.data);
        }
    }

    fn release_data(&self, key: u64, data: HandleData) {
        match (self.tier(), data) {
            (Tier::Page(t), HandleData::Page(open)) => t.release(key, open),
            (Tier::Engine(t), HandleData::Engine { kind, .. }) => t.objects.release(key, kind),
            _ => unreachable!("a handle of the other data path"),
        }
    }

    pub(crate) fn do_read(&self, fh: Fh, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (_, data) = self.handle(fh)?;
        let t = Instant::now();
        let (buf, served) = match data {
            HandleData::Page(open) => (
                self.page()?.read(&open, offset, size)?,
                dhrd_engine::Served::Ram,
            ),
            HandleData::Engine { obj, .. } => EngineTier::read(&obj, offset, size)?,
        };
        let s = &self.stats;
        s.reads.fetch_add(1, Ordering::Relaxed);
        s.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        match served {
            dhrd_engine::Served::Ram => s.reads_ram.fetch_add(1, Ordering::Relaxed),
            dhrd_engine::Served::Backing => s.reads_backing.fetch_add(1, Ordering::Relaxed),
            dhrd_engine::Served::Mixed => s.reads_mixed.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        s.read_latency.record(t.elapsed());
        Ok(buf)
    }

    /// `kill_suidgid`: the kernel flagged the write (`FUSE_WRITE_KILL_SUIDGID`), i.e. the
    /// writer lacks CAP_FSETID; it is set on most writes of non-root processes, so the
    /// check costs one statx (without timestamps, see `sys::mode_owner`) and nothing more
    /// unless the file has a set-id bit. `write_flags`: the request's flags (the open's
    /// flags plus O_DSYNC / O_SYNC for RWF_DSYNC / RWF_SYNC), see `WriteSync`.
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE write request
    pub(crate) fn do_write(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        write_flags: i32,
    ) -> Result<u32> {
        let (key, h, open_sync) = self.handle_sync(fh)?;
        let ws = open_sync.max(WriteSync::of_flags(write_flags));
        let t = Instant::now();
        let fd = data_fd(&h);
        if kill_suidgid {
            self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::Lacks)?;
        }
        let n = match &h {
            HandleData::Page(open) => {
                let t = self.page()?;
                self.refuse_if_failed(key)?;
                t.write(open, offset, data, ws)
                    .inspect_err(|e| self.data_failed(key, Failed::Change, "write", e))?
            }
            HandleData::Engine { obj, .. } => {
                obj.write_at(data, offset)?;
                self.engine_durable(obj, ws)?;
                data.len() as u32
            }
        };
        let s = &self.stats;
        s.writes.fetch_add(1, Ordering::Relaxed);
        s.write_bytes.fetch_add(u64::from(n), Ordering::Relaxed);
        s.write_latency.record(t.elapsed());
        Ok(n)
    }

    /// FSYNC. On the page cache path it always syncs the backing file: writes through
    /// passthrough and shared mappings never pass the daemon, and a previous daemon
    /// instance may have left dirty pages in the cache. In `sync` mode the sync joins
    /// `set` (the committer syncs it with concurrent requests', off the worker threads);
    /// otherwise it runs here, with a syncfs for the metadata.
    pub(crate) fn do_fsync(&self, set: &mut SyncSet, fh: Fh, datasync: bool) -> Result<()> {
        let (key, h) = self.handle(fh)?;
        let t = Instant::now();
        if matches!(h, HandleData::Page(_)) {
            // Failed before: never reported as synced again, whichever open asks (C4;
            // failures.rs).
            self.refuse_if_failed(key)?;
        }
        match &h {
            HandleData::Page(open) if self.sync_mode() => {
                // Every write through the mount is on the device when it returns (the
                // sync flag); what an fsync may still have to write are stores into shared
                // mappings, which leave dirty pages. A file with none dirty or under
                // writeback needs only its metadata made durable, which the committer's
                // round covers with every other change (one journal commit, not an fsync
                // and a device flush of its own). Unknown (no cachestat): write it.
                let clean = matches!(
                    dhrd_pagecache::cachestat(open.file.as_fd(), 0, 0),
                    Ok((c, dhrd_pagecache::CacheStatSource::Cachestat))
                        if c.dirty_pages == 0 && c.writeback_pages == 0
                );
                if clean {
                    // Clean now, but the pages of earlier stores may have failed their
                    // writeback (marked clean, never on the disk): ask the file, which
                    // a journal commit would not.
                    sys::writeback_error(open.file.as_fd())
                        .map_err(|e| FsError::io("writeback of the backing file", e))
                        .inspect_err(|e| self.data_failed(key, Failed::Sync, "writeback", e))?;
                    set.fsync(&[&*open.file])?;
                } else {
                    set.fsync_data(&[&*open.file])?;
                }
            }
            HandleData::Page(open) => {
                let r = if datasync {
                    rustix::fs::fdatasync(&*open.file)
                } else {
                    rustix::fs::fsync(&*open.file)
                };
                if let Err(e) = r {
                    let e = FsError::io("fsync of the backing file", e.into());
                    self.data_failed(key, Failed::Sync, "fsync", &e);
                    return Err(e);
                }
            }
            HandleData::Engine { obj, .. } => obj.flush()?,
        }
        if !self.sync_mode() {
            // Attribute changes of this file and the entry that names it.
            self.meta_dirty.store(true, Ordering::Release);
            self.sync_metadata()?;
        }
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_latency.record(t.elapsed());
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE (the kernel answers the other whences itself). On both paths
    /// every write and hole punch reaches the backing file (or its page cache) before it
    /// is acknowledged, so the backing's extent map is the file's; asking it keeps sparse
    /// files sparse through `cp --sparse`, `tar -S` and the like.
    pub(crate) fn do_lseek(&self, fh: Fh, offset: i64, whence: i32) -> Result<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let (_, h) = self.handle(fh)?;
        let fd = data_fd(&h).as_raw_fd();
        // SAFETY: lseek on a descriptor the handle keeps open for as long as `h` lives;
        // the backing is only ever accessed with positioned I/O, so moving its offset is
        // harmless.
        let r = unsafe { libc::lseek(fd, offset, whence) };
        if r < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(r)
    }

    pub(crate) fn do_fallocate(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let (key, h, ws) = self.handle_sync(fh)?;
        // The kernel's file_modified() before FALLOCATE sends no set-id kill to a
        // KILLPRIV_V2 server, and the request carries no flag: decide here.
        let fd = data_fd(&h);
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        match &h {
            HandleData::Page(open) => {
                self.refuse_if_failed(key)?;
                let m = rustix::fs::FallocateFlags::from_bits_retain(mode as _);
                rustix::fs::fallocate(&*open.file, m, offset, length)?;
                // Durable before the reply in `sync` mode, and for an O_SYNC or O_DSYNC
                // open in every mode (as ext4 does for its own such opens).
                if self.sync_mode() || ws > WriteSync::Mode {
                    sys::fsync(open.file.as_fd())
                        .map_err(|e| FsError::io("fsync after fallocate", e))
                        .inspect_err(|e| {
                            self.data_failed(key, Failed::Sync, "fsync after fallocate", e)
                        })?;
                }
                if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                    self.page()?.resident.refresh(key, &open.file);
                }
                Ok(())
            }
            HandleData::Engine { obj, .. } => {
                EngineTier::fallocate(obj, offset, length, mode)?;
                self.engine_durable(obj, ws)
            }
        }
    }

    /// COPY_FILE_RANGE inside the mount, done by the daemon in steps so that every
    /// durability mode keeps its meaning (see `page_tier::PageTier::copy` and
    /// `EngineTier::copy`). The kernel has already refused overlapping ranges of one file
    /// and copies between mounts.
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE copy_file_range request
    pub(crate) fn do_copy_file_range(
        &self,
        caller: &Caller,
        fh_in: Fh,
        offset_in: u64,
        fh_out: Fh,
        offset_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<u32> {
        if flags != 0 {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let (_, src) = self.handle(fh_in)?;
        let (dst_key, dst, ws) = self.handle_sync(fh_out)?;
        let src_len = sys::fstat(data_fd(&src))?.st_size as u64;
        let src_len = match &src {
            HandleData::Engine { obj, .. } => obj.len(),
            HandleData::Page(_) => src_len,
        };
        let want = len
            .min(COPY_REQUEST_BYTES_MAX)
            .min(src_len.saturating_sub(offset_in));
        if want == 0 {
            return Ok(0);
        }
        offset_out
            .checked_add(want)
            .filter(|end| *end <= i64::MAX as u64)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        // Like fallocate: the kernel's file_modified() sends a KILLPRIV_V2 server no
        // set-id kill for this request, so the daemon decides.
        let fd = data_fd(&dst);
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        let done = match (&src, &dst) {
            (HandleData::Page(s), HandleData::Page(d)) => {
                self.refuse_if_failed(dst_key)?;
                self.page()?
                    .copy(s, offset_in, d, offset_out, want, ws)
                    .inspect_err(|e| self.data_failed(dst_key, Failed::Change, "copy", e))?
            }
            (HandleData::Engine { obj: s, .. }, HandleData::Engine { obj: d, .. }) => {
                let done = EngineTier::copy(s, offset_in, d, offset_out, want)?;
                // What was copied is acknowledged: a failing sync fails the request.
                self.engine_durable(d, ws)?;
                done
            }
            _ => return Err(FsError::Errno(libc::EXDEV)),
        };
        let s = &self.stats;
        s.copies.fetch_add(1, Ordering::Relaxed);
        s.copy_bytes.fetch_add(done, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// The size part of SETATTR (truncate, and open with O_TRUNC): set-id bits first
    /// (`kill`: no explicit mode in the same request; with KILLPRIV_V2 the kernel no
    /// longer turns a truncate's set-id kill into a mode change), then the size, durable
    /// in `sync` mode.
    #[allow(clippy::too_many_arguments)] // the setattr request's size part
    pub(crate) fn data_set_len(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        ino: Ino,
        st: &libc::stat,
        size: u64,
        fh: Option<Fh>,
        kill: bool,
    ) -> Result<()> {
        let key = self.dir.backing_ino(ino.0);
        let (from_handle, ws) = match fh.and_then(|f| self.handle_sync(f).ok()) {
            Some((_, d, ws)) => (Some(d), ws),
            None => (None, WriteSync::Mode),
        };
        match self.tier() {
            Tier::Page(t) => {
                // A writable descriptor of the inode: the registration's (read-write) or
                // a fresh one.
                let file = match (from_handle, t.open_file(key)) {
                    (Some(HandleData::Page(o)), _) => o.file,
                    (_, Some(f)) => f,
                    _ => Arc::new(self.open_backing_file(ino)?),
                };
                self.refuse_if_failed(key)?;
                if kill {
                    self.drop_setid_bits(file.as_fd(), st.into(), caller, Fsetid::LookUp)?;
                }
                file.set_len(size)?;
                // The new size is durable before the reply (`sync` mode), with the rest of
                // the request's changes; as data, since a size inside a page zeroes the
                // rest of that page in the cache (an fsync of the file, not only a journal
                // commit, writes it).
                self.data_durable(set, &[&*file])?;
                if !self.sync_mode() && ws > WriteSync::Mode {
                    // ftruncate through an O_SYNC or O_DSYNC open: durable on return.
                    rustix::fs::fdatasync(&*file)
                        .map_err(|e| FsError::io("fdatasync after truncate", e.into()))
                        .inspect_err(|e| {
                            self.data_failed(key, Failed::Sync, "fdatasync after truncate", e)
                        })?;
                }
                t.resident.refresh(key, &file);
            }
            Tier::Engine(t) => {
                let obj = match from_handle {
                    Some(HandleData::Engine { obj, .. }) => obj,
                    _ => match t.objects.get(key) {
                        Some(o) => o,
                        None => {
                            let name = self.display_name(ino);
                            t.objects
                                .touch(key, &name, || self.open_backing_file(ino))?
                        }
                    },
                };
                if kill {
                    let fd = obj.backing().file().as_fd();
                    self.drop_setid_bits(fd, st.into(), caller, Fsetid::LookUp)?;
                }
                obj.set_len(size)?;
                self.engine_durable(&obj, ws)?;
            }
        }
        Ok(())
    }

    /// The size the mount shows for backing inode `key` where the backing file's own is
    /// not it (an engine object ahead of its backing).
    pub(crate) fn data_size(&self, key: u64) -> Option<u64> {
        match self.tier_if_set()? {
            Tier::Engine(t) => t.objects.get(key).map(|o| o.len()),
            Tier::Page(_) => None,
        }
    }

    /// Status of an open file whose name is gone (unlinked while open).
    pub(crate) fn data_stat(&self, key: u64) -> Option<libc::stat> {
        match self.tier_if_set()? {
            Tier::Engine(t) => t
                .objects
                .get(key)
                .and_then(|o| sys::fstat(o.backing().file().as_fd()).ok()),
            Tier::Page(t) => t.open_file(key).and_then(|f| sys::fstat(f.as_fd()).ok()),
        }
    }

    /// GETATTR through an open handle.
    pub(crate) fn handle_stat(&self, fh: Fh) -> Option<libc::stat> {
        let (_, h) = self.handle(fh).ok()?;
        sys::fstat(data_fd(&h)).ok()
    }

    /// The last link of regular file `key` went (unlink, rename over, a failed create).
    pub(crate) fn data_unlinked(&self, key: u64) {
        match self.tier_if_set() {
            Some(Tier::Engine(t)) => t.objects.forget_if_closed(key),
            Some(Tier::Page(t)) => t.unlinked(key),
            None => {}
        }
    }

    /// Flushes every file's data and the metadata (unmount, SIGTERM, the periodic
    /// flusher). Returns the first error.
    pub fn flush_all(&self) -> Result<()> {
        let mut first = Ok(());
        if let Some(Tier::Engine(t)) = self.tier_if_set() {
            for o in t.objects.snapshot() {
                if let Err(e) = o.flush() {
                    if first.is_ok() {
                        first = Err(e.into());
                    }
                }
            }
        }
        // On the page cache path syncfs covers the data too (passthrough writes never
        // pass the daemon); in `sync` mode there is nothing dirty but mappings' stores.
        self.meta_dirty.store(true, Ordering::Release);
        if let Err(e) = self.sync_metadata() {
            if first.is_ok() {
                first = Err(e);
            }
        }
        first
    }

    /// Unmount (DESTROY): closes every engine object, then flushes everything.
    pub fn close_everything(&self) -> Result<()> {
        let mut first = Ok(());
        if let Some(Tier::Engine(t)) = self.tier_if_set() {
            first = t.objects.close_everything();
        }
        let r = self.flush_all();
        first.and(r)
    }

    /// chmod of regular file `fd` (backing inode `key`, group `file_gid`) to `mode`. A
    /// set-id bit is refused (ETXTBSY) while a writer holds a passed-through open that
    /// would drop it at its next write: the daemon never sees those writes, so nothing
    /// would (killpriv.rs). Checked and made under the registration table's lock, so no
    /// such open can start in between.
    pub(crate) fn chmod_file(
        &self,
        fd: BorrowedFd<'_>,
        key: u64,
        file_gid: u32,
        mode: u32,
    ) -> Result<()> {
        let chmod = || -> Result<()> {
            rustix::fs::fchmod(fd, rustix::fs::Mode::from_raw_mode(mode & 0o7777))?;
            Ok(())
        };
        match self.tier_if_set() {
            Some(Tier::Page(t)) if mode & (libc::S_ISUID | libc::S_ISGID) != 0 => t
                .with_passthrough_writers(key, |writers| {
                    if crate::killpriv::unsafe_with_unseen_writers(mode, file_gid, writers) {
                        return Err(FsError::Errno(libc::ETXTBSY));
                    }
                    chmod()
                }),
            _ => chmod(),
        }
    }

    /// EIO if backing inode `key` failed a sync before (page cache path): it takes no
    /// more changes through the daemon and no sync of it reports success (C4).
    /// Passthrough writes never reach the daemon; their fsyncs do, and fail here.
    fn refuse_if_failed(&self, key: u64) -> Result<()> {
        if self.committer.failures.failed((self.dir.dev(), key)) {
            return Err(FsError::Errno(libc::EIO));
        }
        Ok(())
    }

    /// A change or sync of backing inode `key` failed (page cache path): recorded for
    /// status, and, unless it is ENOSPC, EDQUOT or EINTR of a request that changed
    /// nothing (C5), as a sticky failure of the inode (failures.rs). A sync's ENOSPC is
    /// sticky too: it reports a writeback that did not happen.
    fn data_failed(&self, key: u64, op: Failed, what: &str, e: &FsError) {
        if let Tier::Page(t) = self.tier() {
            t.record_failure(what, e);
        }
        let harmless = matches!(e.errno(), libc::ENOSPC | libc::EDQUOT | libc::EINTR);
        if matches!(op, Failed::Sync) || !harmless {
            self.committer
                .failures
                .inode_failed((self.dir.dev(), key), format!("{what}: {e}"));
        }
    }

    /// Makes a change of engine object `obj` durable as `ws` asks: in `sync` mode the
    /// object's writes are durable already; otherwise O_DSYNC flushes the object (its
    /// writes, and the size, fdatasync'ed) and O_SYNC also fsyncs the backing file.
    fn engine_durable(&self, obj: &Obj, ws: WriteSync) -> Result<()> {
        if ws >= WriteSync::Data && !self.sync_mode() {
            obj.flush()?;
        }
        if ws == WriteSync::File {
            sys::fsync(obj.backing().file().as_fd())
                .map_err(|e| FsError::io("fsync of the backing file for O_SYNC", e))?;
        }
        Ok(())
    }

    fn page(&self) -> Result<&PageTier> {
        match self.tier() {
            Tier::Page(t) => Ok(t),
            Tier::Engine(_) => Err(FsError::Errno(libc::EBADF)),
        }
    }
}

/// What failed, for `Shared::data_failed`.
#[derive(Clone, Copy)]
enum Failed {
    /// A change (write, copy): its ENOSPC or EDQUOT changed nothing (C5).
    Change,
    /// A sync: any error means a writeback that did not happen.
    Sync,
}

/// The backing descriptor behind a handle.
fn data_fd(h: &HandleData) -> BorrowedFd<'_> {
    match h {
        HandleData::Page(o) => o.file.as_fd(),
        HandleData::Engine { obj, .. } => obj.backing().file().as_fd(),
    }
}
