//! The kernel's page cache of a file as a RAM tier: what it holds of a file (`cachestat`,
//! with `mincore` where the kernel lacks it), and the inode flag that makes every write
//! to a file synchronous (`FS_SYNC_FL`, `chattr +S`).
//!
//! Why the sync flag: a file system that honours it marks the inode `S_SYNC`, and the
//! kernel then treats every write to it as `O_DSYNC` (`iocb_is_dsync` checks `IS_SYNC` of
//! the inode, whoever opened it and with whatever flags), so a write returns only once
//! its data, and the size when the write extended the file, are on the device. That holds
//! for writes the kernel makes on an application's behalf through FUSE passthrough,
//! which never reach a daemon that could sync them itself.
//!
//! How the daemon opens files it only warms or pins: with O_NOATIME where it may
//! (`open_noatime`), so that its reads leave the access times applications see.
//!
//! And the per-user and per-process limits a pinning daemon meets (`vm.max_map_count`,
//! `fs.fanotify.max_user_marks`): read, and raised by doubling, never lowered (other
//! programs may rely on a raised limit by then).
//!
//! Invariants: these are single system calls with no state of their own. The flag is a
//! persistent inode attribute: it stays after the process that set it exits, and setting
//! it updates the inode's ctime once.
//!
//! Crash semantics: setting or clearing the flag is a metadata change like a chmod; a crash
//! right after may lose it. Callers that rely on it re-check it when they open the file.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use dhrd_io::PAGE_BYTES;

/// `FS_SYNC_FL` from linux/fs.h: synchronous updates.
pub const FS_SYNC_FL: libc::c_int = 0x0000_0008;
/// `FS_DIRSYNC_FL` from linux/fs.h: directory changes are synchronous.
pub const FS_DIRSYNC_FL: libc::c_int = 0x0001_0000;
/// The xattr marking a sync flag dhrd set (and may therefore clear); an unmarked flag is
/// an administrator's and stays. Every frontend that sets the flag uses it, so each knows
/// the others' flags for its own.
pub const SYNC_MARK_XATTR: &str = "trusted.dhrd.sync";
/// The `cachestat` system call number (the same on every architecture that has it).
const SYS_CACHESTAT: libc::c_long = 451;

/// What the page cache holds of a byte range of a file, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub cached_pages: u64,
    /// Cached pages modified in RAM and not yet written back to the device.
    pub dirty_pages: u64,
    /// Pages being written back right now.
    pub writeback_pages: u64,
    /// Pages of the range evicted from the cache since the file was last cached.
    pub evicted_pages: u64,
    /// Evicted pages that were in use recently (they would have been hits).
    pub recently_evicted_pages: u64,
}

impl CacheStat {
    pub fn cached_bytes(&self) -> u64 {
        self.cached_pages.saturating_mul(PAGE_BYTES)
    }
}

/// How a `CacheStat` was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatSource {
    /// cachestat(2), kernel >= 6.5: every field is exact.
    Cachestat,
    /// mincore(2) on a mapping: only `cached_pages`; the rest read 0.
    Mincore,
}

#[repr(C)]
#[derive(Default)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct CachestatOut {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// What the page cache holds of `len` bytes of `fd` from `offset` (`len` 0: to the end of
/// the file). Uses cachestat(2), or mincore(2) on a temporary mapping on kernels without
/// it (then only `cached_pages` is known, and `fd` must be open for reading).
pub fn cachestat(
    fd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
) -> io::Result<(CacheStat, CacheStatSource)> {
    match cachestat_exact(fd, offset, len) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {}
        r => return r.map(|c| (c, CacheStatSource::Cachestat)),
    }
    let cached = mincore_pages(fd, offset, len)?;
    Ok((
        CacheStat {
            cached_pages: cached,
            ..CacheStat::default()
        },
        CacheStatSource::Mincore,
    ))
}

/// `cachestat` by cachestat(2) alone: ENOSYS on kernels before 6.5, where the caller
/// decides whether mincore's mapping of the range is worth it.
pub fn cachestat_exact(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<CacheStat> {
    let range = CachestatRange { off: offset, len };
    let mut out = CachestatOut::default();
    // SAFETY: cachestat reads `range` and writes `out`, both live locals of the layouts the
    // kernel expects (struct cachestat_range, struct cachestat); flags must be 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut CachestatOut,
            0u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cached_pages: out.nr_cache,
        dirty_pages: out.nr_dirty,
        writeback_pages: out.nr_writeback,
        evicted_pages: out.nr_evicted,
        recently_evicted_pages: out.nr_recently_evicted,
    })
}

/// Cached pages of a range by mincore(2) on a read-only shared mapping of it (`fd` must
/// be open for reading).
fn mincore_pages(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
    let size = file_len(fd)?;
    let start = offset - offset % PAGE_BYTES;
    let end = if len == 0 {
        size
    } else {
        offset.saturating_add(len).min(size)
    };
    if end <= start {
        return Ok(0);
    }
    let map_len = (end - start) as usize;
    // SAFETY: a fresh read-only shared mapping of a file we hold open; unmapped below,
    // never dereferenced (mincore only inspects page residency).
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            start as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let pages = map_len.div_ceil(PAGE_BYTES as usize);
    let mut vec = vec![0u8; pages];
    // SAFETY: `addr` is the page-aligned mapping of `map_len` bytes made above and `vec` has
    // one byte per page of it.
    let r = unsafe { libc::mincore(addr, map_len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(addr, map_len) };
    if r != 0 {
        return Err(err);
    }
    Ok(vec.iter().filter(|b| **b & 1 != 0).count() as u64)
}

fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat fills the buffer of the right type for a valid descriptor.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded.
    Ok(unsafe { st.assume_init() }.st_size.max(0) as u64)
}

/// Opens with O_NOATIME where the caller may: `open` gets the flag (then 0) to add to its
/// open's flags. The daemon's own reads of a file (a warm-up, a pin's `mmap`) are not an
/// application's, and must not set its access time: under `relatime` the first read after
/// a write does, which tells a mail reader that new mail was read and keeps files young
/// for cleaners that go by access time (and dirties the inode, a journal handle each).
/// Without the right to the flag (not the owner, no CAP_FOWNER: EPERM), opens as usual.
pub fn open_noatime<T>(open: impl Fn(libc::c_int) -> io::Result<T>) -> io::Result<T> {
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        r => r,
    }
}

/// A new read-only open file description of `file`'s inode, with O_NOATIME where allowed
/// ([`open_noatime`]); through /proc/self/fd, which reaches a file whose last name is gone
/// too.
pub fn reopen_noatime(file: &std::fs::File) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    open_noatime(|noatime| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(noatime)
            .open(&path)
    })
}

/// Whether reads through `fd`'s open file description leave the access time alone.
pub fn reads_keep_atime(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: F_GETFL on a descriptor we hold; no memory is passed.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_NOATIME != 0)
}

/// The size of an open file by a `statx` that asks for the size only. Why not `fstat`: on
/// file systems with fine-grained timestamps (ext4 and xfs since Linux 6.13) a stat that
/// returns ctime marks it as seen, and the file's next write must then store a new
/// fine-grained ctime, dirtying its inode; a warm-up or bookkeeping stat has no reason to
/// cause that.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(statx_only(fd, libc::STATX_SIZE)?.stx_size)
}

/// The link count of an open file (0 once its last name is gone), by a `statx` that asks
/// for nothing else (see `file_size`).
pub fn link_count(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(u64::from(statx_only(fd, libc::STATX_NLINK)?.stx_nlink))
}

fn statx_only(fd: BorrowedFd<'_>, mask: u32) -> io::Result<libc::statx> {
    let mut x = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a valid descriptor, an empty NUL-terminated path with AT_EMPTY_PATH, and a
    // buffer of the right type that the kernel fills.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            x.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded and filled the struct.
    Ok(unsafe { x.assume_init() })
}

/// The inode flags of `fd` (`FS_IOC_GETFLAGS`).
pub fn inode_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (the kernel's convention, despite the long in
    // the ioctl's declared type) into `flags`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// Whether the file behind `fd` has `FS_SYNC_FL` set.
pub fn sync_flag(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(inode_flags(fd)? & FS_SYNC_FL != 0)
}

/// Sets or clears `FS_SYNC_FL` on the file behind `fd`, leaving its other flags as they
/// are. Returns whether it changed anything. Needs the file's owner or CAP_FOWNER; file
/// systems without the flag (tmpfs, ...) refuse with EOPNOTSUPP, ENOTTY or EINVAL.
pub fn set_sync_flag(fd: BorrowedFd<'_>, on: bool) -> io::Result<bool> {
    set_inode_flags(fd, FS_SYNC_FL, on)
}

/// Sets (`on`) or clears every flag of `mask` on the file behind `fd`, leaving its other
/// flags as they are; returns whether it changed anything. Refused like `set_sync_flag`;
/// a file system that accepts the call but drops a flag of `mask` is refused with
/// EOPNOTSUPP.
pub fn set_inode_flags(fd: BorrowedFd<'_>, mask: libc::c_int, on: bool) -> io::Result<bool> {
    let flags = inode_flags(fd)?;
    let want = if on { flags | mask } else { flags & !mask };
    if want == flags {
        return Ok(false);
    }
    // SAFETY: FS_IOC_SETFLAGS reads one int from `want`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_SETFLAGS, &want) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // Some file systems accept the call and drop flags they do not keep.
    let now = inode_flags(fd)? & mask;
    if now != (if on { mask } else { 0 }) {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    Ok(true)
}

/// Whether the file system of directory `dir` keeps `FS_SYNC_FL`: tried on an unnamed
/// temporary file (O_TMPFILE), which never appears in the tree and is gone when closed.
/// File systems without O_TMPFILE count as refusing (the caller falls back).
pub fn probe_sync_flag(dir: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: openat with a NUL-terminated "." relative to a directory descriptor.
    let raw = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_sync_flag(fd.as_fd(), true).map(|_| ())
}

/// A numeric sysctl (a file under /proc/sys), or `None` if it cannot be read or parsed.
pub fn read_sysctl(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// What `double_sysctl` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlRaise {
    /// Written: the value was `from`, is now `to` (at most the ceiling).
    Raised { from: u64, to: u64 },
    /// Already at or above the ceiling (perhaps someone raised it meanwhile): `now`.
    AtCeiling { now: u64 },
}

/// Doubles the sysctl at `path`, up to `ceiling`. Never lowers it. Needs root to write.
pub fn double_sysctl(path: &Path, ceiling: u64) -> io::Result<SysctlRaise> {
    let now = read_sysctl(path).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a number this process can read", path.display()),
        )
    })?;
    let want = now.saturating_mul(2).min(ceiling);
    if want <= now {
        return Ok(SysctlRaise::AtCeiling { now });
    }
    // The values go into the error: a refusal should say what was asked of what.
    std::fs::write(path, format!("{want}\n")).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {want} to {} (now {now}): {e}", path.display()),
        )
    })?;
    Ok(SysctlRaise::Raised {
        from: now,
        to: want,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn cachestat_sees_written_pages_and_their_sync() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .expect("create");
        f.write_all(&vec![7u8; 64 * 1024]).expect("write");
        let (st, src) = cachestat(f.as_fd(), 0, 0).expect("cachestat");
        assert_eq!(st.cached_pages, 16, "{st:?} via {src:?}");
        if src == CacheStatSource::Cachestat {
            assert!(st.dirty_pages + st.writeback_pages > 0, "{st:?}");
            f.sync_data().expect("fdatasync");
            let (st, _) = cachestat(f.as_fd(), 0, 0).expect("cachestat");
            assert_eq!((st.dirty_pages, st.writeback_pages), (0, 0), "{st:?}");
        } else {
            dhrd_testkit::skip("no cachestat(2) (Linux 6.5): dirty and writeback counts");
        }
        let (part, _) = cachestat(f.as_fd(), 4096, 8192).expect("range");
        assert_eq!(part.cached_pages, 2);
        assert_eq!(mincore_pages(f.as_fd(), 0, 0).expect("mincore"), 16);
    }

    #[test]
    fn a_sysctl_doubles_up_to_its_ceiling_and_never_drops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("limit");
        std::fs::write(&p, "1000\n").expect("write");
        assert_eq!(
            double_sysctl(&p, 3000).expect("raise"),
            SysctlRaise::Raised {
                from: 1000,
                to: 2000
            }
        );
        assert_eq!(
            double_sysctl(&p, 3000).expect("raise"),
            SysctlRaise::Raised {
                from: 2000,
                to: 3000
            }
        );
        assert_eq!(
            double_sysctl(&p, 3000).expect("at the ceiling"),
            SysctlRaise::AtCeiling { now: 3000 }
        );
        // A ceiling below the value never lowers it.
        assert_eq!(
            double_sysctl(&p, 10).expect("above"),
            SysctlRaise::AtCeiling { now: 3000 }
        );
        assert_eq!(read_sysctl(&p), Some(3000));
        std::fs::write(&p, "many").expect("write");
        assert!(double_sysctl(&p, 3000).is_err());
        assert!(double_sysctl(&dir.path().join("absent"), 3000).is_err());
    }

    #[test]
    fn a_refused_raise_names_the_value_it_had_and_the_one_it_wanted() {
        // Read-only even for root (mode 0444): the write is refused.
        let p = Path::new("/proc/sys/kernel/ngroups_max");
        let Some(now) = read_sysctl(p) else {
            eprintln!("skipped: {} is not readable here", p.display());
            return;
        };
        let e = double_sysctl(p, u64::MAX).expect_err("a read-only sysctl");
        let msg = e.to_string();
        assert!(msg.contains(&format!("writing {} ", now * 2)), "{msg}");
        assert!(msg.contains(&format!("(now {now})")), "{msg}");
        assert!(msg.contains("ngroups_max"), "{msg}");
    }

    #[test]
    fn sync_flag_round_trip_where_the_file_system_keeps_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = std::fs::File::open(dir.path()).expect("dir");
        if let Err(e) = probe_sync_flag(d.as_fd()) {
            dhrd_testkit::skip(format!(
                "the file system of {} refuses FS_SYNC_FL: {e}",
                dir.path().display()
            ));
            return;
        }
        let f = std::fs::File::create(dir.path().join("f")).expect("create");
        assert!(!sync_flag(f.as_fd()).expect("get"));
        assert!(set_sync_flag(f.as_fd(), true).expect("set"));
        assert!(sync_flag(f.as_fd()).expect("get"));
        assert!(!set_sync_flag(f.as_fd(), true).expect("set again changes nothing"));
        assert!(set_sync_flag(f.as_fd(), false).expect("clear"));
        assert!(!sync_flag(f.as_fd()).expect("get"));
    }
}
