//! Metadata requests: the namespace (create, mknod, mkdir, symlink, link, rename, unlink,
//! rmdir), directory listings, xattrs and statfs, all as confined `*at` system calls on
//! the backing directory (`sys.rs`).
//!
//! Invariants:
//! - Every change is made durable per the durability mode before the reply
//!   (`Shared::meta_durable`): in `sync` mode the changed inode and its parent directory
//!   (both parents for rename) join the request's `SyncSet`, which the committer syncs
//!   with those of concurrent requests before the reply goes out. Every request that
//!   makes an entry (create, mknod, mkdir, symlink, link) goes through
//!   `Shared::entry_durable`, which names the new inode too: by descriptor where it can
//!   be fsync'ed, else (symlinks, FIFOs, sockets, device nodes, link counts) a `syncfs`.
//! - The node table follows every change (remember, unlinked, renamed), and a file whose
//!   last link goes is forgotten by the data path (`Shared::data_unlinked`).
//! - Xattrs under `trusted.dhrd.` are the daemon's own (page_tier.rs): never listed,
//!   read, set or removed through the mount.
//!
//! Crash semantics: a reply that reported success in `sync` mode is on the backing device.
//! A crash between the backing operation and its fsync leaves whatever the backing file
//! system recovers, which is either the old or the new state of that one operation.

pub mod nodes;

use crate::data::Tier;
use crate::durable::commit::SyncSet;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, DirEntry, FileKind};
use crate::kernel::{Fh, Ino};
use crate::killpriv::Caller;
use crate::mount::{NewInode, Shared};
use crate::page::PRIVATE_XATTR_PREFIX;
use crate::sys::{self, FUSE_ROOT_INO};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// Entries of an open directory, read once at its first READDIR (offsets are indexes into
/// it).
pub(crate) struct DirHandle {
    pub(crate) entries: Vec<DirEntry>,
    /// The directory and its backing inode until the first READDIR reads it: when the
    /// kernel serves a listing from its cache (FOPEN_CACHE_DIR), none comes, and the
    /// backing directory is never read.
    unread: Option<(OwnedFd, u64)>,
}

/// Whether an xattr name is the daemon's own.
fn private_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(PRIVATE_XATTR_PREFIX.as_bytes())
}

impl Shared {
    pub(crate) fn parent_and_name(&self, ino: Ino) -> Result<(Ino, OsString)> {
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

    #[allow(clippy::too_many_arguments)] // mirrors the FUSE request
    pub(crate) fn do_mknod(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
        match mode & libc::S_IFMT {
            libc::S_IFREG => {
                let fd = sys::open_confined(
                    pfd.as_fd(),
                    name,
                    OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
                    perm,
                )?;
                self.chown_new(caller, &pfd, Some(&fd), name, None)?;
                self.restore_setid_bits(&pfd, name, perm)?;
                self.entry_durable(set, &pfd, NewInode::Fd(&fd))?;
            }
            libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK => {
                // Device nodes: the kernel lets only callers with CAP_MKNOD (in the initial
                // user namespace) send this request, so making the node in the backing
                // directory is what that caller could do there directly; through the
                // mount, which is nodev, the node opens no device. A daemon without
                // CAP_MKNOD gets EPERM from the backing, which passes through.
                let ft = rustix::fs::FileType::from_raw_mode(mode);
                let dev = if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
                    sys::decode_fuse_rdev(rdev)
                } else {
                    0
                };
                rustix::fs::mknodat(&pfd, name, ft, perm, dev)?;
                self.chown_new(caller, &pfd, None, name, None)?;
                self.restore_setid_bits(&pfd, name, perm)?;
                self.entry_durable(set, &pfd, NewInode::NoFd)?;
            }
            _ => return Err(FsError::Errno(libc::EINVAL)),
        }
        self.lookup_in(parent, &pfd, name)
    }

    pub(crate) fn do_mkdir(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<Attr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        rustix::fs::mkdirat(&pfd, name, Mode::from_raw_mode(mode & !umask & 0o7777))?;
        let fd = sys::open_confined(
            pfd.as_fd(),
            name,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        self.chown_new(caller, &pfd, Some(&fd), name, None)?;
        self.entry_durable(set, &pfd, NewInode::Fd(&fd))?;
        self.lookup_in(parent, &pfd, name)
    }

    pub(crate) fn do_unlink(
        &self,
        set: &mut SyncSet,
        parent: Ino,
        name: &OsStr,
        dir: bool,
    ) -> Result<()> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let st = sys::stat_at(pfd.as_fd(), name)?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        // The sync joins the set before the change: nothing may fail between the change
        // and the node table's update (a failure after it would report an unlink that
        // happened as failed, and leave the table naming the old entry).
        self.meta_durable(set, &[&pfd])?;
        rustix::fs::unlinkat(&pfd, name, flags)?;
        let ino = Ino(self.dir.fuse_ino(st.st_ino));
        // A directory has one link that counts; anything else is gone with its last.
        let last = dir || st.st_nlink <= 1;
        let mut nodes = self.nodes.lock();
        nodes.unlinked(ino, parent, name);
        if last {
            nodes.inode_gone(ino);
        }
        drop(nodes);
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && last {
            self.data_unlinked(st.st_ino);
        }
        Ok(())
    }

    pub(crate) fn do_symlink(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        target: &std::path::Path,
    ) -> Result<Attr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        rustix::fs::symlinkat(target, &pfd, name)?;
        self.chown_new(caller, &pfd, None, name, None)?;
        self.entry_durable(set, &pfd, NewInode::NoFd)?;
        self.lookup_in(parent, &pfd, name)
    }

    pub(crate) fn do_rename(
        &self,
        set: &mut SyncSet,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        sys::check_name(name)?;
        sys::check_name(newname)?;
        let pfd = self.dir_fd(parent)?;
        let npfd = if newparent == parent {
            None
        } else {
            Some(self.dir_fd(newparent)?)
        };
        let nfd = npfd.as_ref().unwrap_or(&pfd);
        let moved = sys::stat_at(pfd.as_fd(), name)?;
        let replaced = sys::stat_at(nfd.as_fd(), newname).ok();
        let rflags = rustix::fs::RenameFlags::from_bits_retain(flags);
        // Before the change, as for unlink.
        match &npfd {
            Some(n) => self.meta_durable(set, &[n, &pfd])?,
            None => self.meta_durable(set, &[&pfd])?,
        }
        rustix::fs::renameat_with(&pfd, name, nfd, newname, rflags)?;
        let moved_ino = Ino(self.dir.fuse_ino(moved.st_ino));
        let mut nodes = self.nodes.lock();
        if let Some(r) = replaced {
            let r_ino = Ino(self.dir.fuse_ino(r.st_ino));
            if flags & libc::RENAME_EXCHANGE != 0 {
                nodes.renamed(r_ino, newparent, newname, parent, name);
            } else if r_ino != moved_ino {
                nodes.unlinked(r_ino, newparent, newname);
                if r.st_mode & libc::S_IFMT == libc::S_IFDIR || r.st_nlink <= 1 {
                    nodes.inode_gone(r_ino);
                }
                drop(nodes);
                if r.st_mode & libc::S_IFMT == libc::S_IFREG && r.st_nlink <= 1 {
                    self.data_unlinked(r.st_ino);
                }
                nodes = self.nodes.lock();
            }
        }
        if replaced.map(|r| r.st_ino) != Some(moved.st_ino) {
            // (Renaming a name onto another link of the same inode changes nothing.)
            nodes.renamed(moved_ino, parent, name, newparent, newname);
        }
        Ok(())
    }

    pub(crate) fn do_link(
        &self,
        set: &mut SyncSet,
        ino: Ino,
        newparent: Ino,
        newname: &OsStr,
    ) -> Result<Attr> {
        sys::check_name(newname)?;
        let npfd = self.dir_fd(newparent)?;
        let (fd, _) = self.node_fd(ino, OFlags::PATH)?;
        rustix::fs::linkat(&fd, "", &npfd, newname, AtFlags::EMPTY_PATH)?;
        // The link count lives in the inode, which may be of any type.
        self.entry_durable(set, &npfd, NewInode::NoFd)?;
        self.lookup_in(newparent, &npfd, newname)
    }

    /// The namespace part of CREATE: makes (or, without O_EXCL, opens) `name` in `parent`,
    /// gives a new file to the caller, makes it durable per the mode and looks it up.
    /// Returns the entry, the open backing file (read-write) and whether this call made
    /// it (a failure after that must `undo_create`).
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE request
    pub(crate) fn create_entry(
        &self,
        set: &mut SyncSet,
        caller: &Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<Created> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
        // Exclusive first, so we know whether this call created the file (and must give
        // it to the caller); without O_EXCL an existing file is opened as it is.
        let excl = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR;
        let (fd, created) = match sys::open_confined(pfd.as_fd(), name, excl, perm) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => (
                sys::open_confined(pfd.as_fd(), name, OFlags::RDWR, Mode::empty())?,
                false,
            ),
            Err(e) => return Err(e.into()),
        };
        let mut st = sys::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let mut looked_up = false;
        let r = (|| {
            if created {
                let mut changed = self.chown_new(caller, &pfd, Some(&fd), name, Some(&st))?;
                if perm.bits() & (libc::S_ISUID | libc::S_ISGID) != 0 {
                    self.restore_setid_bits(&pfd, name, perm)?;
                    changed = true;
                }
                if changed {
                    st = sys::fstat(fd.as_fd())?;
                }
            }
            self.entry_durable(set, &pfd, NewInode::Fd(&fd))?;
            // The entry from the descriptor's status: the name cannot lead elsewhere while
            // the kernel holds the parent's lock for this create.
            let attr = self.attr(&st);
            self.nodes.lock().remember(Ino(attr.ino), parent, name);
            looked_up = true;
            Ok(attr)
        })();
        match r {
            Ok(attr) => Ok(Created {
                attr,
                key: st.st_ino,
                mode: st.st_mode,
                file: File::from(fd),
                made: created,
                pfd,
            }),
            Err(e) => {
                if created {
                    self.undo_create(parent, &pfd, name, st.st_ino, looked_up);
                }
                Err(e)
            }
        }
    }

    /// A create that failed after making its file (ownership, durability, the object)
    /// takes the file away again: a failed operation changes nothing the caller can see.
    /// Only the inode this call made is removed, and only under the name it got. Best
    /// effort: if the removal fails too, an empty file is left, as a crash at that point
    /// would leave it.
    pub(crate) fn undo_create(
        &self,
        parent: Ino,
        pfd: &OwnedFd,
        name: &OsStr,
        key: u64,
        looked_up: bool,
    ) {
        let still_ours = sys::stat_at(pfd.as_fd(), name).is_ok_and(|st| st.st_ino == key);
        if still_ours && rustix::fs::unlinkat(pfd, name, AtFlags::empty()).is_ok() {
            let _ = self.meta_durable_now(&[pfd]);
        }
        let ino = Ino(self.dir.fuse_ino(key));
        let mut nodes = self.nodes.lock();
        nodes.unlinked(ino, parent, name);
        if still_ours {
            nodes.inode_gone(ino);
        }
        if looked_up {
            // The kernel never got the entry, so it will never forget it.
            nodes.forget(ino, 1);
        }
        drop(nodes);
        self.data_unlinked(key);
    }

    pub(crate) fn do_opendir(&self, ino: Ino) -> Result<Fh> {
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let fh = self.new_fh();
        self.dirs.lock().insert(
            fh,
            DirHandle {
                entries: Vec::new(),
                unread: Some((fd, st.st_ino)),
            },
        );
        Ok(fh)
    }

    /// Reads the directory of handle `fh` on its first READDIR (see `DirHandle::unread`);
    /// the entries then stay fixed for the handle, so offsets are stable.
    pub(crate) fn dir_entries_ready(&self, ino: Ino, fh: Fh) -> Result<()> {
        let unread = match self.dirs.lock().get_mut(&fh) {
            Some(d) => d.unread.take(),
            None => return Err(FsError::Errno(libc::EBADF)),
        };
        let Some((fd, self_ino)) = unread else {
            return Ok(());
        };
        let entries = self.read_dir_entries(ino, &fd, self_ino);
        let mut dirs = self.dirs.lock();
        let Some(d) = dirs.get_mut(&fh) else {
            return Err(FsError::Errno(libc::EBADF));
        };
        match entries {
            Ok(e) => {
                d.entries = e;
                Ok(())
            }
            Err(e) => {
                d.unread = Some((fd, self_ino));
                Err(e)
            }
        }
    }

    fn read_dir_entries(&self, ino: Ino, fd: &OwnedFd, self_ino: u64) -> Result<Vec<DirEntry>> {
        let parent_ino = if ino.0 == FUSE_ROOT_INO {
            FUSE_ROOT_INO
        } else {
            match sys::stat_at(fd.as_fd(), OsStr::new("..")) {
                Ok(p) => self.dir.fuse_ino(p.st_ino),
                Err(_) => FUSE_ROOT_INO,
            }
        };
        let mut entries = vec![
            (
                self.dir.fuse_ino(self_ino),
                FileKind::Directory,
                OsString::from("."),
            ),
            (parent_ino, FileKind::Directory, OsString::from("..")),
        ];
        let mut d = rustix::fs::Dir::read_from(fd)?;
        while let Some(ent) = d.read() {
            let ent = ent?;
            let name = OsStr::from_bytes(ent.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            entries.push((
                self.dir.fuse_ino(ent.ino()),
                FileKind::of_dirent(ent.file_type()),
                name.to_owned(),
            ));
        }
        Ok(entries)
    }

    #[allow(clippy::type_complexity)] // the argument list of ReplyStatfs::statfs
    pub(crate) fn do_statfs(&self) -> Result<(u64, u64, u64, u64, u64, u32, u32, u32)> {
        let s = rustix::fs::fstatvfs(self.dir.root_fd())?;
        Ok((
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        ))
    }

    /// Descriptor for xattr calls: only regular files and directories carry user xattrs
    /// reachable without following a link. A kept directory descriptor or the page cache
    /// path's descriptor of a file it holds open serves without opening anything: the
    /// kernel asks for `security.capability` before the first write of every inode it
    /// instantiates, right after the open.
    fn xattr_fd(&self, ino: Ino) -> Result<Option<NodeFd>> {
        if let Some(fd) = self.nodes.lock().kept_dir(ino) {
            return Ok(Some(NodeFd::Dir(fd)));
        }
        if let Some(Tier::Page(t)) = self.tier_if_set() {
            if let Some(f) = t.held_file(self.dir.backing_ino(ino.0)) {
                return Ok(Some(NodeFd::File(f)));
            }
        }
        let st = self.stat_node(ino)?;
        match FileKind::of_mode(st.st_mode) {
            FileKind::RegularFile | FileKind::Directory => Ok(Some(NodeFd::Own(
                self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?.0,
            ))),
            _ => Ok(None),
        }
    }

    pub(crate) fn do_getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::ENODATA));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        if size == 0 {
            let n = rustix::fs::fgetxattr_query(&fd, name)?;
            return Ok(vec![0u8; n]);
        }
        let mut buf = vec![0u8; size as usize];
        let n = rustix::fs::fgetxattr(&fd, name, &mut buf[..])?;
        buf.truncate(n);
        Ok(buf)
    }

    /// The names list without the daemon's own; `size` 0 asks for the length only, and a
    /// list longer than `size` is ERANGE, as listxattr(2) answers.
    pub(crate) fn do_listxattr(&self, ino: Ino, size: u32) -> Result<Vec<u8>> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Ok(Vec::new());
        };
        let all = loop {
            let n = rustix::fs::flistxattr_query(&fd)?;
            let mut buf = vec![0u8; n];
            match rustix::fs::flistxattr(&fd, &mut buf[..]) {
                Ok(got) => {
                    buf.truncate(got);
                    break buf;
                }
                // Grew between the two calls.
                Err(rustix::io::Errno::RANGE) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let shown: Vec<u8> = all
            .split_inclusive(|b| *b == 0)
            .filter(|n| !private_xattr(OsStr::from_bytes(n.strip_suffix(&[0]).unwrap_or(n))))
            .flatten()
            .copied()
            .collect();
        if size != 0 && shown.len() > size as usize {
            return Err(FsError::Errno(libc::ERANGE));
        }
        Ok(shown)
    }

    pub(crate) fn do_setxattr(
        &self,
        set: &mut SyncSet,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::EPERM));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::EPERM));
        };
        let f = rustix::fs::XattrFlags::from_bits_retain(flags as _);
        rustix::fs::fsetxattr(&fd, name, value, f)?;
        self.meta_durable(set, &[&fd])
    }

    pub(crate) fn do_removexattr(&self, set: &mut SyncSet, ino: Ino, name: &OsStr) -> Result<()> {
        if private_xattr(name) {
            return Err(FsError::Errno(libc::ENODATA));
        }
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        rustix::fs::fremovexattr(&fd, name)?;
        self.meta_durable(set, &[&fd])
    }
}

/// A descriptor of a node, kept elsewhere or opened for one request.
enum NodeFd {
    Dir(std::sync::Arc<OwnedFd>),
    File(std::sync::Arc<File>),
    Own(OwnedFd),
}

impl AsFd for NodeFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            NodeFd::Dir(d) => d.as_fd(),
            NodeFd::File(f) => f.as_fd(),
            NodeFd::Own(o) => o.as_fd(),
        }
    }
}

/// What `create_entry` made: the new entry, its backing inode number and open backing
/// file, whether this call created it, and the parent directory (for `undo_create`).
pub(crate) struct Created {
    pub(crate) attr: Attr,
    pub(crate) key: u64,
    /// The new inode's `st_mode`.
    pub(crate) mode: u32,
    pub(crate) file: File,
    pub(crate) made: bool,
    pub(crate) pfd: std::sync::Arc<OwnedFd>,
}
