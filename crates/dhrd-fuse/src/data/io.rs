//! Reads and changes of open files' data: READ, WRITE, LSEEK, FALLOCATE,
//! COPY_FILE_RANGE, and GETATTR through a handle, each on the handle's data path.
//!
//! Invariants: set-id bits a change must drop are dropped (durably per the mode) before
//! the change; a change through an open asking for O_DSYNC or O_SYNC is durable on
//! return in every mode; on the page cache path a file whose sync failed takes no more
//! changes (C4). Crash semantics: those of the data path (docs/crash-model.md).

use super::handles::HandleData;
use super::Files;
use crate::config::COPY_REQUEST_BYTES_MAX;
use crate::engine::EngineTier;
use crate::error::{FsError, Result};
use crate::kernel::{Fh, WriteSync};
use crate::killpriv::{Caller, Fsetid};
use crate::stats::InFlight;
use crate::sys;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Files {
    pub fn read(&self, fh: Fh, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (_, data, _) = self.handles.get(fh)?;
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
    pub fn write(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        write_flags: i32,
    ) -> Result<u32> {
        let s = &self.stats;
        let _busy = InFlight::enter(
            &s.writes_in_flight,
            &s.writes_in_flight_max,
            &s.writes_in_flight_sum,
        );
        let (key, h, open_sync) = self.handles.get(fh)?;
        let ws = open_sync.max(WriteSync::of_flags(write_flags));
        let t = Instant::now();
        let fd = h.backing_fd();
        if kill_suidgid {
            self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::Lacks)?;
        }
        let n = match &h {
            HandleData::Page(open) => {
                let t = self.page()?;
                self.page_change(key, t.syncs_itself(ws), "write", || {
                    t.write(open, offset, data, ws)
                })?
            }
            HandleData::Engine { obj, .. } => {
                obj.write_at(data, offset)?;
                self.engine_durable(obj, ws)?;
                data.len() as u32
            }
        };
        s.writes.fetch_add(1, Ordering::Relaxed);
        s.write_bytes.fetch_add(u64::from(n), Ordering::Relaxed);
        s.write_latency.record(t.elapsed());
        Ok(n)
    }

    /// SEEK_DATA / SEEK_HOLE (the kernel answers the other whences itself). On both paths
    /// every write and hole punch reaches the backing file (or its page cache) before it
    /// is acknowledged, so the backing's extent map is the file's; asking it keeps sparse
    /// files sparse through `cp --sparse`, `tar -S` and the like.
    pub fn lseek(&self, fh: Fh, offset: i64, whence: i32) -> Result<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let (_, h, _) = self.handles.get(fh)?;
        let fd = h.backing_fd().as_raw_fd();
        // SAFETY: lseek on a descriptor the handle keeps open for as long as `h` lives;
        // the backing is only ever accessed with positioned I/O, so moving its offset is
        // harmless.
        let r = unsafe { libc::lseek(fd, offset, whence) };
        if r < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(r)
    }

    pub fn fallocate(
        &self,
        caller: &Caller,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let (key, h, ws) = self.handles.get(fh)?;
        // The kernel's file_modified() before FALLOCATE sends no set-id kill to a
        // KILLPRIV_V2 server, and the request carries no flag: decide here.
        let fd = h.backing_fd();
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        match &h {
            HandleData::Page(open) => {
                self.refuse_if_failed(key)?;
                let m = rustix::fs::FallocateFlags::from_bits_retain(mode as _);
                rustix::fs::fallocate(&*open.file, m, offset, length)?;
                // Durable before the reply in `sync` mode, and for an O_SYNC or O_DSYNC
                // open in every mode (as ext4 does for its own such opens).
                if self.sync.sync_mode() || ws > WriteSync::Mode {
                    self.sync_inode(key, false, "fsync after fallocate", || {
                        sys::fsync(open.file.as_fd())
                    })?;
                }
                if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                    self.page()?.resident().refresh(key, &open.file);
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
    /// durability mode keeps its meaning (see `PageTier::copy` and
    /// `EngineTier::copy`). The kernel has already refused overlapping ranges of one file
    /// and copies between mounts.
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE copy_file_range request
    pub fn copy_file_range(
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
        let (_, src, _) = self.handles.get(fh_in)?;
        let (dst_key, dst, ws) = self.handles.get(fh_out)?;
        let src_len = sys::fstat(src.backing_fd())?.st_size as u64;
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
        let fd = dst.backing_fd();
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        let done = match (&src, &dst) {
            (HandleData::Page(s), HandleData::Page(d)) => {
                let t = self.page()?;
                self.page_change(dst_key, t.syncs_itself(ws), "copy", || {
                    t.copy(s, offset_in, d, offset_out, want, ws)
                })?
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

    /// The status of the backing file an open handle holds.
    pub fn handle_stat(&self, fh: Fh) -> Result<libc::stat> {
        let (_, h, _) = self.handles.get(fh)?;
        Ok(sys::fstat(h.backing_fd())?)
    }
}
