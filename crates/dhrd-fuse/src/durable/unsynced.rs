//! The directory entries not yet durable, per directory (`fsync` and `periodic:N` modes):
//! what an application's fsync must sync besides its file, instead of a `syncfs` of the
//! whole backing file system.
//!
//! Every create, mknod, mkdir, symlink, link, rename and unlink through the mount is
//! recorded, after the change, as a change of its directory (both directories for a
//! rename), with the inode the new entry names, if any. An fsync of a file then syncs the
//! directories whose recorded entries name it, and, transitively, the directories whose
//! recorded entries name those (a file in a new directory becomes durable with its whole
//! path, as ext4 does with and without a journal); an fsyncdir syncs the directory and
//! its path the same way. What a backing needs besides the directory's fsync depends on
//! its file system (`sys::Journal`):
//! - a journal shared by every inode (ext4, xfs): an fsync of a directory commits the
//!   journal transaction holding the new inodes its entries name, of every kind
//!   (symlinks, FIFOs, sockets, device nodes, link counts), so the directories suffice;
//! - otherwise (ext4 without a journal, btrfs, unknown): the new inodes are written too,
//!   before the directory: regular files and directories by an fsync of their own, and a
//!   `syncfs` where an inode cannot be opened for fsync (symlinks, FIFOs, sockets, device
//!   nodes) or a directory names more new inodes than are worth an fsync each.
//!
//! Invariants:
//! - A change is recorded after it is made, with a sequence number; a sync removes only
//!   what was recorded before it started (`Plan::seq`), so a change never leaves the
//!   record before a sync that began after it returned.
//! - The record is bounded (`dirs_max` directories, `ENTRIES_MAX` entries); past that it
//!   stops recording and the next sync of names is a `syncfs` (`Plan::syncfs`), after
//!   which recording starts afresh.
//!
//! Crash semantics: none of its own; what is durable when is `SyncPolicy::sync_names`'s.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// Entries recorded at most; past it the next sync of names is a syncfs.
pub const ENTRIES_MAX: usize = 1 << 16;

/// A recorded entry: the name in its directory and the inode it named then.
#[derive(Clone, Debug)]
pub struct Named {
    seq: u64,
    pub name: OsString,
    pub ino: u64,
    /// The inode can be opened and fsync'ed (a regular file or a directory).
    pub openable: bool,
}

/// A directory with changes not yet durable.
struct Dir {
    fd: Arc<OwnedFd>,
    /// Sequence number of its last change.
    changed: u64,
    named: Vec<Named>,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    dirs: HashMap<u64, Dir>,
    /// Inode -> the directories whose recorded entries name it.
    named_in: HashMap<u64, Vec<u64>>,
    entries: usize,
    /// More changed than the record holds, since this sequence number: the next sync of
    /// names is a syncfs.
    overflow: Option<u64>,
}

/// What one sync of names must make durable, taken from the record.
pub struct Plan {
    /// Changes recorded up to this sequence number are covered once the plan is done.
    pub seq: u64,
    /// The record overflowed: only a syncfs covers what it lost.
    pub syncfs: bool,
    /// Directories (backing inode, descriptor, the inodes their new entries name), the
    /// ones nearest the synced inode first.
    pub dirs: Vec<(u64, Arc<OwnedFd>, Vec<Named>)>,
}

/// The record (see the module header).
pub struct Unsynced {
    inner: Mutex<Inner>,
    dirs_max: usize,
}

impl Unsynced {
    /// `dirs_max`: directories recorded at most (each holds a descriptor, shared with the
    /// node table's while it keeps the directory).
    pub fn new(dirs_max: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            dirs_max,
        }
    }

    /// An entry of directory `dir_ino` (open as `dir`) changed; `named`: the name and
    /// inode of its new entry, and whether that inode can be fsync'ed by descriptor.
    pub fn changed(&self, dir_ino: u64, dir: &Arc<OwnedFd>, named: Option<(&OsStr, u64, bool)>) {
        let mut g = self.inner.lock();
        g.seq += 1;
        let seq = g.seq;
        if g.overflow.is_some() {
            g.overflow = Some(seq);
            return;
        }
        let full = g.entries >= ENTRIES_MAX
            || (!g.dirs.contains_key(&dir_ino) && g.dirs.len() >= self.dirs_max);
        if full {
            g.overflow = Some(seq);
            return;
        }
        let d = g.dirs.entry(dir_ino).or_insert_with(|| Dir {
            fd: dir.clone(),
            changed: seq,
            named: Vec::new(),
        });
        d.changed = seq;
        if let Some((name, ino, openable)) = named {
            d.named.push(Named {
                seq,
                name: name.to_owned(),
                ino,
                openable,
            });
            g.entries += 1;
            let dirs = g.named_in.entry(ino).or_default();
            if !dirs.contains(&dir_ino) {
                dirs.push(dir_ino);
            }
        }
        debug_assert!(
            g.entries <= ENTRIES_MAX && g.dirs.len() <= self.dirs_max,
            "the record of unsynced names outgrew its bounds"
        );
    }

    /// A change could not be recorded (what it named is unknown): the next sync of names
    /// is a syncfs.
    pub fn lost(&self) {
        let mut g = self.inner.lock();
        g.seq += 1;
        g.overflow = Some(g.seq);
    }

    /// What must be synced for the names of the inodes `inos` (and, for a directory among
    /// them, its own entries) to be durable: every directory whose recorded entries name
    /// one of them, and the same for those directories, up to the root.
    pub fn plan(&self, inos: &[u64]) -> Plan {
        let g = self.inner.lock();
        let mut plan = Plan {
            seq: g.seq,
            syncfs: g.overflow.is_some(),
            dirs: Vec::new(),
        };
        if plan.syncfs {
            return plan;
        }
        let mut seen: HashSet<u64> = HashSet::new();
        let mut queue: VecDeque<u64> = VecDeque::new();
        for &ino in inos {
            if g.dirs.contains_key(&ino) && seen.insert(ino) {
                queue.push_back(ino);
            }
            for &d in g.named_in.get(&ino).into_iter().flatten() {
                if seen.insert(d) {
                    queue.push_back(d);
                }
            }
        }
        while let Some(d) = queue.pop_front() {
            if let Some(dir) = g.dirs.get(&d) {
                plan.dirs.push((d, dir.fd.clone(), dir.named.clone()));
            }
            for &up in g.named_in.get(&d).into_iter().flatten() {
                if seen.insert(up) {
                    queue.push_back(up);
                }
            }
        }
        plan
    }

    /// `plan` was carried out: what it covered leaves the record.
    pub fn done(&self, plan: &Plan) {
        let mut g = self.inner.lock();
        // A plan covers only what was recorded before it was taken.
        assert!(plan.seq <= g.seq, "a sync plan from the future");
        for (d, _, _) in &plan.dirs {
            forget_dir_up_to(&mut g, *d, plan.seq);
        }
    }

    /// A syncfs that began after sequence number `seq` (`seq_now`) succeeded: everything
    /// recorded up to it is durable.
    pub fn all_synced(&self, seq: u64) {
        let mut g = self.inner.lock();
        assert!(
            seq <= g.seq,
            "a syncfs said to cover changes not yet recorded"
        );
        let dirs: Vec<u64> = g.dirs.keys().copied().collect();
        for d in dirs {
            forget_dir_up_to(&mut g, d, seq);
        }
        if g.overflow.is_some_and(|o| o <= seq) {
            g.overflow = None;
        }
    }

    /// The sequence number of the last change recorded.
    pub fn seq_now(&self) -> u64 {
        self.inner.lock().seq
    }

    /// Directories and entries recorded now.
    pub fn len(&self) -> (usize, usize) {
        let g = self.inner.lock();
        (g.dirs.len(), g.entries)
    }
}

/// Drops directory `d`'s entries recorded up to `seq`, and the directory once nothing of
/// it is left.
fn forget_dir_up_to(g: &mut Inner, d: u64, seq: u64) {
    let Some(dir) = g.dirs.get_mut(&d) else {
        return;
    };
    let (gone, kept): (Vec<Named>, Vec<Named>) = dir.named.drain(..).partition(|n| n.seq <= seq);
    // Only what was recorded up to `seq` leaves; a later change stays for a later sync.
    debug_assert!(kept.iter().all(|n| n.seq > seq));
    dir.named = kept;
    let empty = dir.named.is_empty() && dir.changed <= seq;
    let still: HashSet<u64> = dir.named.iter().map(|n| n.ino).collect();
    if empty {
        g.dirs.remove(&d);
    }
    debug_assert!(
        g.entries >= gone.len(),
        "entry count below the entries recorded"
    );
    g.entries -= gone.len();
    for n in gone {
        if still.contains(&n.ino) {
            continue;
        }
        if let Some(dirs) = g.named_in.get_mut(&n.ino) {
            dirs.retain(|x| *x != d);
            if dirs.is_empty() {
                g.named_in.remove(&n.ino);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    fn fd() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/").unwrap().into())
    }

    fn dirs(p: &Plan) -> Vec<u64> {
        p.dirs.iter().map(|(d, _, _)| *d).collect()
    }

    /// A file in a new directory: its fsync plans the directory, then the root that names
    /// the directory; an unrelated directory's change is not in the plan.
    #[test]
    fn a_plan_follows_the_names_of_an_inode_up_to_the_root() {
        let u = Unsynced::new(16);
        let (root, dir, other, file) = (2, 10, 11, 20);
        u.changed(root, &fd(), Some((OsStr::new("d"), dir, true)));
        u.changed(dir, &fd(), Some((OsStr::new("f"), file, true)));
        u.changed(other, &fd(), None);
        let p = u.plan(&[file]);
        assert!(!p.syncfs);
        assert_eq!(dirs(&p), [dir, root]);
        assert_eq!(
            dirs(&u.plan(&[dir])),
            [dir, root],
            "an fsyncdir of the directory"
        );
        u.done(&p);
        assert_eq!(dirs(&u.plan(&[file])), Vec::<u64>::new());
        assert_eq!(dirs(&u.plan(&[other])), [other]);
        assert_eq!(u.len(), (1, 0));
    }

    /// A change recorded while a plan is carried out is not covered by it: it stays.
    #[test]
    fn a_change_after_the_plan_stays_recorded() {
        let u = Unsynced::new(16);
        u.changed(1, &fd(), Some((OsStr::new("a"), 5, true)));
        let p = u.plan(&[5]);
        u.changed(1, &fd(), Some((OsStr::new("b"), 6, true)));
        u.done(&p);
        assert_eq!(dirs(&u.plan(&[5])), Vec::<u64>::new());
        let q = u.plan(&[6]);
        assert_eq!(dirs(&q), [1]);
        assert_eq!(q.dirs[0].2.len(), 1, "only b is left of directory 1");
    }

    /// Past its bounds the record stops and asks for a syncfs, once.
    #[test]
    fn an_overflow_asks_for_one_syncfs() {
        let u = Unsynced::new(2);
        u.changed(1, &fd(), None);
        u.changed(2, &fd(), None);
        u.changed(3, &fd(), None);
        let p = u.plan(&[3]);
        assert!(p.syncfs);
        u.all_synced(p.seq);
        assert!(!u.plan(&[3]).syncfs);
        assert_eq!(u.len(), (0, 0));
    }
}
