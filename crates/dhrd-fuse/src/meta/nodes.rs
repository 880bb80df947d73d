//! The kernel's view of inodes: node id -> (parent, name) so that a path below the backing
//! root can be rebuilt for each request without keeping a descriptor per inode, and an open
//! descriptor for directories the kernel holds (up to `DIR_FDS_MAX`), so that a request
//! resolves its node from the nearest kept directory instead of from the root: a lookup,
//! create or unlink in a kept directory is then one system call on the backing, not an
//! `openat2` walk of the whole path, an `fstat` and a `close` first.
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
//! - A kept directory descriptor names the node's inode (checked when it was opened) and
//!   lives exactly as long as the node has a name: it goes with the node (forget) and with
//!   its last link (rmdir, renamed over), after which path-based access says ESTALE as
//!   before. A rename keeps it: the descriptor follows the inode, as the node does.
//!
//! - An entry the kernel gets carries the node's generation (`NodeTable::generation`): a new
//!   inode reusing the number of one the kernel still holds gets a different one.
//!
//! Nothing here touches the disk; there are no crash semantics.

use crate::error::{FsError, Result};
use crate::kernel::Ino;
use crate::sys::FUSE_ROOT_INO;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// Deepest directory nesting a path is rebuilt for; a longer parent chain means a cycle
/// (a bug or a tree changed behind our back) and fails with ESTALE.
pub const PATH_DEPTH_MAX: usize = 4096;
/// Directory descriptors kept at most. Past it a directory is resolved from its nearest
/// kept ancestor (or the root) at each request, as every node was before; a directory the
/// kernel forgets gives its slot back.
pub const DIR_FDS_MAX: usize = 8192;

#[derive(Debug)]
struct Node {
    /// Names under which the daemon saw this inode and that were not unlinked since,
    /// most recent last. Usually one; several for hard links.
    links: Vec<(Ino, OsString)>,
    lookups: u64,
    /// Links of other nodes whose parent is this node.
    children: u64,
    /// Directories: the backing directory, open (`O_RDONLY | O_DIRECTORY`), if kept.
    dir: Option<Arc<OwnedFd>>,
    /// The FUSE generation of the inode the node stands for now (see `generation`).
    generation: u64,
    /// Its inode lost its last link through the mount while the kernel still held it:
    /// the next inode to show up under this number is another one.
    gone: bool,
}

impl Node {
    /// The inode under this number is a new one if the old one is gone.
    fn next_inode_if_gone(&mut self) {
        if self.gone {
            self.gone = false;
            self.generation += 1;
        }
    }
}

/// Where a node is resolved from: a kept directory descriptor and the path below it
/// (empty when the node itself is that directory), or the backing root and the whole path.
#[derive(Debug)]
pub struct Anchor {
    pub dir: Option<Arc<OwnedFd>>,
    pub rel: PathBuf,
}

#[derive(Debug)]
pub struct NodeTable {
    map: HashMap<Ino, Node>,
    /// Nodes with a kept directory descriptor, and how many may have one.
    dir_fds: usize,
    dir_fds_max: usize,
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
                dir: None,
                generation: 0,
                gone: false,
            },
        );
        Self {
            map,
            dir_fds: 0,
            dir_fds_max: DIR_FDS_MAX,
        }
    }

    /// A table that keeps at most `n` directory descriptors.
    pub fn with_dir_fds_max(n: usize) -> Self {
        Self {
            dir_fds_max: n,
            ..Self::new()
        }
    }

    /// The nearest node on `ino`'s path, itself included, whose directory descriptor is
    /// kept, and the path from there; the backing root and the whole path if none is.
    pub fn anchor(&self, ino: Ino) -> Result<Anchor> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        for _ in 0..PATH_DEPTH_MAX {
            let kept = if cur.0 == FUSE_ROOT_INO {
                // The root: its kept descriptor, else the caller's root descriptor.
                Some(self.map.get(&cur).and_then(|n| n.dir.clone()))
            } else {
                let n = self.map.get(&cur).ok_or(FsError::Stale)?;
                n.dir.as_ref().map(|d| Some(d.clone()))
            };
            if let Some(dir) = kept {
                let mut rel = PathBuf::new();
                for n in parts.iter().rev() {
                    rel.push(n);
                }
                return Ok(Anchor { dir, rel });
            }
            let n = self.map.get(&cur).ok_or(FsError::Stale)?;
            let (parent, name) = n.links.last().ok_or(FsError::Stale)?;
            parts.push(name);
            cur = *parent;
        }
        Err(FsError::Stale)
    }

    /// The kept descriptor of directory `ino`, if any.
    pub fn kept_dir(&self, ino: Ino) -> Option<Arc<OwnedFd>> {
        self.map.get(&ino).and_then(|n| n.dir.clone())
    }

    /// Keeps `fd`, an open descriptor of directory node `ino` (checked by the caller to be
    /// that inode), while the node lives and has a name; not past the table's bound
    /// (`DIR_FDS_MAX` by default), and not for a node that has one already or no name.
    pub fn keep_dir(&mut self, ino: Ino, fd: Arc<OwnedFd>) {
        if self.dir_fds >= self.dir_fds_max {
            return;
        }
        if let Some(n) = self.map.get_mut(&ino) {
            if n.dir.is_none() && (!n.links.is_empty() || ino.0 == FUSE_ROOT_INO) {
                n.dir = Some(fd);
                self.dir_fds += 1;
            }
        }
    }

    /// Kept directory descriptors now.
    pub fn dir_fds(&self) -> usize {
        self.dir_fds
    }

    /// Removes a node and gives back its directory descriptor's slot.
    fn remove_node(&mut self, ino: Ino) -> Option<Node> {
        let n = self.map.remove(&ino)?;
        if n.dir.is_some() {
            self.dir_fds -= 1;
        }
        Some(n)
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
                n.next_inode_if_gone();
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
                        dir: None,
                        generation: 0,
                        gone: false,
                    },
                );
                true
            }
        };
        if added {
            self.add_child(parent);
        }
    }

    /// The generation to send with an entry of `ino` (lookup, create, readdirplus). Node
    /// ids are backing inode numbers, which the backing reuses: a new inode under the
    /// number of one the kernel still holds (a deleted directory that is some process's
    /// working directory, say) must not merge with it in the kernel (`fuse_iget` tells
    /// them apart by generation only). So a node whose inode lost its last link
    /// (`inode_gone`) gets the next generation when the number shows up again. A node the
    /// kernel forgot is removed, and no kernel inode of that number is left: a new node
    /// starts at 0 again, as does an unknown one.
    pub fn generation(&mut self, ino: Ino) -> u64 {
        match self.map.get_mut(&ino) {
            Some(n) => {
                n.next_inode_if_gone();
                n.generation
            }
            None => 0,
        }
    }

    /// Inode `ino` lost its last link through the mount (unlink, rmdir, renamed over, a
    /// create undone): its number may come back as another inode.
    pub fn inode_gone(&mut self, ino: Ino) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.gone = true;
        }
    }

    fn add_child(&mut self, parent: Ino) {
        // The kernel holds the parent it asks in, so its node is known: a child counted
        // nowhere would let the parent go and its path could not be rebuilt.
        debug_assert!(
            self.map.contains_key(&parent),
            "a child of unknown node {parent:?}"
        );
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
                    debug_assert!(n.children > 0, "node {p:?} lost a child it never counted");
                    n.children = n.children.saturating_sub(1);
                    n.children == 0 && n.lookups == 0 && p.0 != FUSE_ROOT_INO
                }
                None => false,
            };
            if remove {
                if let Some(n) = self.remove_node(p) {
                    stack.extend(n.links.iter().map(|(pp, _)| *pp));
                }
            }
        }
    }

    /// The kernel dropped `n` references.
    /// Lookups the kernel holds on `ino` as counted here (0 for an unknown node).
    pub fn lookups(&self, ino: Ino) -> u64 {
        self.map.get(&ino).map_or(0, |n| n.lookups)
    }

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
            if let Some(node) = self.remove_node(ino) {
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
                    // A removed directory: its descriptor would reach a dead inode, where
                    // path-based access says ESTALE.
                    if n.links.is_empty() && n.dir.take().is_some() {
                        self.dir_fds -= 1;
                    }
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
        // The node's descriptor follows the inode through the rename.
        let Some(dir) = self.map.get_mut(&ino).map(|n| n.dir.take()) else {
            return;
        };
        if dir.is_some() {
            self.dir_fds -= 1;
        }
        self.unlinked(ino, parent, name);
        if let Some(n) = self.map.get_mut(&ino) {
            n.links.push((new_parent, new_name.to_owned()));
        }
        self.add_child(new_parent);
        if let Some(fd) = dir {
            self.keep_dir(ino, fd);
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
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::path::Path;

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

    fn fd() -> Arc<OwnedFd> {
        Arc::new(std::fs::File::open("/").expect("open /").into())
    }

    #[test]
    fn kept_directories_anchor_paths_and_go_with_their_last_name() {
        let mut t = NodeTable::new();
        let root = Ino(FUSE_ROOT_INO);
        t.remember(Ino(10), root, OsStr::new("a"));
        t.remember(Ino(11), Ino(10), OsStr::new("b"));
        t.remember(Ino(12), Ino(11), OsStr::new("f"));
        let a = t.anchor(Ino(12)).expect("anchor");
        assert!(a.dir.is_none() && a.rel == Path::new("a/b/f"), "{a:?}");
        t.keep_dir(Ino(10), fd());
        let a = t.anchor(Ino(12)).expect("anchor");
        assert!(a.dir.is_some() && a.rel == Path::new("b/f"), "{a:?}");
        let a = t.anchor(Ino(10)).expect("anchor");
        assert!(a.dir.is_some() && a.rel.as_os_str().is_empty());
        assert_eq!(t.dir_fds(), 1);
        // A rename keeps the descriptor: it follows the inode.
        t.renamed(Ino(10), root, OsStr::new("a"), root, OsStr::new("z"));
        assert!(t.kept_dir(Ino(10)).is_some());
        assert_eq!(t.dir_fds(), 1);
        // The last name gone (rmdir): the descriptor goes, paths say ESTALE.
        t.unlinked(Ino(10), root, OsStr::new("z"));
        assert!(t.kept_dir(Ino(10)).is_none());
        assert_eq!(t.dir_fds(), 0);
        assert!(t.anchor(Ino(12)).is_err());
        // A forgotten node gives its slot back.
        t.remember(Ino(20), root, OsStr::new("c"));
        t.keep_dir(Ino(20), fd());
        assert_eq!(t.dir_fds(), 1);
        t.forget(Ino(20), 1);
        assert_eq!(t.dir_fds(), 0);
        // Bounded: past DIR_FDS_MAX nothing more is kept (one descriptor shared here).
        let shared = fd();
        for i in 0..(DIR_FDS_MAX as u64 + 5) {
            let ino = Ino(1000 + i);
            t.remember(ino, root, OsStr::new(&format!("d{i}")));
            t.keep_dir(ino, shared.clone());
        }
        assert_eq!(t.dir_fds(), DIR_FDS_MAX);
        assert!(t.kept_dir(Ino(1000 + DIR_FDS_MAX as u64)).is_none());
    }

    #[test]
    fn a_reused_inode_number_gets_a_new_generation_while_the_old_inode_is_held() {
        let mut t = NodeTable::new();
        let (n, root) = (Ino(42), Ino(FUSE_ROOT_INO));
        assert_eq!(t.generation(n), 0, "unknown");
        t.remember(n, root, OsStr::new("a"));
        assert_eq!(t.generation(n), 0);
        // Deleted while the kernel holds it; the number comes back as a new inode.
        t.unlinked(n, root, OsStr::new("a"));
        t.inode_gone(n);
        t.remember(n, root, OsStr::new("b"));
        assert_eq!(t.generation(n), 1, "the new inode is told apart");
        assert_eq!(t.generation(n), 1, "and keeps its generation");
        // Both kernel inodes forgotten: no inode of that number is left in the kernel.
        t.forget(n, 2);
        assert_eq!(t.generation(n), 0);
    }
}
