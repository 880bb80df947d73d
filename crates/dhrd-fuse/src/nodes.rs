//! The kernel's view of inodes: node id -> (parent, name) so that a path below the backing
//! root can be rebuilt for each request without keeping a descriptor per inode.
//!
//! Invariants:
//! - Node ids equal backing inode numbers (with the root swapped to 1, see
//!   `BackingDir::fuse_ino`), so hard links share a node and `ls -i` is consistent.
//! - A node stays while the kernel holds lookups on it or while it is the recorded parent of
//!   another node (`children`), so a path can always be rebuilt for a live node.
//! - A node keeps every `(parent, name)` under which the daemon saw it that was not unlinked
//!   since (several for hard links), and builds paths from the most recent one. When the
//!   last one is unlinked or renamed over, path-based access fails with ESTALE; open files
//!   keep working through their object's descriptor.
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
    /// Names under which the daemon saw this inode and that were not unlinked since,
    /// most recent last. Usually one; several for hard links.
    links: Vec<(Ino, OsString)>,
    lookups: u64,
    /// Links of other nodes whose parent is this node.
    children: u64,
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
                links: Vec::new(),
                lookups: 1,
                children: 0,
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
            let (parent, name) = n.links.last().ok_or(FsError::Stale)?;
            parts.push(name);
            cur = *parent;
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
        let added = match self.map.get_mut(&ino) {
            Some(n) => {
                n.lookups += 1;
                match n.links.iter().position(|(p, m)| *p == parent && m == name) {
                    Some(i) => {
                        // Most recent last: the name just seen is the likeliest to be valid.
                        let l = n.links.remove(i);
                        n.links.push(l);
                        false
                    }
                    None => {
                        n.links.push((parent, name.to_owned()));
                        true
                    }
                }
            }
            None => {
                self.map.insert(
                    ino,
                    Node {
                        links: vec![(parent, name.to_owned())],
                        lookups: 1,
                        children: 0,
                    },
                );
                true
            }
        };
        if added {
            self.add_child(parent);
        }
    }

    fn add_child(&mut self, parent: Ino) {
        if let Some(p) = self.map.get_mut(&parent) {
            p.children += 1;
        }
    }

    /// One link below `parent` went away; removes `parent` if nothing holds it any more.
    fn drop_child(&mut self, parent: Ino) {
        let mut stack = vec![parent];
        while let Some(p) = stack.pop() {
            let remove = match self.map.get_mut(&p) {
                Some(n) => {
                    n.children = n.children.saturating_sub(1);
                    n.children == 0 && n.lookups == 0 && p.0 != FUSE_ROOT_INO
                }
                None => false,
            };
            if remove {
                if let Some(n) = self.map.remove(&p) {
                    stack.extend(n.links.iter().map(|(pp, _)| *pp));
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
            if let Some(node) = self.map.remove(&ino) {
                for (p, _) in node.links {
                    self.drop_child(p);
                }
            }
        }
    }

    /// `parent/name` no longer names `ino` (unlink, rmdir, renamed over).
    pub fn unlinked(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        let removed = match self.map.get_mut(&ino) {
            Some(n) => match n.links.iter().position(|(p, m)| *p == parent && m == name) {
                Some(i) => {
                    n.links.remove(i);
                    true
                }
                None => false,
            },
            None => false,
        };
        if removed {
            self.drop_child(parent);
        }
    }

    /// `ino` moved from `parent/name` to `new_parent/new_name`.
    pub fn renamed(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
    ) {
        if !self.map.contains_key(&ino) {
            return;
        }
        self.unlinked(ino, parent, name);
        if let Some(n) = self.map.get_mut(&ino) {
            n.links.push((new_parent, new_name.to_owned()));
        }
        self.add_child(new_parent);
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
        t.renamed(Ino(10), root, OsStr::new("a"), root, OsStr::new("z"));
        assert_eq!(t.path(Ino(11)).ok(), Some(PathBuf::from("z/b")));
        // The directory is forgotten by the kernel but still parents a live node.
        t.forget(Ino(10), 1);
        assert_eq!(t.path(Ino(11)).ok(), Some(PathBuf::from("z/b")));
        t.forget(Ino(11), 1);
        assert_eq!(t.len(), 1);
        t.remember(Ino(12), root, OsStr::new("c"));
        t.unlinked(Ino(12), root, OsStr::new("c"));
        assert!(t.path(Ino(12)).is_err());
        // Hard links: unlinking the most recent name falls back to the other one.
        t.remember(Ino(13), root, OsStr::new("h1"));
        t.remember(Ino(13), Ino(FUSE_ROOT_INO), OsStr::new("h2"));
        t.unlinked(Ino(13), root, OsStr::new("h2"));
        assert_eq!(t.path(Ino(13)).ok(), Some(PathBuf::from("h1")));
    }
}
