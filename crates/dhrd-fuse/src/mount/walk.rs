//! The background walk of the backing tree after mounting: it finds every regular file
//! and hands it to the data path's warm-up, so data is in RAM before applications ask for
//! it (SPEC I7-I11). On the page cache path files go to the `Resident` (read into the page
//! cache and pinned within the budget, demanded files first); on the engine path objects
//! are created while the closed-object cache and the RAM budget have room, and the loader
//! threads fill them.
//!
//! Invariants: the walk only reads the tree, through the confined calls of `sys.rs`, and
//! never follows symlinks or leaves the backing file system. A file renamed or replaced
//! between being found and being opened is skipped (its inode no longer matches).
//!
//! Crash semantics: none; it writes nothing.

use super::Mount;
use crate::data::Tier;
use crate::error::{FsError, Result};
use crate::sys;
use dhrd_pagecache::resident::FileRef;
use rustix::fs::OFlags;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Directories the walk keeps queued at most (breadth-first; more are skipped and their
/// files warm up when first opened instead).
pub const WALK_DIRS_QUEUED_MAX: usize = 1 << 20;

/// The walk thread: the walk once INIT has chosen the data path (`preload`), or without
/// it the note to the warm-up that no walk will come.
pub fn run(m: Arc<Mount>) {
    if m.cfg().preload {
        walk(m);
    } else if let Some(Tier::Page(t)) = m.wait_tier() {
        t.resident().walk_done();
    }
}

/// Breadth-first walk of the tree; hands each regular file to the data path.
fn walk(sh: Arc<Mount>) {
    let Some(tier) = sh.wait_tier() else {
        return;
    };
    let mut queue: VecDeque<PathBuf> = VecDeque::new();
    queue.push_back(PathBuf::new());
    while let Some(rel) = queue.pop_front() {
        if sh.is_shutting_down() {
            break;
        }
        let Ok(fd) = sh.dir().open_rel(&rel, OFlags::RDONLY | OFlags::DIRECTORY) else {
            continue;
        };
        let Ok(mut d) = rustix::fs::Dir::read_from(&fd) else {
            continue;
        };
        while let Some(Ok(ent)) = d.read() {
            if sh.is_shutting_down() {
                break;
            }
            let name = OsStr::from_bytes(ent.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = sys::stat_at(fd.as_fd(), name) else {
                continue;
            };
            if st.st_dev != sh.dir().dev() {
                continue;
            }
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR if queue.len() < WALK_DIRS_QUEUED_MAX => {
                    queue.push_back(rel.join(name));
                }
                libc::S_IFREG => {
                    let size = st.st_size as u64;
                    sh.preload().files_seen.fetch_add(1, Ordering::Relaxed);
                    sh.preload().bytes_seen.fetch_add(size, Ordering::Relaxed);
                    match tier {
                        Tier::Page(t) => t.resident().submit_walked(
                            FileRef {
                                key: st.st_ino,
                                path: rel.join(name),
                            },
                            size,
                        ),
                        Tier::Engine(_) => engine_preload(&sh, fd.as_fd(), &rel, name, &st),
                    }
                }
                _ => {}
            }
        }
    }
    if let Tier::Page(t) = tier {
        t.resident().walk_done();
    }
    sh.preload().done.store(true, Ordering::Release);
}

/// Engine path: creates the object of a walked file (the shared loader then fills it)
/// while the closed-object cache and the RAM budget have room.
fn engine_preload(
    sh: &Mount,
    dir: BorrowedFd<'_>,
    rel: &std::path::Path,
    name: &OsStr,
    st: &libc::stat,
) {
    let Some(Tier::Engine(t)) = sh.tier_if_set() else {
        return;
    };
    let size = st.st_size as u64;
    if size == 0 || t.objects().is_known(st.st_ino) || !t.objects().has_room() {
        return;
    }
    if sh.budget().used_bytes().saturating_add(size) > sh.budget().limit_bytes() {
        return;
    }
    let label = rel.join(name).display().to_string();
    let r = t.objects().touch(st.st_ino, &label, || {
        open_walked(dir, name, OFlags::RDWR, st.st_ino)
    });
    if r.is_ok() {
        sh.preload().files_preloaded.fetch_add(1, Ordering::Relaxed);
    }
}

/// Opens `name` in the walked directory `dir`, confined, and checks it is still the inode
/// the walk stat'ed (a rename in between makes it ESTALE, and the walk moves on).
fn open_walked(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlags, ino: u64) -> Result<File> {
    let f = sys::open_confined(dir, name, flags, rustix::fs::Mode::empty())?;
    if sys::fstat(f.as_fd())?.st_ino != ino {
        return Err(FsError::Stale);
    }
    Ok(File::from(f))
}
