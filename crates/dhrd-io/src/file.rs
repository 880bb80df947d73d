//! A real file or block device as the durable backing: the one file backing every
//! frontend uses (NBD and the library open it by path; the file system hands in a file it
//! opened itself, confined to its backing directory).
//!
//! Invariants:
//! - Writes are `pwrite` into the file, made durable per [`WriteSync`]: a shared
//!   `fdatasync` (the default, which lets the engine's group commit cover concurrent
//!   writers), `O_DSYNC` on every write, or, with `DirectDsync`, block-aligned writes
//!   through an `O_DIRECT` descriptor with `RWF_DSYNC` (exactly a raw O_DIRECT|O_DSYNC
//!   write: durable when it returns, concurrent writers reach the device in parallel and
//!   the kernel merges their cache flushes) and the rest buffered with the shared sync.
//!   `DirectDsync` is granted at open only where the file system's direct-I/O alignment
//!   (statx) fits 4 KiB blocks and an O_DIRECT descriptor opens; otherwise the backing
//!   falls back to `Fdatasync` and `direct_dsync` says why, for the frontend to report.
//! - `direct_writes` sends block-aligned writes through the `O_DIRECT` descriptor in every
//!   mode, so they leave no second copy in the page cache; bulk reads for the loader and
//!   aligned reads use it too (`direct_reads`); unaligned reads use the buffered
//!   descriptor followed by `POSIX_FADV_DONTNEED` (drop-behind) when `drop_behind` is set;
//!   that descriptor is then advised `POSIX_FADV_RANDOM`, so that no page read ahead of a
//!   read escapes its drop.
//!   Without O_DIRECT (some file systems refuse it) everything is buffered.
//! - `pending` says a change may not be durable yet. It is set before a write returns (so
//!   before the engine takes the request's commit ticket), cleared before the `fdatasync`
//!   starts and restored if it fails, so a write that completed before a `sync` began is
//!   covered by it; `sync` skips the `fdatasync` when nothing is pending. It starts set: the
//!   first `sync` of a file always syncs, since what a previous process left dirty in the
//!   page cache is the file's too.
//! - The range written since the last sync is dropped from the page cache after the sync
//!   (drop-behind), widened to whole large folios, which `DONTNEED` skips when covered in
//!   part.
//!
//! - [`FileBacking::open`] takes the single-writer lock of `lock.rs` (unless
//!   `FileOptions::lock` is off): one object per backing file, whatever the frontend.
//!   A file it created is removed again when the open fails after the lock (a size the
//!   file system refuses), so a refused start leaves no file behind.
//!
//! Crash semantics are the kernel's: what `fdatasync` (or an O_DSYNC / RWF_DSYNC write)
//! returned `Ok` for is on the device.

use crate::{Durable, Persistence};
use parking_lot::Mutex;
use std::alloc::Layout;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Alignment used for O_DIRECT buffers, offsets and lengths. 4 KiB satisfies every logical
/// block size in common use (512 and 4096).
pub const DIRECT_ALIGN_BYTES: usize = 4096;
/// Largest page-cache folio (PMD size on x86-64); drop-behind ranges are widened to it.
pub const PAGE_CACHE_FOLIO_MAX_BYTES: u64 = 2 << 20;
/// Largest aligned bounce buffer a thread keeps between O_DIRECT writes (FUSE's
/// max_write); larger writes get a buffer of their own.
const BOUNCE_KEEP_BYTES: usize = 1 << 20;
/// Bytes of zeros written per call where a hole cannot be punched.
const ZERO_BUF_BYTES: u64 = 1 << 20;

/// How a write is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteSync {
    /// `pwrite` then a separate `fdatasync`, shareable by concurrent writers (group commit).
    #[default]
    Fdatasync,
    /// Open with `O_DSYNC`: each `pwrite` is durable on return; `sync` is then cheap.
    ODsync,
    /// Block-aligned writes through `O_DIRECT` with `RWF_DSYNC`, durable on return; other
    /// writes `pwrite` plus the shared `fdatasync`.
    DirectDsync,
}

#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Create the file if missing (never for block devices; `open` only).
    pub create: bool,
    /// Extend (never shrink) a regular file to at least this many bytes at open.
    pub min_len: Option<u64>,
    pub write_sync: WriteSync,
    /// Use an O_DIRECT descriptor for aligned reads and bulk loading.
    pub direct_reads: bool,
    /// Send block-aligned writes through the O_DIRECT descriptor (no page cache copy).
    pub direct_writes: bool,
    /// Drop the page-cache copy after buffered reads and after `sync`.
    pub drop_behind: bool,
    /// Open read-only (no writes, no sync needed; `open` only).
    pub read_only: bool,
    /// Take the single-writer lock (`lock.rs`; `open` only): an exclusive lock for a
    /// read-write open, a shared one for a read-only open, refused with
    /// `ErrorKind::ResourceBusy` while another open holds a conflicting one. Off only for
    /// a caller that keeps other writers away itself.
    pub lock: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            create: true,
            min_len: None,
            write_sync: WriteSync::Fdatasync,
            direct_reads: true,
            direct_writes: false,
            drop_behind: true,
            read_only: false,
            lock: true,
        }
    }
}

/// A regular file or a block device used as the durable copy.
#[derive(Debug)]
pub struct FileBacking {
    /// What `describe` names (the path, or the caller's label).
    label: String,
    path: Option<PathBuf>,
    file: File,
    /// As asked for, except `DirectDsync` on a file without direct I/O, which falls back
    /// to `Fdatasync` at open (`direct_dsync` says why).
    write_sync: WriteSync,
    /// Why `DirectDsync` was asked for and not granted; None when granted or not asked.
    direct_dsync_refused: Option<String>,
    direct_writes: bool,
    direct_reads: bool,
    /// The O_DIRECT descriptor, opened on first use; None if the file system refuses.
    direct: OnceLock<Option<File>>,
    read_only: bool,
    block_device: bool,
    drop_behind: bool,
    /// A change may not be durable yet (see the module header).
    pending: AtomicBool,
    /// Byte range written since the last sync, dropped from the page cache after it.
    dirty: Mutex<Option<(u64, u64)>>,
}

fn is_aligned(v: u64) -> bool {
    v.is_multiple_of(DIRECT_ALIGN_BYTES as u64)
}

/// Whether direct I/O with these alignments (statx: buffer, offset) can carry our writes,
/// whose buffers, offsets and lengths are multiples of [`DIRECT_ALIGN_BYTES`].
fn dio_fits(mem_align: u32, offset_align: u32) -> Result<(), String> {
    let unit = DIRECT_ALIGN_BYTES as u32;
    if offset_align == 0 {
        return Err("the file system does not support direct I/O on it".into());
    }
    if !unit.is_multiple_of(offset_align) || !unit.is_multiple_of(mem_align.max(1)) {
        return Err(format!(
            "its direct I/O needs {offset_align}-byte offsets and {mem_align}-byte buffers, \
             more than {unit}"
        ));
    }
    Ok(())
}

/// The direct-I/O alignment of an open file (`stx_dio_mem_align`, `stx_dio_offset_align`;
/// an offset alignment of 0 means no direct I/O), or None where the kernel or file system
/// does not report it.
fn dio_alignment(f: &File) -> Option<(u32, u32)> {
    let mut x = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a valid descriptor, an empty NUL-terminated path with AT_EMPTY_PATH, and a
    // buffer of the right type that the kernel fills.
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            x.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: statx succeeded and filled the struct (zeroed before, so fields it did not
    // fill read as 0).
    let x = unsafe { x.assume_init() };
    (x.stx_mask & libc::STATX_DIOALIGN != 0)
        .then_some((x.stx_dio_mem_align, x.stx_dio_offset_align))
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, DIRECT_ALIGN_BYTES).ok()?;
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
    /// Each writing thread keeps one bounce buffer instead of allocating one per write.
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

/// `pwritev2` of all of `buf` (RWF_DSYNC when `dsync`).
fn write_all_v2(f: &File, mut buf: &[u8], mut offset: u64, dsync: bool) -> io::Result<()> {
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one iovec describing `buf`, which outlives the call; the kernel only
        // reads from it.
        let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, offset as libc::off_t, flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

impl FileBacking {
    /// Opens (or creates) `path` as a backing.
    pub fn open(path: &Path, opts: &FileOptions) -> io::Result<Self> {
        let meta = std::fs::metadata(path);
        let block_device = matches!(&meta, Ok(m) if m.file_type().is_block_device());
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        let mut flags = libc::O_CLOEXEC;
        if opts.write_sync == WriteSync::ODsync {
            flags |= libc::O_DSYNC;
        }
        oo.custom_flags(flags);
        // A file this open creates is removed again if the open fails after that (a size
        // the file system refuses): a refused start leaves nothing behind.
        let mut created = false;
        let file = if opts.create && !block_device && !opts.read_only {
            match oo.clone().create_new(true).open(path) {
                Ok(f) => {
                    created = true;
                    f
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => oo.open(path)?,
                Err(e) => return Err(e),
            }
        } else {
            oo.open(path)?
        };
        // A refused lock means another process holds the file, created here or not: it
        // stays.
        if opts.lock {
            crate::lock::lock_backing(&file, &path.display().to_string(), !opts.read_only)?;
        }
        let me = Self::open_locked(file, path, opts);
        if me.is_err() && created {
            let _ = std::fs::remove_file(path);
        }
        me
    }

    /// The rest of `open`, once the file is open and locked.
    fn open_locked(file: File, path: &Path, opts: &FileOptions) -> io::Result<Self> {
        let me = Self::with(
            file,
            path.display().to_string(),
            Some(path.to_path_buf()),
            opts,
        )?;
        // O_DIRECT for reads at once, by path, as the loader starts right away.
        if opts.direct_reads || opts.direct_writes {
            me.direct_file();
        }
        if let Some(min) = opts.min_len {
            if !me.block_device && me.len()? < min {
                me.file.set_len(min)?;
                me.file.sync_all()?;
            }
        }
        Ok(me)
    }

    /// A backing over a file the caller opened (read-write) itself, e.g. confined to a
    /// directory: the O_DIRECT descriptor is this same inode reopened through
    /// /proc/self/fd, on first use. `label` is what `describe` says. No single-writer
    /// lock is taken: the caller keeps other writers away (the FUSE daemon locks its whole
    /// backing directory).
    pub fn from_file(file: File, label: String, opts: &FileOptions) -> io::Result<Self> {
        Self::with(file, label, None, opts)
    }

    fn with(
        file: File,
        label: String,
        path: Option<PathBuf>,
        opts: &FileOptions,
    ) -> io::Result<Self> {
        let ft = file.metadata()?.file_type();
        if !(ft.is_file() || ft.is_block_device()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{label}: not a regular file or block device"),
            ));
        }
        let mut me = Self {
            label,
            path,
            file,
            write_sync: opts.write_sync,
            direct_dsync_refused: None,
            direct_writes: opts.direct_writes || opts.write_sync == WriteSync::DirectDsync,
            direct_reads: opts.direct_reads,
            direct: OnceLock::new(),
            read_only: opts.read_only,
            block_device: ft.is_block_device(),
            drop_behind: opts.drop_behind,
            pending: AtomicBool::new(true),
            dirty: Mutex::new(None),
        };
        if me.drop_behind {
            // Buffered reads drop what they read, but readahead still in flight when a
            // drop runs escapes it: with four loader threads 1-2 MiB runs of a 32 MiB file
            // stayed cached in about one load in four (up to 8% of it; dhrd-engine's
            // `tests/loader.rs`), a second copy of what the RAM tier holds. Without
            // readahead each read is one request of its own size. The price, where the
            // loader has no O_DIRECT: 1 GiB loaded in 1.17-1.26 s against 0.98-1.02 s with
            // four threads, 2.23-2.47 s against 1.95-2.18 s with one (three rounds each, a
            // disk with 8 MiB readahead).
            // SAFETY: plain syscall on a descriptor we own; a failure is only a lost hint.
            unsafe {
                libc::posix_fadvise(me.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
            }
        }
        if me.write_sync == WriteSync::DirectDsync && !me.read_only {
            if let Err(why) = me.probe_direct_dsync() {
                me.write_sync = WriteSync::Fdatasync;
                me.direct_writes = opts.direct_writes;
                me.direct_dsync_refused = Some(why);
            }
        }
        Ok(me)
    }

    /// Whether aligned writes can go to the device through O_DIRECT here: the file
    /// system's direct-I/O alignment (statx `STATX_DIOALIGN`, Linux 6.1) must divide
    /// [`DIRECT_ALIGN_BYTES`], and an O_DIRECT descriptor must open. Where statx does not
    /// report the alignment, the open alone decides and a refusal at write time (EINVAL)
    /// still falls back per write. RWF_DSYNC needs Linux 4.7, older than any kernel with
    /// FUSE passthrough; an unknown flag would fall back per write too.
    fn probe_direct_dsync(&self) -> Result<(), String> {
        if let Some((mem_align, offset_align)) = dio_alignment(&self.file) {
            dio_fits(mem_align, offset_align)?;
        }
        match self.direct_file() {
            Some(_) => Ok(()),
            None => Err("opening it with O_DIRECT failed".into()),
        }
    }

    /// What the write path is: `Ok` when aligned writes are durable on return through
    /// O_DIRECT with RWF_DSYNC (one device operation each), `Err(why)` when that was asked
    /// for and the file refused it (writes then take `pwrite` plus the shared
    /// `fdatasync`), `Ok` as well when it was not asked for.
    pub fn direct_dsync(&self) -> Result<(), &str> {
        match &self.direct_dsync_refused {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// The write-sync mode in effect (see [`FileBacking::direct_dsync`]).
    pub fn write_sync(&self) -> WriteSync {
        self.write_sync
    }

    /// The path it was opened by (None for `from_file`).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// The buffered descriptor, for frontends that need `fstat` or similar.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The O_DIRECT descriptor (opened on first use), if the file system allows one.
    fn direct_file(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                // Our own descriptor reopened through /proc reaches exactly this inode,
                // wherever its names are now.
                let path = match &self.path {
                    Some(p) => p.clone(),
                    None => PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd())),
                };
                OpenOptions::new()
                    .read(true)
                    .write(self.direct_writes && !self.read_only)
                    .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
                    .open(path)
                    .ok()
            })
            .as_ref()
    }

    fn fadvise_dontneed(&self, offset: u64, len: u64) {
        // The page cache holds large folios (up to PMD size) and DONTNEED skips a folio it
        // covers only in part, so a range is widened to whole folios; dropping a clean
        // neighbouring page costs at most a re-read, never data.
        let mask = PAGE_CACHE_FOLIO_MAX_BYTES - 1;
        let start = offset & !mask;
        let end = if len == 0 {
            0
        } else {
            offset.saturating_add(len).saturating_add(mask) & !mask
        };
        // SAFETY: plain syscall on a descriptor we own; a failure is only a missed hint.
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

    fn direct_read(direct: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            match direct.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    if n % DIRECT_ALIGN_BYTES != 0 {
                        break; // short read at end of file
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn buffered_read(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            match self.file.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.drop_behind && done > 0 {
            self.fadvise_dontneed(offset, done as u64);
        }
        Ok(done)
    }

    fn aligned_direct_reads(&self) -> Option<&File> {
        if self.direct_reads {
            self.direct_file()
        } else {
            None
        }
    }

    /// Writes an aligned block through O_DIRECT; None if not applicable (unaligned, no
    /// O_DIRECT descriptor, refused by the file system), else whether it is durable.
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<Option<Persistence>> {
        if !self.direct_writes
            || buf.is_empty()
            || !is_aligned(offset)
            || !is_aligned(buf.len() as u64)
        {
            return Ok(None);
        }
        let Some(f) = self.direct_file() else {
            return Ok(None);
        };
        let dsync = self.write_sync == WriteSync::DirectDsync;
        match with_aligned(buf, |a| write_all_v2(f, a, offset, dsync)) {
            None => Ok(None),
            Some(Ok(())) if dsync => Ok(Some(Persistence::Durable)),
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
}

impl Durable for FileBacking {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(direct) = self.aligned_direct_reads() {
            if is_aligned(offset)
                && is_aligned(buf.len() as u64)
                && (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES)
            {
                return Self::direct_read(direct, buf, offset);
            }
        }
        self.buffered_read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_durably(buf, offset).map(|_| ())
    }

    /// Aligned `DirectDsync` writes and every `ODsync` write are durable on return; the
    /// others need the shared sync.
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        if let Some(p) = self.write_direct(buf, offset)? {
            return Ok(p);
        }
        // Set first: a write that fails part-way may have reached the file.
        self.pending.store(true, Ordering::Release);
        self.file.write_all_at(buf, offset)?;
        if self.drop_behind {
            self.mark_dirty(offset, buf.len() as u64);
        }
        Ok(if self.write_sync == WriteSync::ODsync {
            Persistence::Durable
        } else {
            Persistence::NeedsSync
        })
    }

    fn sync(&self) -> io::Result<()> {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let range = self.dirty.lock().take();
        if let Err(e) = self.file.sync_data() {
            self.pending.store(true, Ordering::Release);
            // Keep the range: the pages are still dirty and must not be dropped as clean.
            if let Some((s, e2)) = range {
                self.mark_dirty(s, e2 - s);
            }
            return Err(e);
        }
        if let Some((s, e)) = range {
            self.fadvise_dontneed(s, e - s);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        if self.block_device {
            let mut size: u64 = 0;
            // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
            const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
            // SAFETY: the ioctl writes one u64 into `size`, which outlives the call.
            let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut size) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(size)
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.block_device {
            if self.len()? == len {
                return Ok(());
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a block device's size cannot be changed",
            ));
        }
        self.pending.store(true, Ordering::Release);
        self.file.set_len(len)
    }

    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Some(direct) = self.aligned_direct_reads() else {
            return self.buffered_read(buf, offset);
        };
        if !is_aligned(offset) || !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
            return self.buffered_read(buf, offset);
        }
        let aligned = buf.len() - buf.len() % DIRECT_ALIGN_BYTES;
        let (head, tail) = buf.split_at_mut(aligned);
        let n = Self::direct_read(direct, head, offset)?;
        if n < aligned || tail.is_empty() {
            return Ok(n);
        }
        Ok(n + self.buffered_read(tail, offset + aligned as u64)?)
    }

    fn writes_are_durable(&self) -> bool {
        self.write_sync == WriteSync::ODsync
    }

    fn durable_write_block_bytes(&self) -> Option<u64> {
        (self.write_sync == WriteSync::DirectDsync && self.direct_file().is_some())
            .then_some(DIRECT_ALIGN_BYTES as u64)
    }

    fn drop_cache(&self, offset: u64, len: u64) {
        if self.drop_behind {
            self.fadvise_dontneed(offset, len);
        }
    }

    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        if self.block_device || len == 0 {
            return false;
        }
        // SAFETY: lseek on our own descriptor; SEEK_DATA does not move shared state we use
        // (all our I/O is positional).
        let next = unsafe {
            libc::lseek(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                libc::SEEK_DATA,
            )
        };
        if next < 0 {
            // ENXIO: no data at or after offset.
            return io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        next as u64 >= offset + len
    }

    fn extent_at(&self, offset: u64, max_len: u64) -> io::Result<crate::Extent> {
        if self.block_device {
            // A block device has no holes to report (its own thin provisioning is not
            // visible through SEEK_DATA).
            return Ok(crate::Extent::data(max_len));
        }
        // Writes reach this file (its page cache at least) before they are acknowledged,
        // and SEEK_DATA counts dirty cached pages as data, so a hole here reads as zeros.
        Ok(crate::seek_extent(self.file.as_raw_fd(), offset, max_len))
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.pending.store(true, Ordering::Release);
        if !self.block_device {
            // SAFETY: fallocate on our own descriptor with plain integer arguments.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if rc == 0 {
                if self.drop_behind {
                    self.mark_dirty(offset, len);
                }
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err);
            }
        }
        // Fallback: write zeros.
        let zeros = vec![0u8; ZERO_BUF_BYTES.min(len.max(1)) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        if self.drop_behind {
            self.mark_dirty(offset, len);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let kind = if self.block_device {
            "block device"
        } else {
            "file"
        };
        let direct = match self.direct.get() {
            Some(Some(_)) => ", O_DIRECT",
            _ => "",
        };
        format!("{kind} {}{direct}", self.label)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_holes() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("b");
        let f = FileBacking::open(
            &p,
            &FileOptions {
                min_len: Some(1 << 20),
                ..Default::default()
            },
        )?;
        assert_eq!(f.len()?, 1 << 20);
        assert!(f.is_zero_range(0, 1 << 20));
        f.write_at(b"hello", 4097)?;
        f.sync()?;
        let mut b = [0u8; 5];
        assert_eq!(f.read_at(&mut b, 4097)?, 5);
        assert_eq!(&b, b"hello");
        assert!(!f.is_zero_range(0, 8192));
        // Aligned bulk read through O_DIRECT (or the fallback) sees the same bytes.
        let mut page = vec![0u8; 2 * DIRECT_ALIGN_BYTES + DIRECT_ALIGN_BYTES];
        let off = page.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        let aligned = &mut page[off..off + 2 * DIRECT_ALIGN_BYTES];
        assert_eq!(f.read_bulk_at(aligned, 0)?, 2 * DIRECT_ALIGN_BYTES);
        assert_eq!(&aligned[4097..4102], b"hello");
        f.zero_range(4096, 4096)?;
        assert_eq!(f.read_at(&mut b, 4097)?, 5);
        assert_eq!(b, [0u8; 5]);
        f.set_len(10)?;
        assert_eq!(f.len()?, 10);
        Ok(())
    }

    /// A scratch file on a disk file system (O_DIRECT needs one; tmpfs refuses it).
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::var_os("DHRD_TEST_DISK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        dir.join(format!("dhrd-io-file-test-{tag}-{}", std::process::id()))
    }

    fn from_file(path: &Path, write_sync: WriteSync) -> FileBacking {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("scratch file");
        let opts = FileOptions {
            write_sync,
            direct_writes: true,
            direct_reads: false,
            ..FileOptions::default()
        };
        FileBacking::from_file(f, path.display().to_string(), &opts).expect("backing")
    }

    #[test]
    fn aligned_writes_are_durable_only_with_direct_dsync() {
        for ws in [WriteSync::DirectDsync, WriteSync::Fdatasync] {
            let path = scratch(&format!("{ws:?}"));
            let fb = from_file(&path, ws);
            // The first sync always runs (see the module header); after it, only writes
            // make the next one necessary.
            assert!(fb.pending.load(Ordering::Acquire));
            fb.sync().unwrap();
            let block = vec![0xA5u8; 2 * DIRECT_ALIGN_BYTES];
            let p = fb.write_durably(&block, DIRECT_ALIGN_BYTES as u64).unwrap();
            if fb.direct_file().is_none() {
                // No O_DIRECT here: the buffered path took the write.
                assert_eq!(p, Persistence::NeedsSync);
            } else if ws == WriteSync::DirectDsync {
                assert_eq!(p, Persistence::Durable);
                assert!(!fb.pending.load(Ordering::Acquire), "nothing to sync");
            } else {
                assert_eq!(p, Persistence::NeedsSync);
                assert!(fb.pending.load(Ordering::Acquire), "the next sync must run");
            }
            // Unaligned writes always need the shared sync.
            let p = fb.write_durably(b"xyz", 10).unwrap();
            assert_eq!(p, Persistence::NeedsSync);
            assert!(fb.pending.load(Ordering::Acquire));
            fb.sync().unwrap();
            assert!(!fb.pending.load(Ordering::Acquire));
            let mut back = vec![0u8; 3 * DIRECT_ALIGN_BYTES];
            assert_eq!(fb.read_at(&mut back, 0).unwrap(), back.len());
            assert_eq!(&back[10..13], b"xyz");
            assert!(back[DIRECT_ALIGN_BYTES..].iter().all(|b| *b == 0xA5));
            let _ = std::fs::remove_file(&path);
        }
    }

    #[test]
    fn direct_dsync_needs_direct_io_that_fits_our_blocks() {
        assert!(dio_fits(512, 512).is_ok());
        assert!(dio_fits(4, 4096).is_ok());
        assert!(dio_fits(0, 4096).is_ok(), "no buffer alignment reported");
        assert!(dio_fits(512, 0)
            .unwrap_err()
            .contains("does not support direct I/O"));
        assert!(dio_fits(512, 8192)
            .unwrap_err()
            .contains("8192-byte offsets"));
        assert!(dio_fits(8192, 512).is_err());
        // A disk file system grants it and says so; aligned writes are durable on return.
        let path = scratch("probe");
        let opts = FileOptions {
            write_sync: WriteSync::DirectDsync,
            ..FileOptions::default()
        };
        let fb = FileBacking::open(&path, &opts).expect("open");
        assert_eq!(fb.direct_dsync(), Ok(()));
        assert_eq!(fb.write_sync(), WriteSync::DirectDsync);
        assert_eq!(
            fb.durable_write_block_bytes(),
            Some(DIRECT_ALIGN_BYTES as u64)
        );
        // Not asked for: nothing to refuse, and no block promise. (One open of a file at a
        // time: the first lets go of its lock first.)
        drop(fb);
        let plain = FileBacking::open(&path, &FileOptions::default()).expect("open");
        assert_eq!(plain.direct_dsync(), Ok(()));
        assert_eq!(plain.durable_write_block_bytes(), None);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn bounce_buffer_is_reused_and_large_writes_get_their_own() {
        let small = vec![1u8; DIRECT_ALIGN_BYTES];
        let p1 = with_aligned(&small, |a| a.as_ptr() as usize).unwrap();
        let p2 = with_aligned(&small, |a| a.as_ptr() as usize).unwrap();
        assert_eq!(p1, p2, "one buffer per thread");
        assert!(p1.is_multiple_of(DIRECT_ALIGN_BYTES));
        let big = vec![2u8; BOUNCE_KEEP_BYTES + DIRECT_ALIGN_BYTES];
        let ok = with_aligned(&big, |a| {
            a.len() == big.len()
                && (a.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES)
                && a == &big[..]
        });
        assert_eq!(ok, Some(true));
    }
}
