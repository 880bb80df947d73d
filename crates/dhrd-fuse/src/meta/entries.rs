//! The namespace's changes: MKNOD, MKDIR, SYMLINK, LINK, UNLINK, RMDIR, RENAME, and the
//! entry of CREATE, all as confined `*at` system calls on the backing directory
//! (`sys.rs`).
//!
//! Invariants:
//! - Every change is made durable per the durability mode before the reply
//!   (`SyncPolicy::meta_durable`): in `sync` mode the changed inode and its parent
//!   directory (both parents for rename) join the request's `SyncSet`, which the committer
//!   syncs with those of concurrent requests before the reply goes out. Every request
//!   that makes an entry goes through `SyncPolicy::entry_durable`, which names the new
//!   inode too: by descriptor where it can be fsync'ed, else (symlinks, FIFOs, sockets,
//!   device nodes, link counts) a `syncfs`.
//! - The node table follows every change (remember, unlinked, renamed), and a file whose
//!   last link goes is forgotten by the data path (`Files::unlinked`).
//! - New inodes belong to their callers (`chown_new`), as the kernel would make them.
//!
//! Crash semantics: a reply that reported success in `sync` mode is on the backing
//! device. A crash between the backing operation and its fsync leaves whatever the
//! backing file system recovers, which is either the old or the new state of that one
//! operation.

use super::Namespace;
use crate::durable::commit::SyncSet;
use crate::durable::{DirRef, NewInode};
use crate::error::{FsError, Result};
use crate::kernel::{Attr, Ino};
use crate::killpriv::Caller;
use crate::sys;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

impl Namespace {
    /// Directory node `ino`, open as `fd`, as the durability policy takes it.
    fn dir_ref<'a>(&self, ino: Ino, fd: &'a Arc<OwnedFd>) -> DirRef<'a> {
        DirRef {
            ino: self.dir.backing_ino(ino.0),
            fd,
        }
    }

    #[allow(clippy::too_many_arguments)] // mirrors the FUSE request
    pub fn mknod(
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
                let dir = self.dir_ref(parent, &pfd);
                self.sync.entry_durable(set, dir, name, NewInode::Fd(&fd))?;
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
                let dir = self.dir_ref(parent, &pfd);
                self.sync.entry_durable(set, dir, name, NewInode::NoFd)?;
            }
            _ => return Err(FsError::Errno(libc::EINVAL)),
        }
        self.lookup_in(parent, &pfd, name)
    }

    pub fn mkdir(
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
        let dir = self.dir_ref(parent, &pfd);
        self.sync.entry_durable(set, dir, name, NewInode::Fd(&fd))?;
        self.lookup_in(parent, &pfd, name)
    }

    pub fn unlink(&self, set: &mut SyncSet, parent: Ino, name: &OsStr, dir: bool) -> Result<()> {
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
        self.sync.before_entries_change(set, &[&pfd])?;
        rustix::fs::unlinkat(&pfd, name, flags)?;
        self.sync.unlinked(self.dir_ref(parent, &pfd));
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
            self.files.unlinked(st.st_ino);
        }
        Ok(())
    }

    pub fn symlink(
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
        let dir = self.dir_ref(parent, &pfd);
        self.sync.entry_durable(set, dir, name, NewInode::NoFd)?;
        self.lookup_in(parent, &pfd, name)
    }

    pub fn rename(
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
            Some(n) => self.sync.before_entries_change(set, &[n, &pfd])?,
            None => self.sync.before_entries_change(set, &[&pfd])?,
        }
        rustix::fs::renameat_with(&pfd, name, nfd, newname, rflags)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let dirs = (self.dir_ref(parent, &pfd), self.dir_ref(newparent, nfd));
        let back = replaced.as_ref().filter(|_| exchange).map(|r| (name, r));
        self.sync.renamed(dirs, newname, &moved, back);
        let moved_ino = Ino(self.dir.fuse_ino(moved.st_ino));
        let mut nodes = self.nodes.lock();
        if let Some(r) = replaced {
            let r_ino = Ino(self.dir.fuse_ino(r.st_ino));
            if exchange {
                nodes.renamed(r_ino, newparent, newname, parent, name);
            } else if r_ino != moved_ino {
                nodes.unlinked(r_ino, newparent, newname);
                if r.st_mode & libc::S_IFMT == libc::S_IFDIR || r.st_nlink <= 1 {
                    nodes.inode_gone(r_ino);
                }
                drop(nodes);
                if r.st_mode & libc::S_IFMT == libc::S_IFREG && r.st_nlink <= 1 {
                    self.files.unlinked(r.st_ino);
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

    pub fn link(
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
        let dir = self.dir_ref(newparent, &npfd);
        self.sync.entry_durable(set, dir, newname, NewInode::NoFd)?;
        self.lookup_in(newparent, &npfd, newname)
    }

    /// The namespace part of CREATE: makes (or, without O_EXCL, opens) `name` in `parent`,
    /// gives a new file to the caller, makes it durable per the mode and looks it up.
    /// Returns the entry, the open backing file (read-write) and whether this call made
    /// it (a failure after that must `undo_create`).
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE request
    pub fn create_entry(
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
            let dir = self.dir_ref(parent, &pfd);
            self.sync
                .entry_durable(set, dir, name, NewInode::Stat(&fd, &st))?;
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
    pub fn undo_create(&self, parent: Ino, pfd: &OwnedFd, name: &OsStr, key: u64, looked_up: bool) {
        let still_ours = sys::stat_at(pfd.as_fd(), name).is_ok_and(|st| st.st_ino == key);
        if still_ours && rustix::fs::unlinkat(pfd, name, AtFlags::empty()).is_ok() {
            let _ = self.sync.meta_durable_now(&[pfd]);
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
        self.files.unlinked(key);
    }

    /// Gives a newly created inode to the caller (the daemon runs as root), inheriting the
    /// group of a set-group-id parent directory as the kernel would. `made`: the new
    /// inode's status, if the caller has it; then nothing is changed (and the parent not
    /// even looked at) where the backing file system already gave the inode the right
    /// owner: a root caller in an ordinary directory, most of all. Returns whether the
    /// owner changed (the inode's ctime then changed too).
    pub fn chown_new(
        &self,
        caller: &Caller,
        pfd: &OwnedFd,
        fd: Option<&OwnedFd>,
        name: &OsStr,
        made: Option<&libc::stat>,
    ) -> Result<bool> {
        if !self.daemon_is_root {
            return Ok(false);
        }
        // The group the inode got equals the caller's: right whether or not the parent
        // is set-group-id (it would have given its own group, which is then the same).
        let gid = match made {
            Some(st) if st.st_gid == caller.gid => st.st_gid,
            _ => {
                let pst = sys::fstat(pfd.as_fd())?;
                if pst.st_mode & libc::S_ISGID != 0 {
                    pst.st_gid
                } else {
                    caller.gid
                }
            }
        };
        if made.is_some_and(|st| st.st_uid == caller.uid && st.st_gid == gid) {
            return Ok(false);
        }
        let uid = Some(rustix::fs::Uid::from_raw(caller.uid));
        let gid = Some(rustix::fs::Gid::from_raw(gid));
        match fd {
            Some(fd) => rustix::fs::fchown(fd, uid, gid)?,
            None => rustix::fs::chownat(pfd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?,
        }
        Ok(true)
    }

    /// `chown` clears S_ISUID and S_ISGID of a non-directory even when root makes it, so a
    /// node created with set-id bits on the caller's behalf gets them back after
    /// `chown_new`. What the caller may not set the kernel has stripped already
    /// (`vfs_prepare_mode`) before the request reached the daemon.
    pub fn restore_setid_bits(&self, pfd: &OwnedFd, name: &OsStr, perm: Mode) -> Result<()> {
        if perm.bits() & (libc::S_ISUID | libc::S_ISGID) == 0 || !self.daemon_is_root {
            return Ok(());
        }
        let st = sys::stat_at(pfd.as_fd(), name)?;
        sys::chmod_node(pfd.as_fd(), name, perm, st.st_ino)
    }
}

/// What `create_entry` made: the new entry, its backing inode number and open backing
/// file, whether this call created it, and the parent directory (for `undo_create`).
pub struct Created {
    pub attr: Attr,
    pub key: u64,
    /// The new inode's `st_mode`.
    pub mode: u32,
    pub file: File,
    pub made: bool,
    pub pfd: std::sync::Arc<OwnedFd>,
}
