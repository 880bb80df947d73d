//! Everything checked before an attach changes anything: the directory, its file system,
//! what the durability mode needs of it, the kernel, and that no other dhrd daemon serves
//! it. Every refusal names what is missing and what to use instead (often the FUSE mount,
//! which keeps its backing on any file system); the plan says how the mode is kept.
//!
//! Which design keeps `sync` (measured, docs/attach.md): where the directory is the root
//! of its file system, the file system's own `sync` option (`syncmount.rs`), which holds
//! for every inode with no window; in a subdirectory of an ext4, inode flags that new
//! inodes inherit, plus repairs (`flags.rs`, `watch.rs`), with the windows
//! docs/crash-model.md states. Anything else is refused for `sync`.
//!
//! Invariants: nothing here writes; the only lasting effect of a successful check is the
//! exclusive `flock` on the directory, held by the returned plan (released by the kernel
//! if the daemon dies). No crash semantics.

use crate::error::{AttachError, Result};
use crate::fanotify::{Group, MarkOn};
use crate::holders;
use crate::mountinfo::{self, MountEntry};
use crate::record::Record;
use crate::watch::Scope;
use dhrd_engine::Durability;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How `sync` is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncBy {
    /// The file system's `sync` option (dhrd's own if it set it).
    MountOption,
    /// Sync and dirsync flags on every inode of the tree, inherited by new ones.
    InodeFlags,
    /// Not `sync` mode.
    Nothing,
}

impl std::fmt::Display for SyncBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncBy::MountOption => "the file system's sync option",
            SyncBy::InodeFlags => "inode sync flags (new inodes inherit them; moves in repaired)",
            SyncBy::Nothing => "fsync by the applications",
        })
    }
}

/// What the checks found; holds the directory's lock.
pub struct Plan {
    pub dir: PathBuf,
    /// The directory, open; its `flock` is dhrd's claim on it.
    pub root: OwnedFd,
    pub dev: u64,
    pub mount: MountEntry,
    pub scope: Scope,
    pub sync_by: SyncBy,
    /// A record left by a daemon that did not detach (a crash).
    pub previous: Option<Record>,
    /// The fanotify group the check made, kept for the watch: closing a group waits for
    /// an SRCU grace period (`fsnotify_destroy_group`): 10.9 ms of a cold start under
    /// strace. It carries a `FAN_CREATE` mark on the directory, part of
    /// what the watch asks of it in either scope.
    pub group: Group,
}

/// Local file systems whose `sync` mount option makes every write and every directory
/// change synchronous (they test `IS_SYNC` / `IS_DIRSYNC`).
const SYNC_OPTION_FS: &[&str] = &["ext4", "ext3", "ext2", "xfs", "btrfs"];
/// File systems whose new inodes inherit the sync and dirsync flags of their directory.
const INHERITING_FS: &[&str] = &["ext4", "ext3", "ext2"];
/// File systems that keep nothing across a power cut.
const VOLATILE_FS: &[&str] = &["tmpfs", "ramfs", "devtmpfs", "hugetlbfs"];
/// File systems on another machine: their `fsync` is the server's; `sync` is not theirs to
/// give per write and directory change the way a local disk's is.
const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ceph",
    "9p",
    "glusterfs",
    "afs",
    "virtiofs",
];

fn refused(msg: String) -> AttachError {
    AttachError::Refused(msg)
}

/// The alternative offered when the file system cannot give what the mode needs.
fn fuse_alternative(dir: &Path) -> String {
    format!(
        "or keep the files on a durable local file system and serve them at {} through \
         the FUSE mount (dhrd mount BACKING_DIR {})",
        dir.display(),
        dir.display()
    )
}

/// Runs every check; on success the returned plan holds the directory's lock.
pub fn check(dir: &Path, durability: Durability) -> Result<Plan> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| {
        refused(format!(
            "{}: {}",
            dir.display(),
            if e.kind() == std::io::ErrorKind::NotFound {
                "no such directory".to_string()
            } else {
                e.to_string()
            }
        ))
    })?;
    let canon = dir
        .canonicalize()
        .map_err(|e| refused(format!("{}: {e}", dir.display())))?;
    if !std::fs::metadata(&canon).is_ok_and(|m| m.is_dir()) {
        return Err(refused(format!(
            "{} is not a directory ({}); attach holds a directory's files in RAM",
            dir.display(),
            kind_of(&meta)
        )));
    }
    let root: OwnedFd = std::fs::File::open(&canon)
        .map_err(|e| refused(format!("{}: {e}", canon.display())))?
        .into();
    let mount = mountinfo::mount_of(root.as_fd())
        .map_err(|e| refused(format!("finding the mount of {}: {e}", canon.display())))?;
    check_fs(&canon, &mount, durability)?;
    let scope = if mount.mount_point == canon && mount.root == Path::new("/") {
        Scope::Filesystem
    } else {
        Scope::Tree
    };
    let sync_by = sync_design(&canon, &mount, scope, durability, root.as_fd())?;
    let group = check_fanotify(&canon, &root, scope)?;
    let dev = std::fs::metadata(&canon).map(|m| m.dev()).unwrap_or(0);
    lock(&canon, &root, dev)?;
    let previous = Record::read(root.as_fd())
        .map_err(|e| refused(format!("reading dhrd's record on {}: {e}", canon.display())))?;
    Ok(Plan {
        dir: canon,
        root,
        dev,
        mount,
        scope,
        sync_by,
        previous,
        group,
    })
}

fn kind_of(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "a symlink to something else"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// The file system's kind against the mode.
fn check_fs(dir: &Path, m: &MountEntry, durability: Durability) -> Result<()> {
    let fs = m.fstype.as_str();
    // A dhrd mount names its backing as its source (fstype "fuse" or "fuse.dhrd").
    if fs.starts_with("fuse") && m.source.starts_with("dhrd:") {
        let backing = m.source.strip_prefix("dhrd:").unwrap_or(&m.source);
        let holder = std::fs::metadata(backing)
            .ok()
            .and_then(|b| holders::holder_of(b.dev(), b.ino()))
            .map(|h| format!(", served by {h}"))
            .unwrap_or_default();
        return Err(refused(format!(
            "{} is on a dhrd mount (backing {backing}{holder}): its files are in RAM already; \
             to hold them in place instead, unmount it (dhrd umount) and attach {backing}",
            dir.display()
        )));
    }
    if fs.starts_with("fuse") {
        return Err(refused(format!(
            "{} is on a FUSE file system ({fs}): what is durable there is its server's \
             business, and dhrd cannot make its writes synchronous; attach the directory \
             that server keeps its data in, {}",
            dir.display(),
            fuse_alternative(dir)
        )));
    }
    if VOLATILE_FS.contains(&fs) {
        return Err(refused(format!(
            "{} is on {fs}, which keeps nothing across a power cut: no durability mode can \
             hold there; put the files on a durable file system and attach that, {}",
            dir.display(),
            fuse_alternative(dir)
        )));
    }
    if durability == Durability::Sync && NETWORK_FS.contains(&fs) {
        return Err(refused(format!(
            "{} is on {fs}, a network file system: dhrd cannot make every write and \
             directory change durable on return there; use --durability fsync (durable at \
             fsync, as the server promises), {}",
            dir.display(),
            fuse_alternative(dir)
        )));
    }
    if durability == Durability::Sync && m.read_only() {
        return Err(refused(format!(
            "{} is on a read-only mount: --durability sync has nothing to keep durable and \
             cannot set what it needs; use --durability fsync to hold the files in RAM",
            dir.display()
        )));
    }
    Ok(())
}

/// Which design keeps `sync` here, or why none can.
fn sync_design(
    dir: &Path,
    m: &MountEntry,
    scope: Scope,
    durability: Durability,
    root: std::os::fd::BorrowedFd<'_>,
) -> Result<SyncBy> {
    if durability != Durability::Sync {
        return Ok(SyncBy::Nothing);
    }
    let fs = m.fstype.as_str();
    if scope == Scope::Filesystem && SYNC_OPTION_FS.contains(&fs) {
        return Ok(SyncBy::MountOption);
    }
    if scope == Scope::Tree && INHERITING_FS.contains(&fs) {
        return match dhrd_pagecache::inode_flags(root) {
            Ok(_) => Ok(SyncBy::InodeFlags),
            Err(e) => Err(refused(format!(
                "{}: the inode flags of this {fs} cannot be read ({e}); --durability sync in a \
                 subdirectory keeps every inode's sync flag",
                dir.display()
            ))),
        };
    }
    let why = if SYNC_OPTION_FS.contains(&fs) {
        format!(
            "{} is a subdirectory of a {fs} file system (mounted at {}), whose new files do \
             not inherit the sync flag from their directory as ext4's do",
            dir.display(),
            m.mount_point.display()
        )
    } else {
        format!(
            "{} is on {fs}, where dhrd knows no way to make every write and directory change \
             synchronous (no sync mount option it trusts, no inherited sync flags)",
            dir.display()
        )
    };
    Err(refused(format!(
        "--durability sync: {why}; attach the root of a file system of its own (ext4, xfs or \
         btrfs: dhrd then mounts it sync), or a directory on ext4, or use --durability \
         fsync, {}",
        fuse_alternative(dir)
    )))
}

/// The kernel and privileges: a FID-reporting fanotify group and a mark of the kind the
/// scope needs, asking for the one event both scopes' watches ask of DIR (no lasting
/// effect: the group dies with the process). Returns the group for the watch.
fn check_fanotify(dir: &Path, root: &OwnedFd, scope: Scope) -> Result<Group> {
    let g = Group::new().map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::EPERM) => "needs root (CAP_SYS_ADMIN) for fanotify".to_string(),
            Some(libc::EINVAL) => {
                "needs Linux >= 5.17 (fanotify reporting files by handle, renames)".to_string()
            }
            _ => format!("fanotify: {e}"),
        };
        refused(format!(
            "attaching {}: {why}; {}",
            dir.display(),
            fuse_alternative(dir)
        ))
    })?;
    let on = match scope {
        Scope::Filesystem => MarkOn::Filesystem,
        Scope::Tree => MarkOn::Inode,
    };
    g.add(on, root.as_fd(), libc::FAN_CREATE).map_err(|e| {
        refused(format!(
            "{}: fanotify cannot watch this file system ({e}; it must report files by \
                 handle); {}",
            dir.display(),
            fuse_alternative(dir)
        ))
    })?;
    Ok(g)
}

/// Takes the directory's exclusive flock, and refuses a directory above or below one
/// another dhrd daemon serves.
fn lock(dir: &Path, root: &OwnedFd, dev: u64) -> Result<()> {
    use rustix::fs::{flock, FlockOperation};
    match flock(root, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let ino = std::fs::metadata(dir).map(|m| m.ino()).unwrap_or(0);
            let who = holders::holder_of(dev, ino)
                .map(|h| format!("by {h}"))
                .unwrap_or_else(|| "by another process".into());
            return Err(refused(format!(
                "{} is held already {who}: a dhrd daemon (attach, or a mount whose backing \
                 directory it is) serves it; detach or unmount it first",
                dir.display()
            )));
        }
        Err(e) => {
            return Err(refused(format!(
                "cannot lock {}: {}",
                dir.display(),
                std::io::Error::from(e)
            )))
        }
    }
    if let Some(h) = holders::dhrd_near(dir, dev) {
        let _ = flock(root, FlockOperation::Unlock);
        let p = h.path.as_deref().unwrap_or(Path::new("?"));
        let rel = if p.starts_with(dir) {
            "inside"
        } else {
            "above"
        };
        return Err(refused(format!(
            "{} overlaps {} ({rel} it), which {h} serves: two daemons would pin and flag the \
             same files; detach or unmount that first",
            dir.display(),
            p.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    fn entry(fstype: &str, mount_point: &str, super_opts: &str) -> MountEntry {
        MountEntry {
            id: 1,
            root: PathBuf::from("/"),
            mount_point: PathBuf::from(mount_point),
            fstype: fstype.into(),
            source: "/dev/x".into(),
            mount_opts: vec!["rw".into()],
            super_opts: super_opts.split(',').map(str::to_owned).collect(),
        }
    }

    fn msg(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(AttachError::Refused(m)) => m,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn each_file_system_gets_the_design_it_can_give_or_a_refusal_naming_it() {
        let d = Path::new("/srv/data");
        let root = std::fs::File::open("/").expect("root");
        let fd = root.as_fd();
        let sync = Durability::Sync;
        let fs_root = Scope::Filesystem;
        for fs in ["ext4", "xfs", "btrfs"] {
            let m = entry(fs, "/srv/data", "rw");
            assert_eq!(
                sync_design(d, &m, fs_root, sync, fd).unwrap(),
                SyncBy::MountOption
            );
        }
        let m = entry("ext4", "/srv", "rw");
        assert_eq!(
            sync_design(d, &m, Scope::Tree, sync, fd).unwrap(),
            SyncBy::InodeFlags
        );
        let m = entry("xfs", "/srv", "rw");
        let e = msg(sync_design(d, &m, Scope::Tree, sync, fd));
        assert!(
            e.contains("do not inherit") && e.contains("dhrd mount"),
            "{e}"
        );
        let m = entry("vfat", "/srv/data", "rw");
        let e = msg(sync_design(d, &m, fs_root, sync, fd));
        assert!(
            e.contains("vfat") && e.contains("--durability fsync"),
            "{e}"
        );
        assert_eq!(
            sync_design(d, &m, fs_root, Durability::Fsync, fd).unwrap(),
            SyncBy::Nothing
        );

        let nfs = entry("nfs4", "/srv", "rw");
        let e = msg(check_fs(d, &nfs, sync));
        assert!(e.contains("network") && e.contains("dhrd mount"), "{e}");
        assert!(
            check_fs(d, &nfs, Durability::Fsync).is_ok(),
            "fsync on NFS is the server's"
        );
        let e = msg(check_fs(
            d,
            &entry("fuse.sshfs", "/srv", "rw"),
            Durability::Fsync,
        ));
        assert!(e.contains("FUSE"), "{e}");
        let e = msg(check_fs(
            d,
            &entry("tmpfs", "/srv", "rw"),
            Durability::Fsync,
        ));
        assert!(e.contains("power cut"), "{e}");
        let mut ro = entry("ext4", "/srv", "ro");
        ro.mount_opts = vec!["ro".into()];
        let e = msg(check_fs(d, &ro, sync));
        assert!(e.contains("read-only"), "{e}");
        assert!(check_fs(d, &ro, Durability::Fsync).is_ok());
    }
}
