//! Confined access to the backing directory.
//!
//! Invariant: after [`BackingDir::open`], the daemon never resolves a path from `/` or from
//! its working directory for the backing tree. Every access starts at the backing root
//! descriptor, or at a directory descriptor obtained that way and kept (nodes.rs), and
//! goes through `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, or through a `*at` call on a directory
//! descriptor obtained that way with a single name component and `AT_SYMLINK_NOFOLLOW` /
//! `O_NOFOLLOW`. The only paths resolved from `/` are `/proc/self/fd/N` links of descriptors
//! obtained that way (to chmod a node that cannot be opened for `fchmod`, a file's
//! description of its own in `reopen`, and the O_DIRECT reopen in
//! `dhrd_io::FileBacking::from_file`): such a link names exactly the inode its descriptor holds,
//! whatever happens to names meanwhile. A symlink planted in the backing directory is
//! therefore only ever read as a link (readlink), never followed, and nothing outside the
//! backing tree (including other mounts below it) is reached. One qualification: a kept
//! directory descriptor follows its inode, so a directory that someone moves out of the
//! backing tree while mounted (to another place in the same file system: a rename cannot
//! leave it) is still reached through its node. Whoever can do that can write both
//! places already; the daemon still acts only on that inode, never through a link.
//!
//! Crash semantics: this module only performs single system calls; the callers decide when
//! to `fsync` what (see `durable`).

use crate::error::{FsError, Result};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::ffi::{CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How every path below the backing root is resolved: never leave the root, never follow
/// a symlink (the kernel side follows symlinks of the mount, we only show them), never
/// cross into another mount (in particular never into our own FUSE mount).
pub const RESOLVE_CONFINED: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// The FUSE root node id. The kernel fixes it to 1.
pub const FUSE_ROOT_INO: u64 = 1;

/// The backing root directory, opened once.
#[derive(Debug)]
pub struct BackingDir {
    root: OwnedFd,
    dev: u64,
    root_ino: u64,
}

/// `fstatat(fd, name, AT_SYMLINK_NOFOLLOW)`; with an empty name, `fstat(fd)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: valid fd, NUL-terminated name, and a buffer of the right type.
    let r = unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), flags) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

/// `fstat` of a descriptor (works on O_PATH descriptors too).
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    stat_at(fd, OsStr::new(""))
}

/// What the set-id rules need of a file (see killpriv.rs).
#[derive(Debug, Clone, Copy)]
pub struct ModeOwner {
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    pub gid: u32,
    pub ino: u64,
}

impl From<&libc::stat> for ModeOwner {
    fn from(st: &libc::stat) -> Self {
        Self {
            mode: st.st_mode,
            gid: st.st_gid,
            ino: st.st_ino,
        }
    }
}

/// Mode, group and inode number of a descriptor, without asking for the timestamps: on
/// file systems with multigrain timestamps (ext4 and xfs among them, since Linux 6.13) a
/// stat that returns ctime marks it as queried, and the next write must then store a new
/// fine-grained ctime, i.e. dirty the inode. A plain fstat before every 4 KiB sync write
/// cost about 20 us of daemon CPU per write on the ext4 backing (0.8x the IOPS); this
/// statx does not.
pub fn mode_owner(fd: BorrowedFd<'_>) -> io::Result<ModeOwner> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let want = StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::GID | StatxFlags::INO;
    let x = statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        want,
    )?;
    Ok(ModeOwner {
        mode: u32::from(x.stx_mode),
        gid: x.stx_gid,
        ino: x.stx_ino,
    })
}

pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Changes the mode of `dir/name` without following a symlink there: FIFOs, sockets and
/// device nodes, which cannot be opened for an `fchmod` without side effects (a FIFO open
/// blocks, a device open reaches the driver). `fchmodat(AT_SYMLINK_NOFOLLOW)` is refused
/// by kernels without fchmodat2, so the node is opened `O_PATH | O_NOFOLLOW` (which touches
/// nothing) and changed through its /proc/self/fd link, which names exactly that inode.
/// `expect_ino` guards against the name having been replaced in between.
pub fn chmod_node(dir: BorrowedFd<'_>, name: &OsStr, mode: Mode, expect_ino: u64) -> Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = fstat(fd.as_fd())?;
    if st.st_ino != expect_ino {
        return Err(FsError::Stale);
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        // Linux keeps symlink modes fixed; say so as chmod(2) on one would.
        return Err(FsError::Errno(libc::EOPNOTSUPP));
    }
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link.as_str(), mode)?;
    Ok(())
}

/// A new open file description of the inode `fd` holds, with `fd`'s access mode, through
/// its /proc/self/fd link (which names exactly that inode, also once it has no name).
/// Its own description means its own place in the file's writeback error sequence: an
/// error one description's sync takes (the kernel reports it once per description) is
/// still reported to the other's next sync.
pub fn reopen(fd: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    let access = rustix::fs::fcntl_getfl(fd)? & OFlags::RWMODE;
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let file = rustix::fs::open(link.as_str(), access | OFlags::CLOEXEC, Mode::empty())?;
    Ok(file.into())
}

/// The device number of a FUSE MKNOD request: the kernel sends it in its 32-bit encoding
/// (`new_encode_dev`: minor's low byte, 12 bits of major, then the minor's upper bits).
pub fn decode_fuse_rdev(rdev: u32) -> rustix::fs::Dev {
    let major = (rdev & 0x000f_ff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0x000f_ff00);
    rustix::fs::makedev(major, minor)
}

/// The 32-bit encoding of a device number that FUSE attributes carry (the inverse of
/// `decode_fuse_rdev`); the kernel decodes it with `new_decode_dev`.
pub fn encode_fuse_rdev(dev: u64) -> u32 {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// Rejects names that are not a single component: the kernel never sends them, but a
/// name with '/' or a dot-dot would defeat the single-component rule of the `*at` calls.
pub fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(FsError::Errno(libc::EINVAL));
    }
    Ok(())
}

impl BackingDir {
    /// Opens the backing root. The path given by the user is resolved normally (it is the
    /// user's choice); everything below it is confined.
    pub fn open(path: &Path) -> Result<Self> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            FsError::Setup(format!(
                "cannot open backing directory {}: {}",
                path.display(),
                io::Error::from(e)
            ))
        })?;
        let st = fstat(root.as_fd()).map_err(|e| {
            FsError::Setup(format!(
                "cannot stat backing directory {}: {e}",
                path.display()
            ))
        })?;
        // Reading the directory proves it is usable (permission, I/O) before we mount.
        let mut probe = rustix::fs::Dir::read_from(root.as_fd()).map_err(|e| {
            FsError::Setup(format!(
                "cannot read backing directory {}: {}",
                path.display(),
                io::Error::from(e)
            ))
        })?;
        if let Some(Err(e)) = probe.read() {
            return Err(FsError::Setup(format!(
                "cannot read backing directory {}: {}",
                path.display(),
                io::Error::from(e)
            )));
        }
        Ok(Self {
            root,
            dev: st.st_dev,
            root_ino: st.st_ino,
        })
    }

    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// Maps a backing inode number to the FUSE node id: the root swaps places with 1 so that
    /// node ids stay equal to backing inode numbers (readdir's d_ino matches stat's st_ino).
    pub fn fuse_ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            FUSE_ROOT_INO
        } else if backing_ino == FUSE_ROOT_INO {
            self.root_ino
        } else {
            backing_ino
        }
    }

    /// The inverse of [`fuse_ino`](Self::fuse_ino) (the swap is its own inverse).
    pub fn backing_ino(&self, fuse_ino: u64) -> u64 {
        self.fuse_ino(fuse_ino)
    }

    /// Opens a path relative to the backing root, confined.
    pub fn open_rel(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        open_confined(self.root.as_fd(), rel.as_os_str(), flags, Mode::empty())
    }
}

/// `openat2` confined below `dir`, never following a symlink, close-on-exec.
pub fn open_confined(
    dir: BorrowedFd<'_>,
    rel: &OsStr,
    flags: OFlags,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let rel: &OsStr = if rel.is_empty() { OsStr::new(".") } else { rel };
    rustix::fs::openat2(
        dir,
        rel,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        mode,
        RESOLVE_CONFINED,
    )
    .map_err(io::Error::from)
}

/// What one fsync makes durable on a file system, as far as the committer cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    /// A journal that one fsync commits for every change made so far, whoever made it:
    /// ext4 with a journal (jbd2 commits transactions in order; its fast commits also
    /// cover every queued inode), xfs (a log force up to the inode's sequence).
    Shared,
    /// An fsync logs the inode it is given and what that inode needs, not the rest
    /// (btrfs's log tree).
    PerInode,
    /// No journal: an fsync writes that inode and its parents in place (ext4 made without
    /// one, where `/sys/fs/ext4/<device>/journal_task` says "<none>").
    Without,
    Unknown,
}

/// The journal of the file system holding `fd`.
pub fn journal(fd: BorrowedFd<'_>) -> Journal {
    const EXT4_SUPER_MAGIC: i64 = 0xEF53;
    const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
    let Ok(fs) = rustix::fs::fstatfs(fd) else {
        return Journal::Unknown;
    };
    // f_type is a different integer type on other targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = fs.f_type as i64;
    match magic {
        XFS_SUPER_MAGIC => Journal::Shared,
        BTRFS_SUPER_MAGIC => Journal::PerInode,
        EXT4_SUPER_MAGIC => ext4_journal(fd).unwrap_or(Journal::Unknown),
        _ => Journal::Unknown,
    }
}

fn ext4_journal(fd: BorrowedFd<'_>) -> Option<Journal> {
    let st = fstat(fd).ok()?;
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    // /sys/dev/block/M:m links to the device's directory, whose name ext4 uses under
    // /sys/fs/ext4; journal_task holds the pid of the journal thread, or "<none>".
    let dev = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let task = std::path::Path::new("/sys/fs/ext4")
        .join(dev.file_name()?)
        .join("journal_task");
    let t = std::fs::read_to_string(task).ok()?;
    Some(if t.trim().parse::<u32>().is_ok() {
        Journal::Shared
    } else {
        Journal::Without
    })
}

/// `fsync` that reports the failure instead of ignoring it.
pub fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::fsync(fd).map_err(io::Error::from)
}

/// The writeback error of `fd`'s file not yet reported to this open file description,
/// without writing or syncing anything: `sync_file_range(SYNC_FILE_RANGE_WAIT_BEFORE)`
/// waits for writeback in flight and then reports (and consumes) the description's
/// error as fsync would (`file_fdatawait_range`), but commits no journal and flushes no
/// device cache.
pub fn writeback_error(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: sync_file_range on a descriptor we borrow; no memory is passed.
    let r =
        unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WAIT_BEFORE) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes the file's dirty pages, waits for them and reports the writeback error the
/// description has not seen yet, if any (errseq): no journal commit, no device flush.
pub fn writeback_check(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: sync_file_range on a descriptor we borrow; no memory is passed.
    let r = unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, flags) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `syncfs` of the file system holding `fd`.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::syncfs(fd).map_err(io::Error::from)
}

/// Drops a file's clean pages from the page cache (POSIX_FADV_DONTNEED); advice only, so
/// a failure changes nothing but memory use.
pub fn drop_cache(fd: BorrowedFd<'_>) {
    // SAFETY: advice on a descriptor we borrow; no memory is passed.
    unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_device_numbers_round_trip() {
        // Small and large majors and minors, as mknod(2) and the kernel's new_encode_dev
        // see them: /dev/null (1, 3), a 12-bit major, a 20-bit minor.
        for (major, minor) in [(1, 3), (8, 17), (4095, 255), (259, 0x000f_ffff)] {
            let dev = rustix::fs::makedev(major, minor);
            let wire = encode_fuse_rdev(dev);
            assert_eq!(decode_fuse_rdev(wire), dev, "{major}:{minor}");
        }
        // The kernel's encoding of 8:17 (new_encode_dev): minor low byte, major above it.
        assert_eq!(encode_fuse_rdev(rustix::fs::makedev(8, 17)), (8 << 8) | 17);
    }
}
