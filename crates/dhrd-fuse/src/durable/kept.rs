//! Descriptors of backing files kept after the page cache path dropped their registration,
//! because a writeback error may be reported to them and to no later descriptor.
//!
//! Why: the kernel reports a writeback error once per open file description, to those
//! open when it happened (errseq); a description opened after the error was seen (by a
//! self-syncing write's own sync, on another description) never reports it. The daemon
//! syncs an inode through its registration's descriptor (page/mod.rs), so when that is
//! closed with an error still unseen, a later open's fsync would report success for pages
//! that never reached the disk. A registration whose inode was opened for writing is
//! therefore not closed when dropped: its descriptor waits here until something has
//! asked it (failures.rs).
//!
//! Invariants:
//! - At most `max` descriptors wait unchecked; past it, the oldest is marked `checking`
//!   and handed out to be checked off the request threads. It stays here (found by every
//!   sync of its inode) until its check removes it (`remove`), so no sync of the inode
//!   runs in between without it.
//! - Each entry has a stamp from one counter, in the order kept; `release_before` lets go
//!   of all entries kept before a stamp (a successful syncfs that started after them).
//!
//! Crash semantics: none; only open descriptors.

use std::collections::{BTreeMap, HashMap};

/// (device, inode) of a backing inode (as `failures::InodeId`, which builds on this file).
type InodeId = (u64, u64);

/// Descriptors kept unchecked at most by default (`FsConfig::kept_fds_max`; lowered to
/// fit the descriptor limit at start). A few thousand closed, written files whose
/// registration went before any sync of them asked: past it, one is checked per new one.
pub const KEPT_FDS_MAX: usize = 4096;

/// One kept descriptor.
struct Entry<T> {
    id: InodeId,
    fd: T,
    /// Handed out to be checked; no longer counted against `max`.
    checking: bool,
}

/// Kept descriptors by stamp (oldest first) and by inode. `T`: the descriptor
/// (`Arc<File>` in the mount, a number in tests).
pub struct Kept<T> {
    entries: BTreeMap<u64, Entry<T>>,
    by_inode: HashMap<InodeId, Vec<u64>>,
    next_stamp: u64,
    /// Entries not `checking`.
    unchecked: usize,
    max: usize,
}

/// An entry handed out to be checked: its stamp (for `remove`), its inode, its descriptor.
pub struct Evicted<T> {
    pub stamp: u64,
    pub id: InodeId,
    pub fd: T,
}

impl<T: Clone> Kept<T> {
    pub fn new(max: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            by_inode: HashMap::new(),
            next_stamp: 0,
            unchecked: 0,
            max,
        }
    }

    /// Sets the bound (at start, before anything is kept).
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The stamp the next entry gets: entries kept before now have a smaller one.
    pub fn now(&self) -> u64 {
        self.next_stamp
    }

    /// All entries, those being checked included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps `fd` of inode `id`; returns the oldest unchecked entry if that made more
    /// than `max`, marked `checking` (still here, see the module header).
    #[must_use]
    pub fn keep(&mut self, id: InodeId, fd: T) -> Option<Evicted<T>> {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let entry = Entry {
            id,
            fd,
            checking: false,
        };
        self.entries.insert(stamp, entry);
        self.by_inode.entry(id).or_default().push(stamp);
        self.unchecked += 1;
        if self.unchecked <= self.max {
            return None;
        }
        let (&stamp, e) = self.entries.iter_mut().find(|(_, e)| !e.checking)?;
        e.checking = true;
        self.unchecked -= 1;
        Some(Evicted {
            stamp,
            id: e.id,
            fd: e.fd.clone(),
        })
    }

    /// One descriptor kept of inode `id`, if any.
    pub fn any_of(&self, id: InodeId) -> Option<&T> {
        let stamp = self.by_inode.get(&id)?.first()?;
        self.entries.get(stamp).map(|e| &e.fd)
    }

    /// Takes every entry of inode `id` out (a sync of it checks them; an inode with no
    /// name left needs no check).
    pub fn take(&mut self, id: InodeId) -> Vec<T> {
        let stamps = self.by_inode.remove(&id).unwrap_or_default();
        let mut taken = Vec::with_capacity(stamps.len());
        for s in stamps {
            if let Some(e) = self.entries.remove(&s) {
                taken.push(self.forget(e));
            }
        }
        taken
    }

    /// Takes the entry kept at `stamp` out, if still here.
    pub fn remove(&mut self, stamp: u64) -> Option<T> {
        let e = self.entries.remove(&stamp)?;
        if let Some(v) = self.by_inode.get_mut(&e.id) {
            v.retain(|s| *s != stamp);
            if v.is_empty() {
                self.by_inode.remove(&e.id);
            }
        }
        Some(self.forget(e))
    }

    /// Takes every entry kept before stamp `before` out.
    pub fn release_before(&mut self, before: u64) -> Vec<T> {
        let later = self.entries.split_off(&before);
        let old = std::mem::replace(&mut self.entries, later);
        let mut gone = Vec::with_capacity(old.len());
        for (stamp, e) in old {
            if let Some(v) = self.by_inode.get_mut(&e.id) {
                v.retain(|s| *s != stamp);
                if v.is_empty() {
                    self.by_inode.remove(&e.id);
                }
            }
            gone.push(self.forget(e));
        }
        gone
    }

    /// The count of an entry taken out.
    fn forget(&mut self, e: Entry<T>) -> T {
        if !e.checking {
            self.unchecked -= 1;
        }
        e.fd
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_the_oldest_is_checked_and_stays_until_removed() {
        let mut k = Kept::new(2);
        assert!(k.keep((1, 10), 100).is_none());
        assert!(k.keep((1, 11), 101).is_none());
        let e = k.keep((1, 12), 102).expect("over the bound");
        assert_eq!((e.id, e.fd), ((1, 10), 100));
        // Still found by a sync of its inode while it is being checked.
        assert_eq!(k.len(), 3);
        let e2 = k.keep((1, 13), 103).expect("over the bound");
        assert_eq!(
            e2.id,
            (1, 11),
            "the oldest unchecked one, not the one in its check"
        );
        assert_eq!(k.remove(e.stamp), Some(100));
        assert_eq!(k.take((1, 11)), vec![101]);
        assert_eq!(
            k.remove(e2.stamp),
            None,
            "taken by a sync of its inode meanwhile"
        );
        assert_eq!(k.len(), 2);
        assert!(k.keep((1, 14), 104).is_some(), "two unchecked ones at most");
    }

    #[test]
    fn a_sync_of_an_inode_takes_all_of_its_entries() {
        let mut k = Kept::new(8);
        assert!(k.keep((1, 10), 1).is_none());
        assert!(k.keep((1, 11), 2).is_none());
        assert!(k.keep((1, 10), 3).is_none());
        assert_eq!(k.take((1, 10)), vec![1, 3]);
        assert!(k.take((1, 10)).is_empty());
        assert_eq!(k.len(), 1);
    }

    #[test]
    fn a_syncfs_lets_go_of_what_was_kept_before_it_started() {
        let mut k = Kept::new(8);
        assert!(k.keep((1, 10), 1).is_none());
        assert!(k.keep((1, 11), 2).is_none());
        let started = k.now();
        assert!(k.keep((1, 10), 3).is_none());
        assert_eq!(k.release_before(started), vec![1, 2]);
        assert_eq!(k.take((1, 10)), vec![3], "kept after the syncfs started");
        assert!(k.is_empty());
        // The count of unchecked entries followed: the bound holds again in full.
        for i in 0..8 {
            assert!(k.keep((1, 20 + i), 10).is_none());
        }
        assert!(k.keep((1, 30), 11).is_some());
    }
}
