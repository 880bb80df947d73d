//! The RAM tier: one memfd per object, mapped once into the daemon.
//!
//! Invariants:
//! - the memfd's size equals the object's length, so a frontend can hand the fd to the
//!   kernel (FUSE passthrough) and the kernel sees exactly the object's bytes; while a
//!   growing write is in flight it may be larger, never smaller (the write grows it before
//!   it publishes the length: asserted in `object/write.rs`);
//! - the mapping reserves `map_bytes >= memfd size` of address space; every access stays
//!   below the memfd size (pages past it would raise SIGBUS), which the object guarantees
//!   by touching RAM only under its layout lock and below its length;
//! - bytes of a chunk that is not Loaded are meaningless; bytes past the length are zero
//!   (shrinking the memfd discards them, growing it adds zero pages).
//!
//! Crash semantics: none. RAM is volatile by definition; the backing is the truth.

use crate::config::RamOptions;
use crate::error::{Error, Result};
use dhrd_io::PAGE_BYTES;
use parking_lot::Mutex;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Copies into RAM from this size on use `pwrite` on the memfd rather than the mapping
/// (see `copy_in`); below it the system call costs more than the faults it saves.
const PWRITE_MIN_BYTES: usize = 64 << 10;

pub(crate) struct RamRegion {
    fd: OwnedFd,
    ptr: *mut u8,
    map_bytes: u64,
    /// Current memfd size. Grows under the shared layout lock, so growth is serialized by
    /// `grow_lock`; shrinks only with exclusive access.
    file_bytes: AtomicU64,
    grow_lock: Mutex<()>,
    opts: RamOptions,
}

// SAFETY: the mapping is shared memory; the object serializes conflicting accesses (chunk
// locks and the layout lock) and readers tolerate concurrent writers as the page cache does.
unsafe impl Send for RamRegion {}
// SAFETY: as above.
unsafe impl Sync for RamRegion {}

fn os_err() -> Error {
    Error::Ram(io::Error::last_os_error())
}

/// Longest memfd name the kernel accepts, without its terminating NUL (memfd_create(2):
/// 249 bytes; longer names fail with EINVAL).
const MEMFD_NAME_BYTES_MAX: usize = 249;

/// The memfd's name: only a label in /proc/PID/fd, so a name that is too long keeps its
/// tail (the end of a path tells files apart), cut at a character boundary, and NULs are
/// replaced. Any object can be opened whatever its name.
fn memfd_name(name: &str) -> String {
    let name = name.replace('\0', "_");
    if name.len() <= MEMFD_NAME_BYTES_MAX {
        return name;
    }
    let mut start = name.len() - MEMFD_NAME_BYTES_MAX;
    while !name.is_char_boundary(start) {
        start += 1;
    }
    name[start..].to_owned()
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl RamRegion {
    pub(crate) fn new(name: &str, len: u64, map_bytes: u64, opts: &RamOptions) -> Result<Self> {
        let cname = CString::new(memfd_name(name)).map_err(|e| Error::Config(e.to_string()))?;
        // SAFETY: valid C string; flags are constants.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_err());
        }
        // SAFETY: memfd_create returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let map_bytes = round_up(map_bytes.max(len).max(PAGE_BYTES), PAGE_BYTES);
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_err());
        }
        let ptr = Self::map(&fd, map_bytes)?;
        let me = Self {
            fd,
            ptr,
            map_bytes,
            file_bytes: AtomicU64::new(len),
            grow_lock: Mutex::new(()),
            opts: opts.clone(),
        };
        me.apply_advice()?;
        if opts.prefault && len > 0 {
            // SAFETY: advice on our own mapping, within the memfd's size.
            let rc = unsafe {
                libc::madvise(
                    me.ptr.cast(),
                    round_up(len, PAGE_BYTES) as usize,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if rc != 0 {
                return Err(os_err());
            }
        }
        Ok(me)
    }

    fn map(fd: &OwnedFd, map_bytes: u64) -> Result<*mut u8> {
        // SAFETY: a fresh shared mapping of our memfd; NORESERVE because the memfd may be
        // far smaller than the reservation.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err());
        }
        Ok(p.cast())
    }

    fn apply_advice(&self) -> Result<()> {
        if self.opts.huge_pages {
            // SAFETY: advice on our own mapping; failure only means no huge pages.
            unsafe {
                libc::madvise(
                    self.ptr.cast(),
                    self.map_bytes as usize,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
        if self.opts.mlock {
            // SAFETY: locks our own mapping as pages fault in.
            let rc = unsafe {
                libc::mlock2(
                    self.ptr.cast(),
                    self.map_bytes as usize,
                    libc::MLOCK_ONFAULT,
                )
            };
            if rc != 0 {
                return Err(os_err());
            }
        }
        Ok(())
    }

    pub(crate) fn map_bytes(&self) -> u64 {
        self.map_bytes
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Moves the mapping to a larger reservation. Needs exclusive access (`&mut`): no
    /// pointer into the old mapping may be alive.
    pub(crate) fn grow_map(&mut self, map_bytes: u64) -> Result<()> {
        let map_bytes = round_up(map_bytes, PAGE_BYTES);
        if map_bytes <= self.map_bytes {
            return Ok(());
        }
        // SAFETY: remapping our own mapping; `&mut self` proves no borrowed slice exists.
        let p = unsafe {
            libc::mremap(
                self.ptr.cast(),
                self.map_bytes as usize,
                map_bytes as usize,
                libc::MREMAP_MAYMOVE,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err());
        }
        self.ptr = p.cast();
        self.map_bytes = map_bytes;
        self.apply_advice()
    }

    pub(crate) fn file_bytes(&self) -> u64 {
        self.file_bytes.load(Ordering::Acquire)
    }

    /// Grows the memfd to at least `len` (never shrinks). Safe under the shared lock.
    pub(crate) fn ensure_file_bytes(&self, len: u64) -> Result<()> {
        assert!(len <= self.map_bytes, "memfd would outgrow its mapping");
        let _g = self.grow_lock.lock();
        if self.file_bytes() < len {
            // SAFETY: ftruncate on our own descriptor.
            if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len as libc::off_t) } != 0 {
                return Err(os_err());
            }
            self.file_bytes.store(len, Ordering::Release);
        }
        Ok(())
    }

    /// Sets the memfd size exactly. Shrinking discards the pages past `len`; the caller
    /// must hold the layout lock exclusively (no reader may touch those pages).
    pub(crate) fn set_file_bytes_exclusive(&mut self, len: u64) -> Result<()> {
        assert!(len <= self.map_bytes);
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_err());
        }
        self.file_bytes.store(len, Ordering::Release);
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) {
        let end = offset.checked_add(len as u64);
        assert!(
            matches!(end, Some(e) if e <= self.file_bytes()),
            "RAM access [{offset}, +{len}) past memfd size {}",
            self.file_bytes()
        );
    }

    /// Copies `dst.len()` bytes at `offset` out of RAM.
    pub(crate) fn copy_out(&self, offset: u64, dst: &mut [u8]) {
        // Checked in every build: past the memfd size the copy would raise SIGBUS and take
        // the whole process down; a failed check names the broken caller instead, for
        // one atomic load per copy.
        self.check(offset, dst.len());
        // SAFETY: below the memfd size (checked above), which is below the mapping's size;
        // `dst` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }

    /// Copies `src` into RAM at `offset`.
    pub(crate) fn copy_in(&self, offset: u64, src: &[u8]) {
        self.check(offset, src.len());
        let mut done = 0usize;
        // Large copies go through the memfd itself: the kernel then adds new pages without a
        // fault each and without zeroing pages it overwrites whole (zeroing and faults were
        // about a third of the daemon's time for 1 MiB sync writes into a new file). Only
        // inside the memfd's size, which pwrite would otherwise extend.
        if src.len() >= PWRITE_MIN_BYTES && offset + src.len() as u64 <= self.file_bytes() {
            while let Some(rest) = src.get(done..).filter(|r| !r.is_empty()) {
                // SAFETY: a valid buffer of `rest.len()` bytes and our own descriptor.
                let n = unsafe {
                    libc::pwrite(
                        self.fd.as_raw_fd(),
                        rest.as_ptr().cast(),
                        rest.len(),
                        (offset + done as u64) as libc::off_t,
                    )
                };
                match n {
                    n if n > 0 => done += n as usize,
                    _ if n < 0
                        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                    // Anything else (e.g. no memory for a page): the mapping copy below.
                    _ => break,
                }
            }
        }
        let rest = src.len() - done;
        // SAFETY: bounds checked above; callers hold the chunk lock, so no other writer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr().add(done),
                self.ptr.add(offset as usize + done),
                rest,
            )
        };
    }

    /// A mutable view for bulk loading into a chunk. The range may run to the end of the page
    /// holding the last byte (that page is mapped in full), for whole-page O_DIRECT loads.
    ///
    /// # Safety
    /// The caller must hold the chunk lock for the whole range with the chunk not Loaded, so
    /// no reader or writer touches it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut_pages(&self, offset: u64, len: usize) -> &mut [u8] {
        let limit = round_up(self.file_bytes(), PAGE_BYTES);
        assert!(
            offset + len as u64 <= limit,
            "RAM load past the memfd's last page"
        );
        // SAFETY: per the function contract; the last page is mapped in full.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), len) }
    }

    /// A shared view of RAM for zero-copy reads.
    ///
    /// # Safety
    /// The caller keeps the layout lock shared for the lifetime of the slice and the range
    /// below the memfd size. Concurrent writers may change the bytes (as with a shared mmap).
    pub(crate) unsafe fn slice(&self, offset: u64, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: per the function contract.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), len) }
    }

    /// Zeroes a range, returning whole pages to the system.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check(offset, len as usize);
        let end = offset + len;
        let a = round_up(offset, PAGE_BYTES);
        let b = end / PAGE_BYTES * PAGE_BYTES;
        if a < b {
            // SAFETY: punching our own memfd inside its size.
            let rc = unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    a as libc::off_t,
                    (b - a) as libc::off_t,
                )
            };
            if rc != 0 {
                return Err(os_err());
            }
            self.memset_zero(offset, a - offset);
            self.memset_zero(b, end - b);
        } else {
            self.memset_zero(offset, len);
        }
        Ok(())
    }

    fn memset_zero(&self, offset: u64, len: u64) {
        if len > 0 {
            // SAFETY: in bounds (checked by the caller), caller holds the chunk lock.
            unsafe { std::ptr::write_bytes(self.ptr.add(offset as usize), 0, len as usize) };
        }
    }

    /// How the memfd holds `[offset, offset + max_len)` from `offset` on (`max_len > 0`): a
    /// hole (pages never written, or given back by `zero`) reads as zeros. Meaningful only
    /// for Loaded chunks, like the bytes themselves.
    pub(crate) fn extent(&self, offset: u64, max_len: u64) -> dhrd_io::Extent {
        dhrd_io::seek_extent(self.fd.as_raw_fd(), offset, max_len)
    }

    /// Bytes of memory the memfd holds (allocated pages).
    pub(crate) fn resident_bytes(&self) -> u64 {
        // SAFETY: fstat into a zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return 0;
        }
        st.st_blocks as u64 * 512
    }
}

impl Drop for RamRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; nothing can borrow it once we are dropped.
        unsafe { libc::munmap(self.ptr.cast(), self.map_bytes as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_copies_through_the_memfd_match_the_mapping() -> Result<()> {
        let len = 4 * PWRITE_MIN_BYTES as u64;
        let r = RamRegion::new("t", len, len, &RamOptions::default())?;
        let src: Vec<u8> = (0..2 * PWRITE_MIN_BYTES + 13)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        // Unaligned, across pages, wholly inside the memfd: the pwrite path.
        r.copy_in(4096 + 7, &src);
        let mut back = vec![0u8; src.len()];
        r.copy_out(4096 + 7, &mut back);
        assert_eq!(back, src);
        // pwrite must not have changed the memfd size or the bytes before the copy.
        assert_eq!(r.file_bytes(), len);
        let mut head = [1u8; 7];
        r.copy_out(4096, &mut head);
        assert_eq!(head, [0; 7], "bytes before the copy changed");
        Ok(())
    }

    /// `prefault` puts every page in place before the first write, so that a load measures
    /// the pipeline and not the first touch of fresh memory.
    #[test]
    fn prefault_makes_every_page_resident_at_once() -> Result<()> {
        let len = 64 * PAGE_BYTES;
        let cold = RamRegion::new("t", len, len, &RamOptions::default())?;
        assert_eq!(cold.resident_bytes(), 0);
        let opts = RamOptions {
            prefault: true,
            ..Default::default()
        };
        let warm = RamRegion::new("t", len, len, &opts)?;
        assert_eq!(warm.resident_bytes(), len);
        let mut b = [1u8; 8];
        warm.copy_out(len - 8, &mut b);
        assert_eq!(b, [0; 8], "pre-faulted pages must read as zeros");
        Ok(())
    }

    #[test]
    fn names_of_any_length_make_a_memfd() -> Result<()> {
        // 300 bytes of a path, with multi-byte characters across the cut.
        let long: String = "dhrd:".to_owned() + &"é/".repeat(100);
        assert!(long.len() > MEMFD_NAME_BYTES_MAX);
        let r = RamRegion::new(&long, 4096, 4096, &RamOptions::default())?;
        r.copy_in(0, b"x");
        let n = memfd_name(&long);
        assert!(n.len() <= MEMFD_NAME_BYTES_MAX && long.ends_with(&n));
        assert_eq!(memfd_name("a\0b"), "a_b");
        Ok(())
    }

    #[test]
    fn grows_zeroes_and_stays_sparse() -> Result<()> {
        let mut r = RamRegion::new("t", 10_000, 16384, &RamOptions::default())?;
        r.copy_in(5000, b"abc");
        let mut b = [0u8; 3];
        r.copy_out(5000, &mut b);
        assert_eq!(&b, b"abc");
        r.grow_map(1 << 20)?;
        r.copy_out(5000, &mut b);
        assert_eq!(&b, b"abc");
        r.zero(4999, 3)?;
        r.copy_out(5000, &mut b);
        assert_eq!(b, [0, 0, b'c']);
        r.ensure_file_bytes(1 << 20)?;
        r.copy_in((1 << 20) - 1, b"z");
        assert!(r.resident_bytes() <= 3 * PAGE_BYTES);
        r.set_file_bytes_exclusive(4)?;
        r.ensure_file_bytes(8192)?;
        r.copy_out(5000, &mut b);
        assert_eq!(b, [0, 0, 0], "bytes past a shrink must come back as zero");
        Ok(())
    }
}
