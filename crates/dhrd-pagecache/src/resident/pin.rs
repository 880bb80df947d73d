//! A pin of a warmed file: a read-only shared mapping of its first bytes, locked with
//! `mlock` so the kernel cannot evict those pages; and [`FileMap`], the mapping itself,
//! which the warm-up's populating (`populate.rs`) uses too.
//!
//! Invariants: a `FileMap` owns its mapping, is never dereferenced (it exists to be locked
//! or advised), and unmaps it exactly once (which also unlocks it). Crash semantics: none;
//! the pins vanish with the process, the pages stay cached.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A read-only shared mapping of `len` bytes of a file from `offset` (page-aligned).
pub(super) struct FileMap {
    addr: usize,
    pub(super) len: usize,
    pub(super) offset: u64,
}

impl FileMap {
    pub(super) fn new(file: &File, offset: u64, len: u64) -> io::Result<Self> {
        assert_eq!(
            offset % dhrd_io::PAGE_BYTES,
            0,
            "a file mapping starts on a page"
        );
        let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
        let len = usize::try_from(len).map_err(invalid)?;
        let off = libc::off_t::try_from(offset).map_err(invalid)?;
        // SAFETY: a new read-only shared mapping of a file we hold open; it is never
        // dereferenced and is unmapped exactly once, in Drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMap {
            addr: addr as usize,
            len,
            offset,
        })
    }

    /// The address of byte `at` of the mapping, for calls that take one (`mlock`,
    /// `madvise`); `at..at + len` must lie within the mapping.
    pub(super) fn addr_of(&self, at: usize, len: usize) -> *mut libc::c_void {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "a range within the mapping"
        );
        (self.addr + at) as *mut libc::c_void
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this value made and owns (munmap also unlocks it).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A pinned mapping: the first `len` bytes of a file mapped read-only and locked.
pub(super) struct Pin {
    map: FileMap,
}

impl Pin {
    pub(super) fn new(file: &File, len: u64) -> io::Result<Self> {
        let map = FileMap::new(file, 0, len)?;
        // SAFETY: locks exactly the mapping made above. Faults in any page not cached yet.
        if unsafe { libc::mlock(map.addr_of(0, map.len), map.len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pin { map })
    }

    /// Bytes pinned.
    pub(super) fn len(&self) -> usize {
        self.map.len
    }
}

/// RLIMIT_MEMLOCK of the process, for the status line of a refused pin.
pub(super) fn memlock_limit() -> String {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut l) } != 0 {
        return "memlock limit unknown".into();
    }
    if l.rlim_cur == libc::RLIM_INFINITY {
        "memlock limit: unlimited".into()
    } else {
        format!("memlock limit: {} bytes", l.rlim_cur)
    }
}
