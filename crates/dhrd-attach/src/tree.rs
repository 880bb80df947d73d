//! Breadth-first walks of the tree under the attached directory: the warm-up's walk, the
//! sync-flag walks (set, audit, clear) and the page cache survey for status all use it.
//!
//! Invariants: every directory is opened from the attached directory's descriptor with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, so a walk never
//! follows a symlink, never leaves the tree and never crosses into another file system
//! (a mount inside the tree is not its files); entries are stat'ed without following
//! symlinks. A directory renamed away during the walk is skipped or walked under its old
//! path, never twice in one queue. `on_dir` runs for a directory before its entries are
//! read, so an entry made after `on_dir` returns is either read or made under what
//! `on_dir` did (the sync flags a new entry inherits).
//!
//! Crash semantics: none; it reads, and what the callbacks change is theirs.

use std::collections::VecDeque;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Directories queued at most; deeper ones past it are skipped (and counted).
pub const DIRS_QUEUED_MAX: usize = 1 << 20;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Other,
}

impl Kind {
    /// The kind of a file of mode `st_mode` (as `stat` gives it).
    pub fn of_mode(st_mode: u32) -> Self {
        match st_mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            _ => Kind::Other,
        }
    }
}

/// One directory entry, stat'ed without following a symlink.
pub struct Entry<'a> {
    pub name: &'a CStr,
    /// Path from the attached directory.
    pub rel: PathBuf,
    pub kind: Kind,
    pub size: u64,
    pub dev: u64,
}

/// Opens `rel` (a directory, or "" for the root itself) beneath `root`, for reading its
/// entries without updating its access time: the daemon's walks are not an application's
/// reads, and a timestamp an application just set (utimensat) must stay as it set it.
pub fn open_dir(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::OFlags;
    open_beneath_noatime(root, rel, OFlags::DIRECTORY | OFlags::RDONLY)
}

/// `open_beneath` with O_NOATIME added, so what the daemon reads keeps its access time;
/// without the right to it (not the owner, no CAP_FOWNER: EPERM) it opens as usual.
pub fn open_beneath_noatime(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: rustix::fs::OFlags,
) -> io::Result<OwnedFd> {
    dhrd_pagecache::sys::open_noatime(|noatime| {
        let noatime = rustix::fs::OFlags::from_bits_retain(noatime as u32);
        open_beneath(root, rel, flags | noatime)
    })
}

/// Opens `rel` beneath `root` with `flags`, never through a symlink or another mount.
pub fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: rustix::fs::OFlags,
) -> io::Result<OwnedFd> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
    let path: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(openat2(
        root,
        path,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV,
    )?)
}

/// Counts of a walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    pub dirs: u64,
    pub files: u64,
    /// Directories that could not be opened or read (renamed away, permissions), or
    /// were past `DIRS_QUEUED_MAX`.
    pub dirs_skipped: u64,
}

/// Walks the tree below `start` (relative to `root`), breadth-first. `on_dir(fd, rel,
/// ctx)` runs for each directory (the start included) once it is open, before its entries
/// are read; `on_entry(dir_fd, ctx, entry)` for each entry, and returns the context of a
/// directory entry to descend into it (None: not walked). `stop` is asked between
/// entries.
pub fn walk<T>(
    root: BorrowedFd<'_>,
    start: &Path,
    ctx: T,
    stop: &dyn Fn() -> bool,
    mut on_dir: impl FnMut(BorrowedFd<'_>, &Path, &T),
    mut on_entry: impl FnMut(BorrowedFd<'_>, &T, &Entry<'_>) -> Option<T>,
) -> Walked {
    let mut w = Walked::default();
    let root_dev = rustix::fs::fstat(root).map(|s| s.st_dev).unwrap_or(0);
    let mut queue: VecDeque<(PathBuf, T)> = VecDeque::new();
    queue.push_back((start.to_path_buf(), ctx));
    while let Some((rel, ctx)) = queue.pop_front() {
        if stop() {
            break;
        }
        let Ok(fd) = open_dir(root, &rel) else {
            w.dirs_skipped += 1;
            continue;
        };
        w.dirs += 1;
        on_dir(fd.as_fd(), &rel, &ctx);
        let Ok(mut d) = rustix::fs::Dir::read_from(&fd) else {
            w.dirs_skipped += 1;
            continue;
        };
        while let Some(Ok(ent)) = d.read() {
            if stop() {
                break;
            }
            let name = ent.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let kind = Kind::of_mode(st.st_mode);
            if kind == Kind::File {
                w.files += 1;
            }
            let e = Entry {
                name,
                rel: rel.join(OsStr::from_bytes(name.to_bytes())),
                kind,
                size: st.st_size as u64,
                dev: st.st_dev,
            };
            let child = on_entry(fd.as_fd(), &ctx, &e);
            if let (Kind::Dir, Some(c)) = (kind, child) {
                if e.dev != root_dev {
                    continue;
                }
                if queue.len() >= DIRS_QUEUED_MAX {
                    w.dirs_skipped += 1;
                    continue;
                }
                queue.push_back((e.rel, c));
            }
        }
    }
    w
}

/// A NUL-terminated copy of a name (for the `*at` calls that take a C string).
pub fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn the_walk_visits_every_directory_first_and_never_follows_a_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path();
        std::fs::create_dir_all(p.join("a/b")).expect("dirs");
        std::fs::write(p.join("top"), b"1").expect("file");
        std::fs::write(p.join("a/b/deep"), b"22").expect("file");
        std::os::unix::fs::symlink("/", p.join("a/escape")).expect("symlink");
        let root = std::fs::File::open(p).expect("root");
        let mut dirs = Vec::new();
        let mut files = Vec::new();
        let w = walk(
            root.as_fd(),
            Path::new(""),
            0u32,
            &|| false,
            |_, rel, depth| dirs.push((rel.to_path_buf(), *depth)),
            |_, depth, e| {
                if e.kind == Kind::File {
                    files.push((e.rel.clone(), e.size));
                }
                (e.kind == Kind::Dir).then_some(depth + 1)
            },
        );
        dirs.sort();
        files.sort();
        assert_eq!(
            dirs,
            vec![
                (PathBuf::new(), 0),
                (PathBuf::from("a"), 1),
                (PathBuf::from("a/b"), 2)
            ]
        );
        assert_eq!(
            files,
            vec![(PathBuf::from("a/b/deep"), 2), (PathBuf::from("top"), 1)]
        );
        assert_eq!((w.dirs, w.files, w.dirs_skipped), (3, 2, 0));
        assert!(open_beneath(
            root.as_fd(),
            Path::new("a/escape"),
            rustix::fs::OFlags::RDONLY
        )
        .is_err());
    }

    /// A walk reads directories without touching their access time (relatime would
    /// update an access time older than the modification time on the first read).
    #[test]
    fn a_walk_leaves_access_times_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sub = dir.path().join("sub");
        std::fs::create_dir_all(sub.join("deeper")).expect("mkdir");
        std::fs::write(sub.join("f"), b"x").expect("write");
        let old = rustix::fs::Timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        };
        let times = rustix::fs::Timestamps {
            last_access: old,
            last_modification: rustix::fs::Timespec {
                tv_sec: 2_000_000,
                tv_nsec: 0,
            },
        };
        for d in [&sub, &sub.join("deeper")] {
            rustix::fs::utimensat(rustix::fs::CWD, d, &times, rustix::fs::AtFlags::empty())
                .expect("utimensat");
        }
        let root = std::fs::File::open(dir.path()).expect("open root");
        let w = walk(
            root.as_fd(),
            Path::new(""),
            (),
            &|| false,
            |_, _, _| {},
            |_, _, e| (e.kind == Kind::Dir).then_some(()),
        );
        assert_eq!(w.dirs, 3);
        for d in [&sub, &sub.join("deeper")] {
            let st = rustix::fs::stat(d).expect("stat");
            assert_eq!(
                st.st_atime,
                1_000_000,
                "{} read with an access time update",
                d.display()
            );
        }
    }
}
