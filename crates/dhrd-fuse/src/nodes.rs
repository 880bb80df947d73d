//! The kernel's view of inodes: node id -> (parent, name) so that a path below the backing
//! root can be rebuilt for each request without keeping a descriptor per inode.
//!
//! Invariants:
//! - Node ids equal backing inode numbers (with the root swapped to 1, see
//!   `BackingDir::fuse_ino`), so hard links share a node and `ls -i` is consistent.
//! - A node stays while the kernel holds lookups on it or while it is the recorded parent of
//!   another node (`children`), so a path can always be rebuilt for a live node.
//! - `(parent, name)` is the last name under which the daemon saw the inode. When that name
//!   is unlinked or renamed over, the node is marked `unlinked` and path-based access fails
//!   with ESTALE; open files keep working through their object's descriptor.
//!
//! Nothing here touches the disk; there are no crash semantics.

use crate::error::{FsError, Result};
use crate::sys::FUSE_ROOT_INO;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Deepest directory nesting a path is rebuilt for; a longer parent chain means a cycle
/// (a bug or a tree changed behind our back) and fails with ESTALE.
pub const PATH_DEPTH_MAX: usize = 4096;

/// A FUSE node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

/// A FUSE file handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fh(pub u64);

#[derive(Debug)]
struct Node {
    parent: Ino,
    name: OsString,
    lookups: u64,
    children: u64,
    unlinked: bool,
}

#[derive(Debug)]
pub struct NodeTable {
    map: HashMap<Ino, Node>,
}

impl Default for NodeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeTable {
    pub fn new() -> Self {
        let mut map = HashMap::new();
        map.insert(
            Ino(FUSE_ROOT_INO),
            Node {
                parent: Ino(FUSE_ROOT_INO),
                name: OsString::new(),
                lookups: 1,
                children: 0,
                unlinked: false,
            },
        );
        Self { map }
    }

    /// Path of `ino` relative to the backing root ("" for the root).
    pub fn path(&self, ino: Ino) -> Result<PathBuf> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        for _ in 0..PATH_DEPTH_MAX {
            if cur.0 == FUSE_ROOT_INO {
                let mut p = PathBuf::new();
                for n in parts.iter().rev() {
                    p.push(n);
                }
                return Ok(p);
            }
            let n = self.map.get(&cur).ok_or(FsError::Stale)?;
            if n.unlinked {
                return Err(FsError::Stale);
            }
            parts.push(&n.name);
            cur = n.parent;
        }
        Err(FsError::Stale)
    }

    /// Path of the child `name` of `parent`.
    pub fn child_path(&self, parent: Ino, name: &OsStr) -> Result<PathBuf> {
        let mut p = self.path(parent)?;
        p.push(name);
        Ok(p)
    }

    /// Records that the kernel got a reference to `ino` under `parent/name` (lookup, create,
    /// mkdir, link, ...).
    pub fn remember(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        if ino.0 == FUSE_ROOT_INO {
            return;
        }
        let old_parent = match self.map.get_mut(&ino) {
            Some(n) => {
                n.lookups += 1;
                let old = n.parent;
                n.parent = parent;
                n.name = name.to_owned();
                n.unlinked = false;
                Some(old)
            }
            None => {
                self.map.insert(
                    ino,
                    Node {
                        parent,
                        name: name.to_owned(),
                        lookups: 1,
                        children: 0,
                        unlinked: false,
                    },
                );
                None
            }
        };
        match old_parent {
            Some(old) if old == parent => {}
            Some(old) => {
                self.add_child(parent);
                self.drop_child(old);
            }
            None => self.add_child(parent),
        }
    }

    fn add_child(&mut self, parent: Ino) {
        if let Some(p) = self.map.get_mut(&parent) {
            p.children += 1;
        }
    }

    fn drop_child(&mut self, parent: Ino) {
        let remove = match self.map.get_mut(&parent) {
            Some(p) => {
                p.children = p.children.saturating_sub(1);
                p.children == 0 && p.lookups == 0 && parent.0 != FUSE_ROOT_INO
            }
            None => false,
        };
        if remove {
            self.remove(parent);
        }
    }

    fn remove(&mut self, ino: Ino) {
        // Iterative: removing a node may release its parent, and so on up the tree.
        let mut cur = Some(ino);
        while let Some(i) = cur.take() {
            if let Some(n) = self.map.remove(&i) {
                if let Some(p) = self.map.get_mut(&n.parent) {
                    p.children = p.children.saturating_sub(1);
                    if p.children == 0 && p.lookups == 0 && n.parent.0 != FUSE_ROOT_INO {
                        cur = Some(n.parent);
                    }
                }
            }
        }
    }

    /// The kernel dropped `n` references.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if ino.0 == FUSE_ROOT_INO {
            return;
        }
        let remove = match self.map.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0 && node.children == 0
            }
            None => false,
        };
        if remove {
            self.remove(ino);
        }
    }

    /// `parent/name` no longer names `ino` (unlink, rmdir, renamed over).
    pub fn unlinked(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        if let Some(n) = self.map.get_mut(&ino) {
            if n.parent == parent && n.name == name {
                n.unlinked = true;
            }
        }
    }

    /// `ino` moved from `parent/name` to `new_parent/new_name`.
    pub fn renamed(&mut self, ino: Ino, new_parent: Ino, new_name: &OsStr) {
        let old = match self.map.get_mut(&ino) {
            Some(n) => {
                let old = n.parent;
                n.parent = new_parent;
                n.name = new_name.to_owned();
                n.unlinked = false;
                old
            }
            None => return,
        };
        if old != new_parent {
            self.add_child(new_parent);
            self.drop_child(old);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_renames_and_forgets() {
        let mut t = NodeTable::new();
        let root = Ino(FUSE_ROOT_INO);
        t.remember(Ino(10), root, OsStr::new("a"));
        t.remember(Ino(11), Ino(10), OsStr::new("b"));
        assert_eq!(t.path(Ino(11)).ok(), Some(PathBuf::from("a/b")));
        t.renamed(Ino(10), root, OsStr::new("z"));
        assert_eq!(t.path(Ino(11)).ok(), Some(PathBuf::from("z/b")));
        // The directory is forgotten by the kernel but still parents a live node.
        t.forget(Ino(10), 1);
        assert_eq!(t.path(Ino(11)).ok(), Some(PathBuf::from("z/b")));
        t.forget(Ino(11), 1);
        assert_eq!(t.len(), 1);
        t.remember(Ino(12), root, OsStr::new("c"));
        t.unlinked(Ino(12), root, OsStr::new("c"));
        assert!(t.path(Ino(12)).is_err());
    }
}
