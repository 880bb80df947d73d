//! `ConfinedFile`: one backing file as the durable copy of a hybrid object.
//!
//! Why not `dhrd_io::FileBacking`: it opens by path (following symlinks, outside any
//! confinement) and holds two descriptors per file. Here the descriptor is obtained by the
//! caller through the confined `openat2` of `sys.rs`, so the durable copy is exactly the
//! inode the daemon looked up, and each object costs one backing descriptor (plus the
//! engine's memfd), which matters for trees of 500k files.
//!
//! Invariants:
//! - Block-aligned writes (offset and length multiples of `DIRECT_ALIGN`) go through a second
//!   descriptor opened lazily with `O_DIRECT | O_DSYNC` (by reopening our own descriptor via
//!   /proc/self/fd, so it is the same inode): durable when `pwrite` returns, no page cache,
//!   and concurrent writers reach the device in parallel like raw O_DSYNC writers.
//! - Other writes, `set_len` and `zero_range` are buffered and set `pending`; `sync` runs
//!   `fdatasync` only when something is pending (it also makes a size change durable) and
//!   then drops the written pages from the page cache, so neither writes nor loads leave a
//!   second copy of the data in the page cache (drop-behind, SPEC I8).
//! - `pending` is cleared before the `fdatasync` starts and restored if it fails, so a
//!   buffered write that completed before any `sync` call began is covered by that sync.
//!
//! Crash semantics are the kernel's: what `fdatasync` returned `Ok` for is on the device.

use dhrd_io::{Durable, Persistence};
use parking_lot::Mutex;
use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Largest page-cache folio (PMD size on x86-64); drop-behind ranges are widened to it.
pub const PAGE_CACHE_FOLIO_MAX_BYTES: u64 = 2 << 20;
/// Alignment of offsets, lengths and buffers for the O_DIRECT write descriptor.
pub const DIRECT_ALIGN: usize = 4096;

#[derive(Debug)]
pub struct ConfinedFile {
    file: File,
    /// `O_DIRECT | O_DSYNC` descriptor for aligned writes; None if the file system refuses.
    dsync: OnceLock<Option<File>>,
    /// A buffered change (write, set_len, zero_range) is not yet synced.
    pending: AtomicBool,
    /// Byte range written since the last sync, dropped from the page cache after the sync.
    dirty: Mutex<Option<(u64, u64)>>,
    name: String,
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn copy_of(data: &[u8]) -> Option<Self> {
        let layout = Layout::from_size_align(data.len(), DIRECT_ALIGN).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: non-zero size checked above.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` has room for data.len() bytes and does not overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Some(Self { ptr, layout })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: initialised above with layout.size() bytes; lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in copy_of.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

impl ConfinedFile {
    pub fn new(file: File, name: String) -> Self {
        Self {
            file,
            dsync: OnceLock::new(),
            pending: AtomicBool::new(false),
            dirty: Mutex::new(None),
            name,
        }
    }

    fn dsync_file(&self) -> Option<&File> {
        self.dsync
            .get_or_init(|| {
                // Reopening our own descriptor through /proc reaches exactly this inode.
                let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT | libc::O_DSYNC | libc::O_CLOEXEC)
                    .open(path)
                    .ok()
            })
            .as_ref()
    }

    /// Writes an aligned block durably through O_DIRECT|O_DSYNC; false if not applicable.
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<bool> {
        let aligned = !buf.is_empty()
            && offset & (DIRECT_ALIGN as u64 - 1) == 0
            && buf.len() & (DIRECT_ALIGN - 1) == 0;
        if !aligned {
            return Ok(false);
        }
        let Some(f) = self.dsync_file() else {
            return Ok(false);
        };
        let Some(a) = AlignedBuf::copy_of(buf) else {
            return Ok(false);
        };
        match f.write_all_at(a.as_slice(), offset) {
            Ok(()) => Ok(true),
            // Some file systems accept O_DIRECT at open but not for this request.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    fn fadvise_dontneed(&self, offset: u64, len: u64) {
        // The page cache holds large folios (up to PMD size) and DONTNEED skips a folio it
        // covers only in part, so a range is widened to whole folios; dropping a clean
        // neighbouring page costs at most a re-read, never data.
        let mask = PAGE_CACHE_FOLIO_MAX_BYTES - 1;
        let start = offset & !mask;
        let end = offset.saturating_add(len).saturating_add(mask) & !mask;
        // SAFETY: plain syscall on a descriptor we own; failure only loses a hint.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                start as libc::off_t,
                end.saturating_sub(start) as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    fn mark_dirty(&self, offset: u64, len: u64) {
        let mut d = self.dirty.lock();
        let end = offset.saturating_add(len);
        *d = Some(match *d {
            None => (offset, end),
            Some((s, e)) => (s.min(offset), e.max(end)),
        });
    }
}

impl Durable for ConfinedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let Some(rest) = buf.get_mut(done..) else {
                break;
            };
            match self.file.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_durably(buf, offset).map(|_| ())
    }

    /// Aligned writes are durable on return (O_DIRECT|O_DSYNC), so the engine need not
    /// wait for a shared sync after them; others are buffered and need one.
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        if self.write_direct(buf, offset)? {
            return Ok(Persistence::Durable);
        }
        self.file.write_all_at(buf, offset)?;
        self.mark_dirty(offset, buf.len() as u64);
        self.pending.store(true, Ordering::Release);
        Ok(Persistence::NeedsSync)
    }

    fn sync(&self) -> io::Result<()> {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let range = self.dirty.lock().take();
        if let Err(e) = rustix::fs::fdatasync(self.file.as_fd()) {
            self.pending.store(true, Ordering::Release);
            // Keep the range: the pages are still dirty and must not be dropped as clean.
            if let Some((s, e2)) = range {
                self.mark_dirty(s, e2 - s);
            }
            return Err(e.into());
        }
        if let Some((s, e)) = range {
            self.fadvise_dontneed(s, e - s);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.pending.store(true, Ordering::Release);
        self.file.set_len(len)
    }

    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.read_at(buf, offset)?;
        self.fadvise_dontneed(offset, n as u64);
        Ok(n)
    }

    fn drop_cache(&self, offset: u64, len: u64) {
        self.fadvise_dontneed(offset, len);
    }

    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        // SEEK_DATA from `offset`: no data before offset+len means the range is a hole.
        match rustix::fs::seek(self.file.as_fd(), rustix::fs::SeekFrom::Data(offset)) {
            Ok(next) => next >= offset.saturating_add(len),
            Err(rustix::io::Errno::NXIO) => true,
            Err(_) => false,
        }
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        self.pending.store(true, Ordering::Release);
        match rustix::fs::fallocate(self.file.as_fd(), flags, offset, len) {
            Ok(()) => {
                self.mark_dirty(offset, len);
                Ok(())
            }
            Err(rustix::io::Errno::OPNOTSUPP) => dhrd_io::write_zero_bytes(self, offset, len),
            Err(e) => Err(e.into()),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
