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
//!   descriptor opened lazily with `O_DIRECT` (by reopening our own descriptor via
//!   /proc/self/fd, so it is the same inode): no page cache. In write-through mode (`sync`
//!   durability) each is issued with `RWF_DSYNC`, i.e. exactly a raw O_DIRECT|O_DSYNC write:
//!   durable when `pwritev2` returns (`Persistence::Durable`), so the engine does not wait
//!   for a shared sync, and concurrent writers reach the device in parallel; on a device
//!   without FUA the kernel follows each write with a cache flush and merges the flushes of
//!   concurrent writers itself (block layer flush sequencing), which measured at least as
//!   fast as sharing one `fdatasync` through the engine's group commit (docs/fuse.md).
//!   Outside write-through mode they are plain O_DIRECT writes that the next `sync` covers.
//! - Other writes, `set_len` and `zero_range` are buffered; they and the O_DIRECT writes
//!   without `RWF_DSYNC` set `pending`; `sync` runs `fdatasync` only when something is
//!   pending (it also makes a size change durable) and then drops the written pages from
//!   the page cache, so neither writes nor loads leave a second copy of the data in the page
//!   cache (drop-behind, SPEC I8).
//! - `pending` is set before `write_durably` returns (so before the engine takes the
//!   request's commit ticket), cleared before the `fdatasync` starts and restored if it
//!   fails, so a write that completed before any `sync` call began is covered by that sync.
//!   It starts set: the first `sync` of a file always runs `fdatasync`, since what a
//!   previous daemon instance left dirty in the page cache is the file's too.
//!
//! Crash semantics are the kernel's: what `fdatasync` (or an `RWF_DSYNC` write) returned
//! `Ok` for is on the device.

// The alignment of offsets, lengths and buffers for the O_DIRECT write descriptor.
use dhrd_io::{Durable, Persistence, DIRECT_ALIGN_BYTES as DIRECT_ALIGN};
use parking_lot::Mutex;
use std::alloc::Layout;
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Largest page-cache folio (PMD size on x86-64); drop-behind ranges are widened to it.
pub const PAGE_CACHE_FOLIO_MAX_BYTES: u64 = 2 << 20;
/// Largest aligned bounce buffer a thread keeps between writes (FUSE's max_write).
const BOUNCE_KEEP_BYTES: usize = 1 << 20;

#[derive(Debug)]
pub struct ConfinedFile {
    file: File,
    /// `O_DIRECT` descriptor for aligned writes; None if the file system refuses.
    direct: OnceLock<Option<File>>,
    /// Write-through (`sync` durability): aligned writes use RWF_DSYNC.
    write_through: bool,
    /// A change (buffered write, O_DIRECT write without RWF_DSYNC, set_len, zero_range) is
    /// not yet synced.
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
    fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: non-zero size checked above.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(Self { ptr, layout })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Copies `data` to the start of the buffer and returns that part.
    fn fill(&mut self, data: &[u8]) -> &[u8] {
        let n = data.len().min(self.len());
        // SAFETY: `ptr` has room for layout.size() >= n bytes, is exclusively ours
        // (&mut self) and does not overlap `data`; the returned slice covers the n bytes
        // just initialised and borrows self.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, n);
            std::slice::from_raw_parts(self.ptr, n)
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

thread_local! {
    /// Each FUSE worker keeps one bounce buffer instead of allocating one per write.
    static BOUNCE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Runs `f` on an aligned copy of `data`; None if no buffer could be allocated.
fn with_aligned<R>(data: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    if data.len() > BOUNCE_KEEP_BYTES {
        let mut b = AlignedBuf::new(data.len())?;
        return Some(f(b.fill(data)));
    }
    BOUNCE.with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        if slot.as_ref().is_none_or(|b| b.len() < data.len()) {
            *slot = Some(AlignedBuf::new(data.len())?);
        }
        let b = slot.as_mut()?;
        Some(f(b.fill(data)))
    })
}

impl ConfinedFile {
    /// `write_through`: the object runs in `sync` durability, so aligned writes are made
    /// durable by themselves (RWF_DSYNC).
    pub fn new(file: File, name: String, write_through: bool) -> Self {
        Self {
            file,
            direct: OnceLock::new(),
            write_through,
            // The first `sync` always syncs: a previous daemon (killed before it flushed)
            // or another writer may have left dirty pages of this file in the page cache,
            // and an fsync through this object must cover them too.
            pending: AtomicBool::new(true),
            dirty: Mutex::new(None),
            name,
        }
    }

    fn direct_file(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                // Reopening our own descriptor through /proc reaches exactly this inode.
                let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                    .open(path)
                    .ok()
            })
            .as_ref()
    }

    /// Writes an aligned block through O_DIRECT; None if not applicable (unaligned, no
    /// O_DIRECT descriptor, refused by the file system), else whether it is durable.
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<Option<Persistence>> {
        let aligned = !buf.is_empty()
            && offset & (DIRECT_ALIGN as u64 - 1) == 0
            && buf.len() & (DIRECT_ALIGN - 1) == 0;
        if !aligned {
            return Ok(None);
        }
        let Some(f) = self.direct_file() else {
            return Ok(None);
        };
        let flags = if self.write_through {
            rustix::io::ReadWriteFlags::DSYNC
        } else {
            rustix::io::ReadWriteFlags::empty()
        };
        let r = with_aligned(buf, |a| write_all_v2(f, a, offset, flags));
        match r {
            None => Ok(None),
            Some(Ok(())) if self.write_through => Ok(Some(Persistence::Durable)),
            Some(Ok(())) => {
                // Before returning, so before the engine takes this request's ticket.
                self.pending.store(true, Ordering::Release);
                Ok(Some(Persistence::NeedsSync))
            }
            // Some file systems accept O_DIRECT at open but not for this request (EINVAL);
            // kernels before 4.7 know no RWF_DSYNC (EOPNOTSUPP) or pwritev2 (ENOSYS). The
            // buffered path then writes the whole request again.
            Some(Err(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
                ) =>
            {
                Ok(None)
            }
            Some(Err(e)) => {
                // Part of it may have reached the file: the engine fails the request, and a
                // later flush must still sync.
                self.pending.store(true, Ordering::Release);
                Err(e)
            }
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

    /// Aligned writes in write-through mode are durable on return (O_DIRECT + RWF_DSYNC),
    /// so the engine need not wait for a shared sync after them; others (plain O_DIRECT
    /// outside write-through mode, buffered) need one.
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        if let Some(p) = self.write_direct(buf, offset)? {
            return Ok(p);
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

/// `pwritev2` of all of `buf` at `offset` with `flags` (RWF_DSYNC covers each call).
fn write_all_v2(
    f: &File,
    mut buf: &[u8],
    mut offset: u64,
    flags: rustix::io::ReadWriteFlags,
) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pwritev2(f, &[io::IoSlice::new(buf)], offset, flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A scratch file on a disk file system (O_DIRECT needs one; tmpfs refuses it).
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::var_os("DHRD_TEST_DISK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        dir.join(format!("dhrd-backing-test-{tag}-{}", std::process::id()))
    }

    fn open(path: &std::path::Path, write_through: bool) -> ConfinedFile {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("scratch file");
        ConfinedFile::new(f, path.display().to_string(), write_through)
    }

    /// An fsync through a new object must make durable what a previous daemon left dirty
    /// in the page cache (killed before its flush): the first `sync` always syncs.
    #[test]
    fn the_first_sync_covers_dirty_pages_a_previous_instance_left() {
        use std::os::unix::fs::FileExt;
        let path = scratch("restart");
        let old = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("scratch");
        old.write_all_at(&[7u8; 8192], 0).expect("write");
        let dirty = |f: &File| {
            let (st, src) = dhrd_io::pagecache::cachestat(f.as_fd(), 0, 0).expect("cachestat");
            (src == dhrd_io::pagecache::CacheStatSource::Cachestat)
                .then_some(st.dirty_pages + st.writeback_pages)
        };
        if dirty(&old) == Some(0) {
            eprintln!("skipped: the pages were written back before the test looked");
            return;
        }
        drop(old);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("reopen");
        let cf = ConfinedFile::new(f, path.display().to_string(), false);
        cf.sync().expect("sync");
        if let Some(n) = dirty(cf.file()) {
            assert_eq!(n, 0, "dirty pages left after the first sync");
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn aligned_writes_are_durable_only_in_write_through_mode() {
        for write_through in [true, false] {
            let path = scratch(if write_through { "wt" } else { "wb" });
            let cf = open(&path, write_through);
            // The first sync always runs (see the module header); after it, only writes
            // make the next one necessary.
            assert!(cf.pending.load(Ordering::Acquire));
            cf.sync().unwrap();
            let block = vec![0xA5u8; 2 * DIRECT_ALIGN];
            let p = cf.write_durably(&block, DIRECT_ALIGN as u64).unwrap();
            if cf.direct_file().is_none() {
                // No O_DIRECT here: the buffered path took the write.
                assert_eq!(p, Persistence::NeedsSync);
            } else if write_through {
                assert_eq!(p, Persistence::Durable);
                assert!(!cf.pending.load(Ordering::Acquire), "nothing to sync");
            } else {
                assert_eq!(p, Persistence::NeedsSync);
                assert!(cf.pending.load(Ordering::Acquire), "the next sync must run");
            }
            // Unaligned writes always need the shared sync.
            let p = cf.write_durably(b"xyz", 10).unwrap();
            assert_eq!(p, Persistence::NeedsSync);
            assert!(cf.pending.load(Ordering::Acquire));
            cf.sync().unwrap();
            assert!(!cf.pending.load(Ordering::Acquire));
            let mut back = vec![0u8; 3 * DIRECT_ALIGN];
            assert_eq!(cf.read_at(&mut back, 0).unwrap(), back.len());
            assert_eq!(&back[10..13], b"xyz");
            assert!(back[DIRECT_ALIGN..].iter().all(|b| *b == 0xA5));
            let _ = std::fs::remove_file(&path);
        }
    }

    #[test]
    fn bounce_buffer_is_reused_and_large_writes_get_their_own() {
        let small = vec![1u8; DIRECT_ALIGN];
        let p1 = with_aligned(&small, |a| a.as_ptr() as usize).unwrap();
        let p2 = with_aligned(&small, |a| a.as_ptr() as usize).unwrap();
        assert_eq!(p1, p2, "one buffer per thread");
        assert!(p1.is_multiple_of(DIRECT_ALIGN));
        let big = vec![2u8; BOUNCE_KEEP_BYTES + DIRECT_ALIGN];
        let ok = with_aligned(&big, |a| {
            a.len() == big.len()
                && (a.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
                && a == &big[..]
        });
        assert_eq!(ok, Some(true));
    }
}
