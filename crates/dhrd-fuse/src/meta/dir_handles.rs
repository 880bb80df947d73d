//! The table of open directories: each handle's listing, read once at its first READDIR
//! (offsets are indexes into it).
//!
//! Invariants: a handle's entries never change once read, so offsets stay stable; a
//! directory the kernel serves from its own cache (FOPEN_CACHE_DIR) is never read.
//!
//! No disk state and no crash semantics.

use crate::error::{FsError, Result};
use crate::kernel::{DirEntry, Fh};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory and its backing inode, not read yet.
pub type Unread = (OwnedFd, u64);

/// One open directory.
struct DirHandle {
    entries: Vec<DirEntry>,
    /// The directory and its backing inode until the first READDIR reads it: when the
    /// kernel serves a listing from its cache (FOPEN_CACHE_DIR), none comes, and the
    /// backing directory is never read.
    unread: Option<Unread>,
}

/// Open directories by handle.
pub struct DirHandles {
    map: Mutex<HashMap<Fh, DirHandle>>,
    next: AtomicU64,
}

impl Default for DirHandles {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl DirHandles {
    /// A handle for directory `fd` (backing inode `ino`), to be read at its first READDIR.
    pub fn open(&self, fd: OwnedFd, ino: u64) -> Fh {
        let fh = Fh(self.next.fetch_add(1, Ordering::Relaxed));
        let d = DirHandle {
            entries: Vec::new(),
            unread: Some((fd, ino)),
        };
        let old = self.map.lock().insert(fh, d);
        assert!(old.is_none(), "directory handle {fh:?} given out twice");
        fh
    }

    /// The directory of handle `fh` if it was not read yet (the caller reads it and gives
    /// the outcome to `fill`). EBADF for an unknown handle.
    pub fn take_unread(&self, fh: Fh) -> Result<Option<Unread>> {
        match self.map.lock().get_mut(&fh) {
            Some(d) => Ok(d.unread.take()),
            None => Err(FsError::Errno(libc::EBADF)),
        }
    }

    /// Stores what reading `unread` gave; after a failure the next READDIR tries again.
    pub fn fill(&self, fh: Fh, unread: Unread, read: Result<Vec<DirEntry>>) -> Result<()> {
        let mut map = self.map.lock();
        let Some(d) = map.get_mut(&fh) else {
            return Err(FsError::Errno(libc::EBADF));
        };
        match read {
            Ok(e) => {
                // Read once: offsets are indexes into the entries, so they never change.
                debug_assert!(
                    d.entries.is_empty() && d.unread.is_none(),
                    "directory handle {fh:?} read twice"
                );
                d.entries = e;
                Ok(())
            }
            Err(e) => {
                d.unread = Some(unread);
                Err(e)
            }
        }
    }

    /// Runs `f` on the entries of handle `fh`, under the table's lock.
    pub fn with_entries<R>(&self, fh: Fh, f: impl FnOnce(&[DirEntry]) -> R) -> Result<R> {
        let map = self.map.lock();
        let d = map.get(&fh).ok_or(FsError::Errno(libc::EBADF))?;
        Ok(f(&d.entries))
    }

    /// RELEASEDIR.
    pub fn close(&self, fh: Fh) {
        self.map.lock().remove(&fh);
    }
}
