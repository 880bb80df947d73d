//! Directory requests: OPENDIR, READDIR, READDIRPLUS, RELEASEDIR, FSYNCDIR, and STATFS.
//!
//! Invariants: READDIRPLUS counts the kernel's lookup of an entry only once the entry is
//! in the reply (the kernel takes one reference per entry it receives), and never for
//! ".", ".." or entries on another file system (node 0, which the kernel does not link).
//!
//! Crash semantics: FSYNCDIR makes the directory's entries durable, and the names of the
//! directories above it that are new too (in `sync` mode they are already); the rest
//! only reads.

use super::dir_handles::Unread;
use super::Namespace;
use crate::config::READDIRPLUS_BATCH_MAX;
use crate::durable::commit::SyncSet;
use crate::durable::failures::SyncOf;
use crate::error::{FsError, Result};
use crate::kernel::{Attr, DirEntry, Entry, Fh, FileKind, Ino, Statfs};
use crate::sys::{self, FUSE_ROOT_INO};
use rustix::fs::OFlags;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

impl Namespace {
    pub fn opendir(&self, ino: Ino) -> Result<Fh> {
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        Ok(self.dirs.open(fd, st.st_ino))
    }

    pub fn releasedir(&self, fh: Fh) {
        self.dirs.close(fh);
    }

    /// Reads the directory of handle `fh` on its first READDIR (see `dir_handles.rs`);
    /// the entries then stay fixed for the handle, so offsets are stable.
    fn entries_ready(&self, ino: Ino, fh: Fh) -> Result<()> {
        let Some(unread) = self.dirs.take_unread(fh)? else {
            return Ok(());
        };
        let read = self.read_dir_entries(ino, &unread);
        self.dirs.fill(fh, unread, read)
    }

    fn read_dir_entries(&self, ino: Ino, (fd, self_ino): &Unread) -> Result<Vec<DirEntry>> {
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
                self.dir.fuse_ino(*self_ino),
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

    /// READDIR from `offset`: `add(ino, next offset, kind, name)` takes each entry and
    /// says whether the reply is full.
    pub fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileKind, &OsStr) -> bool,
    ) -> Result<()> {
        self.entries_ready(ino, fh)?;
        self.dirs.with_entries(fh, |entries| {
            for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                if add(*ino, (i + 1) as u64, *kind, name) {
                    break;
                }
            }
        })
    }

    /// READDIRPLUS from `offset`: `add(next offset, name, entry)` takes each entry with
    /// its attributes and says whether the reply is full.
    pub fn readdirplus(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        mut add: impl FnMut(u64, &OsStr, &Entry) -> bool,
    ) -> Result<()> {
        self.entries_ready(ino, fh)?;
        // Copy one batch out so the table's lock is not held while stat'ing entries.
        let batch: Vec<DirEntry> = self.dirs.with_entries(fh, |entries| {
            let rest = entries.iter().skip(offset as usize);
            rest.take(READDIRPLUS_BATCH_MAX).cloned().collect()
        })?;
        let pfd = self.dir_fd(ino)?;
        for (i, (eino, kind, name)) in batch.iter().enumerate() {
            let next = offset + i as u64 + 1;
            if name == "." || name == ".." {
                // The kernel links neither and counts no lookup for them.
                let attr = Attr {
                    ino: *eino,
                    kind: *kind,
                    ..self.placeholder_attr()
                };
                let e = Entry {
                    attr,
                    generation: 0,
                };
                if add(next, name, &e) {
                    break;
                }
                continue;
            }
            if self.add_plus_entry(ino, &pfd, next, *kind, name, &mut add) {
                break;
            }
        }
        Ok(())
    }

    /// One entry of READDIRPLUS but "." and ".."; whether the reply is full.
    fn add_plus_entry(
        &self,
        parent: Ino,
        pfd: &OwnedFd,
        next: u64,
        kind: FileKind,
        name: &OsStr,
        add: &mut impl FnMut(u64, &OsStr, &Entry) -> bool,
    ) -> bool {
        // "." and ".." are answered by the caller and never counted as lookups.
        debug_assert!(name != "." && name != "..", "READDIRPLUS counted {name:?}");
        // Gone since opendir: left out, as a later readdir would. On another file system
        // (not part of the tree; LOOKUP says EXDEV): inode 0, which the kernel does not
        // link and readdir(3) skips.
        let Ok(st) = sys::stat_at(pfd.as_fd(), name) else {
            return false;
        };
        let attr = if st.st_dev == self.dir.dev() {
            self.attr(&st)
        } else {
            Attr {
                ino: 0,
                kind,
                ..self.placeholder_attr()
            }
        };
        let e = Entry {
            attr,
            generation: self.generation(&attr),
        };
        if add(next, name, &e) {
            return true;
        }
        if attr.ino != 0 {
            // Counted only once the entry is in the reply: the kernel takes one lookup
            // reference per entry it receives.
            self.nodes.lock().remember(Ino(attr.ino), parent, name);
            self.stats
                .readdirplus_entries
                .fetch_add(1, Ordering::Relaxed);
        }
        false
    }

    /// FSYNCDIR: the directory's entries durable; in `sync` mode they are at every
    /// change already, and the directory joins `set` like any change.
    pub fn fsync_dir(&self, set: &mut SyncSet, ino: Ino) -> Result<()> {
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        if self.sync.sync_mode() {
            set.fsync(&[&fd])
        } else {
            // The directory itself (changes a previous daemon made are not recorded),
            // then its recorded entries and the new directories above it. Checked and
            // recorded like every sync (C4, failures.rs).
            let id = (st.st_dev, st.st_ino);
            self.sync
                .failures()
                .sync(SyncOf::inode(id), "fsync of a directory", || {
                    sys::fsync(fd.as_fd())
                })
                .map_err(FsError::from)?;
            self.sync.sync_names(&[st.st_ino])
        }
    }

    pub fn statfs(&self) -> Result<Statfs> {
        let s = rustix::fs::fstatvfs(self.dir.root_fd())?;
        Ok(Statfs {
            blocks: s.f_blocks,
            blocks_free: s.f_bfree,
            blocks_available: s.f_bavail,
            files: s.f_files,
            files_free: s.f_ffree,
            block_bytes: s.f_bsize as u32,
            name_bytes_max: s.f_namemax as u32,
            fragment_bytes: s.f_frsize as u32,
        })
    }
}
