//! The namespace ([`Namespace`]): the kernel's nodes and the backing inodes they stand
//! for, and the metadata requests: names (`entries`), attributes (`setattr`), listings
//! (`listing`), xattrs (`xattr`), all as confined `*at` system calls on the backing
//! directory (`sys.rs`). File data is the data path's (`Files`), which the namespace
//! tells when a file loses its last name and asks for sizes it holds.
//!
//! Invariants:
//! - The daemon is the only writer of the tree while mounted; the kernel caches entries
//!   and attributes for `ATTR_TTL` because every change passes through here. The one
//!   change the kernel does not expect is the set-id bits a write or fallocate drops
//!   (killpriv.rs); the data path tells the kernel when it drops them.
//! - A node resolves to the backing inode it was looked up as, or the request fails with
//!   ESTALE (`node_fd`): a name that now leads elsewhere is never acted on.
//! - Node ids equal backing inode numbers (the root is 1), see `nodes.rs`.
//!
//! Crash semantics: those of the changes (`entries`, `setattr`, `xattr`); resolving nodes
//! writes nothing.

mod dir_handles;
mod entries;
mod listing;
pub mod nodes;
mod setattr;
mod xattr;

use crate::config::STAT_BLKSIZE;
use crate::data::Files;
use crate::durable::SyncPolicy;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, Entry, FileKind, Ino};
use crate::stats::FsStats;
use crate::sys::{self, BackingDir};
use dir_handles::DirHandles;
use nodes::NodeTable;
use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The kernel's nodes and the requests on names, attributes, listings and xattrs.
pub struct Namespace {
    dir: Arc<BackingDir>,
    nodes: Mutex<NodeTable>,
    dirs: DirHandles,
    sync: Arc<SyncPolicy>,
    files: Arc<Files>,
    stats: Arc<FsStats>,
    /// The daemon runs as root: it gives new inodes to their callers (`chown_new`).
    daemon_is_root: bool,
}

fn systime(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    }
}

impl Namespace {
    /// `dir_fds_max`: directory descriptors the node table keeps at most (nodes.rs).
    pub fn new(
        dir: Arc<BackingDir>,
        dir_fds_max: usize,
        sync: Arc<SyncPolicy>,
        files: Arc<Files>,
        stats: Arc<FsStats>,
    ) -> Result<Self> {
        let mut nodes = NodeTable::with_dir_fds_max(dir_fds_max);
        let root = dir
            .root_fd()
            .try_clone_to_owned()
            .map_err(|e| FsError::io("dup of the backing root", e))?;
        nodes.keep_dir(Ino(sys::FUSE_ROOT_INO), Arc::new(root));
        Ok(Self {
            dir,
            nodes: Mutex::new(nodes),
            dirs: DirHandles::default(),
            sync,
            files,
            stats,
            daemon_is_root: rustix::process::geteuid().is_root(),
        })
    }

    /// LOOKUP of `name` in `parent`: the entry, its lookup counted.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Entry> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let attr = self.lookup_in(parent, &pfd, name)?;
        Ok(self.entry(attr))
    }

    /// The entry to send for `attr`, with the node's generation.
    pub fn entry(&self, attr: Attr) -> Entry {
        Entry {
            attr,
            generation: self.generation(&attr),
        }
    }

    /// FORGET: the kernel dropped `n` lookups of `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        self.nodes.lock().forget(ino, n);
    }

    /// The node table, for tests that look at its bookkeeping.
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> parking_lot::MutexGuard<'_, NodeTable> {
        self.nodes.lock()
    }

    /// Opens node `ino` confined and checks it is still the same backing inode. The path
    /// is resolved from the nearest kept directory on it (nodes.rs), else from the root.
    /// Always a descriptor of its own: an open directory's read position is its own.
    pub fn node_fd(&self, ino: Ino, flags: OFlags) -> Result<(OwnedFd, libc::stat)> {
        let a = self.nodes.lock().anchor(ino)?;
        let base = match &a.dir {
            Some(d) => d.as_fd(),
            None => self.dir.root_fd(),
        };
        let fd = sys::open_confined(base, a.rel.as_os_str(), flags, Mode::empty()).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ENOENT) => FsError::Stale,
                _ => FsError::io("open below the backing directory", e),
            },
        )?;
        let st = sys::fstat(fd.as_fd())?;
        self.check_same_node(ino, &st)?;
        Ok((fd, st))
    }

    /// ESTALE unless `st` is node `ino`'s backing inode.
    fn check_same_node(&self, ino: Ino, st: &libc::stat) -> Result<()> {
        if self.dir.fuse_ino(st.st_ino) != ino.0 || st.st_dev != self.dir.dev() {
            return Err(FsError::Stale);
        }
        Ok(())
    }

    /// The descriptor of directory `ino` (readable, so it can be fsync'ed), kept from its
    /// first use while the node lives (nodes.rs): a lookup, create or unlink in it is then
    /// one system call on the backing.
    pub fn dir_fd(&self, ino: Ino) -> Result<Arc<OwnedFd>> {
        if let Some(fd) = self.nodes.lock().kept_dir(ino) {
            return Ok(fd);
        }
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(FsError::Errno(libc::ENOTDIR));
        }
        let fd = Arc::new(fd);
        self.nodes.lock().keep_dir(ino, fd.clone());
        Ok(fd)
    }

    /// The backing inode's status of node `ino`, or of its open file when its name is
    /// gone (an unlinked file that is still open). A kept directory is one `fstat`, a node
    /// one name below a kept directory one `fstatat`; deeper ones are opened by path.
    pub fn stat_node(&self, ino: Ino) -> Result<libc::stat> {
        let r = (|| {
            let a = self.nodes.lock().anchor(ino)?;
            let base = match &a.dir {
                Some(d) => d.as_fd(),
                None => self.dir.root_fd(),
            };
            let mut parts = a.rel.components();
            match (parts.next(), parts.next()) {
                (None, _) => Ok(sys::fstat(base)?),
                (Some(one), None) => {
                    let st = sys::stat_at(base, one.as_os_str()).map_err(|e| {
                        match e.raw_os_error() {
                            Some(libc::ENOENT) => FsError::Stale,
                            _ => FsError::from(e),
                        }
                    })?;
                    self.check_same_node(ino, &st)?;
                    Ok(st)
                }
                _ => self.node_fd(ino, OFlags::PATH).map(|(_, st)| st),
            }
        })();
        match r {
            Err(FsError::Stale) => {
                let key = self.dir.backing_ino(ino.0);
                self.files.stat_open(key).ok_or(FsError::Stale)
            }
            r => r,
        }
    }

    pub fn parent_and_name(&self, ino: Ino) -> Result<(Ino, OsString)> {
        let nodes = self.nodes.lock();
        let path = nodes.path(ino)?;
        drop(nodes);
        // Rebuild the parent from the path: the node table stores it, but reading it via
        // the path keeps one source of truth.
        let name = path
            .file_name()
            .ok_or(FsError::Errno(libc::EPERM))?
            .to_owned();
        let parent_path = path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
        let fd = self
            .dir
            .open_rel(&parent_path, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|_| FsError::Stale)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok((Ino(self.dir.fuse_ino(st.st_ino)), name))
    }

    pub fn attr(&self, st: &libc::stat) -> Attr {
        let ino = self.dir.fuse_ino(st.st_ino);
        let kind = FileKind::of_mode(st.st_mode);
        let mut size = st.st_size as u64;
        if kind == FileKind::RegularFile {
            // The engine's RAM copy is authoritative for the size (ahead of the backing in
            // the non-sync modes); the page cache path's is the backing file's own.
            if let Some(len) = self.files.size_of(st.st_ino) {
                size = len;
            }
        }
        Attr {
            ino,
            size,
            blocks: st.st_blocks as u64,
            atime: systime(st.st_atime, st.st_atime_nsec),
            mtime: systime(st.st_mtime, st.st_mtime_nsec),
            ctime: systime(st.st_ctime, st.st_ctime_nsec),
            kind,
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: sys::encode_fuse_rdev(st.st_rdev),
            blksize: STAT_BLKSIZE,
        }
    }

    /// Attributes for an entry the kernel will not link: READDIRPLUS's ".", "..", an entry
    /// on another file system, and negative LOOKUP replies; node 0, nothing else is read.
    pub fn placeholder_attr(&self) -> Attr {
        Attr::placeholder(STAT_BLKSIZE)
    }

    /// Stats `parent/name`, records the node and returns its attributes.
    pub fn lookup_in(&self, parent: Ino, pfd: &OwnedFd, name: &OsStr) -> Result<Attr> {
        let st = sys::stat_at(pfd.as_fd(), name)?;
        if st.st_dev != self.dir.dev() {
            // Another file system mounted below the backing directory is not part of it.
            return Err(FsError::Errno(libc::EXDEV));
        }
        let attr = self.attr(&st);
        self.nodes.lock().remember(Ino(attr.ino), parent, name);
        Ok(attr)
    }

    /// Opens the backing file of regular-file node `ino` read-write (for either data path).
    pub fn open_backing_file(&self, ino: Ino) -> Result<File> {
        self.open_backing_file_stat(ino).map(|(f, _)| f)
    }

    /// `open_backing_file`, with the status the check took.
    pub fn open_backing_file_stat(&self, ino: Ino) -> Result<(File, libc::stat)> {
        let (fd, st) = self.node_fd(ino, OFlags::RDWR)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::Errno(libc::EINVAL));
        }
        Ok((File::from(fd), st))
    }

    pub fn display_name(&self, ino: Ino) -> String {
        match self.nodes.lock().path(ino) {
            Ok(p) => p.display().to_string(),
            Err(_) => format!("inode {}", ino.0),
        }
    }

    /// The generation to send with entry `attr` (`NodeTable::generation`).
    pub fn generation(&self, attr: &Attr) -> u64 {
        self.nodes.lock().generation(Ino(attr.ino))
    }

    /// The kernel will never get entry `attr` that was counted as looked up: the count goes.
    pub fn entry_not_sent(&self, attr: &Attr) {
        self.nodes.lock().forget(Ino(attr.ino), 1);
    }
}
