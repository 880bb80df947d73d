//! Sticky sync failures of the backing (SPEC C4): which backing inodes, and which backing
//! file systems, have failed a sync, so that no later sync of them is reported as success.
//!
//! Why the daemon keeps this: a writeback error is reported once per open file
//! description of the backing (errseq), and the daemon syncs one shared descriptor per
//! inode (the page cache path's registration, duplicated into the committer's sets) for
//! every open of it through the mount, and one root descriptor for every syncfs. Whoever
//! syncs first takes the error; every other open, and every later sync, would then read
//! success for pages that never reached the disk (marked clean, still readable from the
//! cache). So every sync error is recorded here by whoever sees it, and every sync
//! through the mount looks here first.
//!
//! Invariants:
//! - An inode or file system recorded stays recorded until the daemon exits.
//! - A sync of a recorded inode, or of any inode of a recorded file system, fails with
//!   EIO without asking the backing (a failed fsync is never retried as if it had
//!   succeeded). Enforced by the callers, which look here before each sync (the
//!   committer's round, `SyncPolicy`, the data path's `refuse_if_failed`); nothing here
//!   can see a sync. A sync that starts while another one's failure is being recorded is
//!   not held back: the record covers syncs that start after it.
//! - The first failure's description is kept for status.
//!
//! Crash semantics: none of its own; after a restart the backing is read again as it is.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// (device, inode) of a backing inode.
pub type InodeId = (u64, u64);

/// See the module header.
#[derive(Default)]
pub struct Failures {
    /// Anything recorded at all: the lock-free answer for the (usual) healthy backing.
    any: AtomicBool,
    inodes: Mutex<HashSet<InodeId>>,
    devs: Mutex<HashSet<u64>>,
    first: Mutex<Option<String>>,
}

impl Failures {
    /// A sync of inode `id` failed (`what`: which sync, and its error).
    pub fn inode_failed(&self, id: InodeId, what: String) {
        self.inodes.lock().insert(id);
        self.any.store(true, Ordering::Release);
        self.first.lock().get_or_insert(what);
    }

    /// A sync of the whole file system `dev` failed (syncfs, a journal commit): which
    /// inode lost data is unknown, so every inode on it counts as failed.
    pub fn fs_failed(&self, dev: u64, what: String) {
        self.devs.lock().insert(dev);
        self.any.store(true, Ordering::Release);
        self.first.lock().get_or_insert(what);
    }

    /// Whether inode `id` (or its file system) has failed a sync.
    pub fn failed(&self, id: InodeId) -> bool {
        self.any.load(Ordering::Acquire)
            && (self.devs.lock().contains(&id.0) || self.inodes.lock().contains(&id))
    }

    /// Whether file system `dev` as a whole has failed a sync.
    pub fn fs_has_failed(&self, dev: u64) -> bool {
        self.any.load(Ordering::Acquire) && self.devs.lock().contains(&dev)
    }

    /// `failed` for the inode behind `fd`; false where it cannot be stat'ed.
    pub fn fd_failed(&self, fd: BorrowedFd<'_>) -> bool {
        id_of(fd).is_some_and(|id| self.failed(id))
    }

    /// The first failure recorded, for status.
    pub fn first(&self) -> Option<String> {
        self.first.lock().clone()
    }
}

/// (device, inode) of a descriptor.
pub fn id_of(fd: BorrowedFd<'_>) -> Option<InodeId> {
    crate::sys::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_inode_or_file_system_stays_failed() {
        let f = Failures::default();
        assert!(!f.failed((1, 2)));
        f.inode_failed((1, 2), "fsync: EIO".into());
        assert!(f.failed((1, 2)) && !f.failed((1, 3)) && !f.fs_has_failed(1));
        f.fs_failed(4, "syncfs: EIO".into());
        assert!(f.failed((4, 9)) && f.fs_has_failed(4));
        assert_eq!(f.first().as_deref(), Some("fsync: EIO"));
    }
}
