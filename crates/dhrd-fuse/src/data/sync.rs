//! Syncs and size changes of files: FSYNC (the file, and the directory entries that name
//! it), the size part of SETATTR (truncate, and open with O_TRUNC), and the flushes of
//! every file (period, unmount).
//!
//! Invariants: a sync of a page cache path file that failed once never reports success
//! again (C4, failures.rs); a new size is durable before the reply in `sync` mode and
//! for an O_SYNC or O_DSYNC open in every mode. Crash semantics: docs/crash-model.md.

use super::handles::HandleData;
use super::{Files, Tier};
use crate::durable::commit::SyncSet;
use crate::durable::failures::SyncOf;
use crate::error::{FsError, Result};
use crate::kernel::{Fh, WriteSync};
use crate::killpriv::{Caller, Fsetid};
use crate::sys;
use dhrd_io::Durable as _;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Files {
    /// FSYNC. On the page cache path it always syncs the backing file: writes through
    /// passthrough and shared mappings never pass the daemon, and a previous daemon
    /// instance may have left dirty pages in the cache. In `sync` mode the sync joins
    /// `set` (the committer syncs it with concurrent requests', off the worker threads);
    /// otherwise it runs here, and then the directory entries that name the file
    /// (`SyncPolicy::sync_names`), not a syncfs of the whole backing.
    pub fn fsync(&self, set: &mut SyncSet, fh: Fh, datasync: bool) -> Result<()> {
        let (key, h, _) = self.handles.get(fh)?;
        let t = Instant::now();
        if matches!(h, HandleData::Page(_)) {
            // Failed before: never reported as synced again, whichever open asks (C4;
            // failures.rs).
            self.refuse_if_failed(key)?;
        }
        match &h {
            HandleData::Page(open) if self.sync.sync_mode() => {
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
                    self.sync_inode(key, false, "writeback of the backing file", || {
                        sys::writeback_error(open.file.as_fd())
                    })?;
                    set.fsync(&[&*open.file])?;
                } else {
                    set.fsync_data(&[&*open.file])?;
                }
            }
            HandleData::Page(open) => {
                self.sync_inode(key, false, "fsync of the backing file", || {
                    if datasync {
                        rustix::fs::fdatasync(&*open.file)?;
                    } else {
                        rustix::fs::fsync(&*open.file)?;
                    }
                    Ok(())
                })?;
            }
            HandleData::Engine { obj, .. } => {
                // The object's writes and size (fdatasync); fsync also wants the inode's
                // other attributes (a chmod, times), which only the backing file holds.
                obj.flush()?;
                if !datasync && !self.sync.sync_mode() {
                    // Reported once per open file description: like the syncfs this
                    // replaces, a failure fails every later sync of the mount (C4).
                    let of = SyncOf::Inode {
                        id: (self.dir.dev(), key),
                        fails_fs: true,
                    };
                    let what = format!("fsync of {}", obj.backing().describe());
                    self.sync
                        .failures()
                        .sync(of, &what, || sys::fsync(obj.backing().file().as_fd()))
                        .map_err(|e| FsError::io("fsync of the backing file", e))?;
                }
            }
        }
        // The directory entries that name the file, if they changed since their last
        // sync (fsync and periodic modes; in `sync` mode they are durable already).
        self.sync.sync_names(&[key])?;
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_latency.record(t.elapsed());
        Ok(())
    }

    /// The size part of SETATTR (truncate, and open with O_TRUNC): set-id bits first
    /// (`kill`: no explicit mode in the same request; with KILLPRIV_V2 the kernel no
    /// longer turns a truncate's set-id kill into a mode change), then the size, durable
    /// in `sync` mode.
    /// `st`: the inode's status; `open_backing` opens its backing file read-write where
    /// no open of it exists; `label` names it for the engine's messages.
    #[allow(clippy::too_many_arguments)] // the setattr request's size part
    pub fn set_len(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        st: &libc::stat,
        size: u64,
        fh: Option<Fh>,
        kill: bool,
        open_backing: impl Fn() -> Result<File>,
        label: impl FnOnce() -> String,
    ) -> Result<()> {
        let key = st.st_ino;
        let (from_handle, ws) = match fh.and_then(|f| self.handles.get(f).ok()) {
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
                    _ => Arc::new(open_backing()?),
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
                self.sync.data_durable(set, &[&*file])?;
                if !self.sync.sync_mode() && ws > WriteSync::Mode {
                    // ftruncate through an O_SYNC or O_DSYNC open: durable on return.
                    self.sync_inode(key, false, "fdatasync after truncate", || {
                        Ok(rustix::fs::fdatasync(&*file)?)
                    })?;
                }
                t.resident().refresh(key, &file);
            }
            Tier::Engine(t) => {
                let obj = match from_handle {
                    Some(HandleData::Engine { obj, .. }) => obj,
                    _ => match t.objects().get(key) {
                        Some(o) => o,
                        None => t.objects().touch(key, &label(), open_backing)?,
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

    /// Flushes every file's data and the metadata (unmount, SIGTERM, the periodic
    /// flusher). Returns the first error.
    pub fn flush_all(&self) -> Result<()> {
        let mut first = Ok(());
        if let Some(Tier::Engine(t)) = self.tier_if_set() {
            for o in t.objects().snapshot() {
                if let Err(e) = o.flush() {
                    if first.is_ok() {
                        first = Err(e.into());
                    }
                }
            }
        }
        // On the page cache path syncfs covers the data too (passthrough writes never
        // pass the daemon); in `sync` mode there is nothing dirty but mappings' stores.
        self.sync.changed();
        if let Err(e) = self.sync.sync_metadata() {
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
            first = t.objects().close_everything();
        }
        let r = self.flush_all();
        first.and(r)
    }
}
