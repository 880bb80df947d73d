//! A pin of a warmed file: a read-only shared mapping of its first bytes, locked with
//! `mlock` so the kernel cannot evict those pages.
//!
//! Invariants: a `Pin` owns its mapping and unmaps it exactly once (which also unlocks
//! it). Crash semantics: none; the pins vanish with the process, the pages stay cached.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A pinned mapping: `len` bytes of a file mapped read-only and locked.
pub(super) struct Pin {
    addr: usize,
    pub(super) len: usize,
}

impl Pin {
    pub(super) fn new(file: &File, len: u64) -> io::Result<Self> {
        let len = len as usize;
        // SAFETY: a new read-only shared mapping of a file we hold open; we never
        // dereference it (it exists to be locked) and unmap it exactly once in Drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let pin = Pin {
            addr: addr as usize,
            len,
        };
        // SAFETY: locks exactly the mapping made above. Faults in any page not cached yet.
        if unsafe { libc::mlock(addr, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(pin)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this Pin made and owns (munmap also unlocks it).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
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
