//! `sync` by the file system's own mount option: when the directory is the root of its
//! file system, dhrd reconfigures the file system `sync` (and back to `async` at detach).
//!
//! Why this design where it applies: the kernel then treats every inode of the file
//! system as synchronous (`IS_SYNC` and `IS_DIRSYNC` test the superblock's flag before the
//! inode's), so every write and every directory change is durable when it returns,
//! whatever file it touches, however it got there (created, renamed in, linked in), and no
//! one can clear it for one file: exactly what `mount -o sync,dirsync` gives (`sync`
//! implies `dirsync`). It is a flag of the superblock, so every mount of that file system
//! becomes synchronous, and it stays if the daemon dies (still safe: only slower if the
//! daemon never comes back).
//!
//! The change goes through `fspick` and `fsconfig` (the new mount API): only the one flag
//! changes, where a classic `mount -o remount` restates (or resets) every option.
//!
//! Invariants: dhrd turns `sync` on only on a file system that did not have it (the record
//! says so), and off only where the record says it turned it on. Crash semantics: the
//! option is in force from the moment the reconfigure returns until the one at detach.

use crate::mountinfo;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

/// Sets (`on`) or clears the file system's `sync` option; `dir` must be the root of a
/// mount of it. Checks the result in mountinfo.
pub fn set_sync(dir: &Path, on: bool) -> io::Result<()> {
    use rustix::mount::{fsconfig_reconfigure, fsconfig_set_flag, fspick, FsPickFlags};
    let fc = fspick(
        rustix::fs::CWD,
        dir,
        FsPickFlags::FSPICK_CLOEXEC | FsPickFlags::FSPICK_SYMLINK_NOFOLLOW,
    )?;
    fsconfig_set_flag(&fc, if on { "sync" } else { "async" })?;
    fsconfig_reconfigure(&fc)?;
    let d = std::fs::File::open(dir)?;
    let now = mountinfo::mount_of(d.as_fd())?.has_super_opt("sync");
    if now != on {
        return Err(io::Error::other(format!(
            "the file system at {} did not take the option {}",
            dir.display(),
            if on { "sync" } else { "async" }
        )));
    }
    Ok(())
}
