//! Power cuts under a live mount, in every durability mode: the backing directory lives on
//! an ext4 on a loop device (with a journal, and without one), which the test shuts down
//! without flushing its journal (`EXT4_IOC_SHUTDOWN`, `EXT4_GOING_FLAGS_NOLOGFLUSH`), as a
//! power cut would leave the disk. Then everything is unmounted, the ext4 mounted again
//! (its journal replayed) and the backing files read.
//!
//! Each case writes 4 KiB records into a file of its own with one of the ways applications
//! ask for durability (O_DSYNC, O_SYNC, RWF_DSYNC, RWF_SYNC, fsync, fdatasync, syncfs,
//! msync, and fallocate, ftruncate and copy_file_range under O_SYNC/O_DSYNC), through a plain open
//! (passed through to the kernel on the page cache path) and through an O_DIRECT open
//! (served by the daemon), on the page cache path and on the engine (direct and cached
//! opens). Every write acknowledged under a durability contract (docs/crash-model.md) must
//! survive.
//!
//! The negative control: in `fsync` and `periodic` mode a plain buffered write with no
//! sync call must be lost by the cut. If it survives, the cut did not drop unsynced data
//! and the test could not have seen a loss, so it fails. In `periodic` mode the same
//! writes survive once a period that began after them has completed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One record: an O_DIRECT-sized block.
const REC: usize = 4096;
/// Records each case writes.
const RECS: usize = 8;
/// A period that never ends during a test: `periodic` must then keep its promise through
/// the calls alone, as between two periods.
const PERIODIC: &str = "periodic:3600";

/// How a case asks for its writes to be durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// Opened O_DSYNC.
    Dsync,
    /// Opened O_SYNC.
    Osync,
    /// `pwritev2(RWF_DSYNC)` on a plain open.
    RwfDsync,
    /// `pwritev2(RWF_SYNC)` on a plain open.
    RwfSync,
    /// Writes, then fsync.
    Fsync,
    /// Writes, then fdatasync.
    Fdatasync,
    /// Writes, then syncfs of the mount.
    Syncfs,
    /// Stores into a shared mapping, then msync(MS_SYNC).
    Msync,
    /// copy_file_range into a file opened O_DSYNC.
    DsyncCopy,
    /// fallocate (growing the file) of a file opened O_SYNC.
    OsyncFallocate,
    /// ftruncate (growing the file) of a file opened O_DSYNC: a SETATTR carrying the
    /// handle, which ext4 itself would not sync; docs/crash-model.md promises it.
    DsyncTruncate,
    /// Writes, no sync at all: the negative control.
    Plain,
}

const HOWS: [How; 12] = [
    How::Dsync,
    How::Osync,
    How::RwfDsync,
    How::RwfSync,
    How::Fsync,
    How::Fdatasync,
    How::Syncfs,
    How::Msync,
    How::DsyncCopy,
    How::OsyncFallocate,
    How::DsyncTruncate,
    How::Plain,
];

/// What docs/crash-model.md promises for a case after a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Promise {
    Survives,
    /// Nothing promised: the outcome is printed, not checked.
    Nothing,
    /// The negative control: must be gone, or the cut cannot show a loss.
    Lost,
}

fn promise(mode: &str, read_path: &str, how: How) -> Promise {
    match (mode, how) {
        ("sync", _) => Promise::Survives,
        // The kernel sends a FUSE daemon no syncfs (only virtiofs gets FUSE_SYNCFS), so
        // syncfs(2) on the mount reaches neither the daemon nor the backing.
        (_, How::Syncfs) => Promise::Nothing,
        // The control needs buffered writes to the backing; the engine may write its
        // chunks with O_DIRECT, which reach the device before any sync.
        (_, How::Plain) if read_path == "pagecache" => Promise::Lost,
        (_, How::Plain) => Promise::Nothing,
        _ => Promise::Survives,
    }
}

/// Block-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, REC).expect("layout");
        // SAFETY: a non-zero size; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `len` bytes and lives as long as self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, REC).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// Record `i` of file `tag`: no two records of the test alike, none all zero.
fn record(tag: &str, i: usize) -> Vec<u8> {
    let mut h = tag.bytes().fold(0xcbf2_9ce4_8422_2325u64, |a, b| {
        (a ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) ^ ((i as u64 + 1) << 40);
    (0..REC)
        .map(|_| {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            (h as u8) | 1
        })
        .collect()
}

fn check_io(r: isize, what: &str) {
    assert!(r >= 0, "{what}: {}", std::io::Error::last_os_error());
}

fn pwritev2(f: &File, buf: &[u8], off: usize, flags: i32) {
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over a live buffer, on a descriptor the caller holds.
    let r = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, off as i64, flags) };
    assert_eq!(
        r,
        buf.len() as isize,
        "pwritev2: {}",
        std::io::Error::last_os_error()
    );
}

/// The file name of a case.
fn name_of(how: How, direct: bool) -> String {
    format!("{how:?}{}", if direct { "-direct" } else { "" }).to_lowercase()
}

/// Runs one case on the mount: every call it makes returns success (the acknowledgement).
fn run_case(mnt: &Path, how: How, direct: bool) {
    let name = name_of(how, direct);
    let path = mnt.join(&name);
    let mut custom = 0;
    if direct {
        custom |= libc::O_DIRECT;
    }
    match how {
        How::Dsync | How::DsyncCopy | How::DsyncTruncate => custom |= libc::O_DSYNC,
        How::Osync | How::OsyncFallocate => custom |= libc::O_SYNC,
        _ => {}
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(custom)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    let mut buf = Aligned::new(REC);
    match how {
        How::Msync => {
            f.set_len((REC * RECS) as u64)
                .expect("size for the mapping");
            let map = SharedMap::new(&f, REC * RECS);
            for i in 0..RECS {
                let r = record(&name, i);
                for (j, b) in r.iter().enumerate() {
                    map.fill(i * REC + j, *b, 1);
                }
            }
            map.msync();
        }
        How::DsyncCopy => {
            // The source holds the records already (written and fsync'ed before the
            // mount); only the copy is under test.
            let src = File::open(mnt.join(format!("{name}.src"))).expect("source");
            let (mut off_in, mut off_out) = (0i64, 0i64);
            let mut left = REC * RECS;
            while left > 0 {
                // SAFETY: two descriptors the test holds and two offsets it owns.
                let n = unsafe {
                    libc::copy_file_range(
                        src.as_raw_fd(),
                        &mut off_in,
                        f.as_raw_fd(),
                        &mut off_out,
                        left,
                        0,
                    )
                };
                check_io(n, "copy_file_range");
                assert!(n > 0, "copy_file_range made no progress");
                left -= n as usize;
            }
        }
        How::OsyncFallocate => {
            // SAFETY: fallocate of a descriptor the test holds.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, (REC * RECS) as i64) };
            check_io(r as isize, "fallocate");
        }
        How::DsyncTruncate => {
            f.set_len((REC * RECS) as u64)
                .expect("ftruncate through the O_DSYNC open");
        }
        _ => {
            for i in 0..RECS {
                buf.bytes().copy_from_slice(&record(&name, i));
                match how {
                    How::RwfDsync => pwritev2(&f, buf.bytes(), i * REC, libc::RWF_DSYNC),
                    How::RwfSync => pwritev2(&f, buf.bytes(), i * REC, libc::RWF_SYNC),
                    _ => f
                        .write_all_at(buf.bytes(), (i * REC) as u64)
                        .expect("write"),
                }
            }
            match how {
                How::Fsync => f.sync_all().expect("fsync"),
                How::Fdatasync => f.sync_data().expect("fdatasync"),
                How::Syncfs => {
                    // SAFETY: syncfs of a descriptor the test holds.
                    let r = unsafe { libc::syncfs(f.as_raw_fd()) };
                    check_io(r as isize, "syncfs");
                }
                _ => {}
            }
        }
    }
}

/// Records of a case found intact on the backing after the cut (for the fallocate and
/// truncate cases: RECS when the size survived, else 0).
fn survivors(backing: &Path, how: How, direct: bool) -> usize {
    let name = name_of(how, direct);
    let path = backing.join(&name);
    if matches!(how, How::OsyncFallocate | How::DsyncTruncate) {
        let len = fs::metadata(&path).map_or(0, |m| m.len());
        return if len >= (REC * RECS) as u64 { RECS } else { 0 };
    }
    records_intact(&path, &name, RECS)
}

/// Syncs what the test made in `backing` (the cut then tests only what the mount does)
/// and mounts it in `mode` on `read_path`; returns the mountpoint and the mount.
fn sync_and_mount(s: &Scratch, backing: &Path, mode: &str, read_path: &str) -> (PathBuf, Mount) {
    let (ok, out) = sh(&format!("sync -f {}", backing.display()));
    assert!(ok, "sync: {out}");
    let mnt = s.sub("mnt");
    let m = Mount::start(
        backing,
        &mnt,
        &["--quiet", "--durability", mode, "--read-path", read_path],
    );
    (mnt, m)
}

/// Cuts the power under mount `m` of `mnt`, lets the dead mount go and mounts the image
/// again, journal replayed.
fn cut_and_remount(disk: &LoopFs, mnt: &Path, m: Mount) {
    disk.cut();
    // The daemon's unmount-time syncfs fails on the dead disk: its exit status says so.
    let _ = Command::new(dhrd()).arg("umount").arg(mnt).output();
    drop(m);
    assert!(!is_mounted(mnt), "the mount stayed");
    disk.remount();
}

/// How many of records 0..n of `tag` the file at `path` holds intact.
fn records_intact(path: &Path, tag: &str, n: usize) -> usize {
    let data = fs::read(path).unwrap_or_default();
    (0..n)
        .filter(|i| data.get(i * REC..(i + 1) * REC) == Some(record(tag, *i).as_slice()))
        .count()
}

/// The cases of one read path, in groups that each get a mount of their own: every way,
/// through plain and O_DIRECT opens (mmap, copy_file_range and fallocate through plain
/// opens only: O_DIRECT changes nothing there that the daemon sees). An fsync in the
/// fsync modes syncs its file and the names of it; where a name needs a syncfs of the
/// backing (a fallback, docs/crash-model.md) it would cover every other case's writes
/// too: each such case is a group of its own, so that none can hide another's loss.
fn groups(read_path: &str) -> Vec<Vec<(How, bool)>> {
    let mut alone = Vec::new();
    let mut rest = Vec::new();
    for how in HOWS {
        for direct in [false, true] {
            if direct
                && matches!(
                    how,
                    How::Msync | How::DsyncCopy | How::OsyncFallocate | How::DsyncTruncate
                )
            {
                continue;
            }
            // msync of a passed-through mapping syncs the backing file itself; on the
            // engine it is an FSYNC request like any other.
            let syncs_all = matches!(how, How::Fsync | How::Fdatasync)
                || (how == How::Msync && read_path != "pagecache");
            if syncs_all {
                alone.push(vec![(how, direct)]);
            } else {
                rest.push((how, direct));
            }
        }
    }
    alone.push(rest);
    alone
}

/// One mount on a fresh loop ext4: every case, the cut, the check. Returns the failures.
fn cut(mode: &str, journal: bool, read_path: &str, cases: &[(How, bool)]) -> Vec<String> {
    let s = Scratch::new(&format!(
        "cut-{}-{}-{read_path}",
        mode.replace(':', ""),
        if journal { "j" } else { "nj" }
    ));
    let disk = if journal {
        LoopFs::new(&s)
    } else {
        LoopFs::journal_less(&s)
    };
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    // Every file exists, empty, and is durable before the mount: the cut tests the writes.
    for (how, direct) in cases {
        let name = name_of(*how, *direct);
        File::create(backing.join(&name)).expect("create");
        if *how == How::DsyncCopy {
            let src: Vec<u8> = (0..RECS).flat_map(|i| record(&name, i)).collect();
            fs::write(backing.join(format!("{name}.src")), src).expect("source");
        }
    }
    let (mnt, m) = sync_and_mount(&s, &backing, mode, read_path);
    for (how, direct) in cases {
        run_case(&mnt, *how, *direct);
    }
    cut_and_remount(&disk, &mnt, m);
    let mut failures = Vec::new();
    for (how, direct) in cases {
        let got = survivors(&backing, *how, *direct);
        let what = format!(
            "{mode} {} {read_path} {}: {got} of {RECS} survived",
            if journal {
                "journalled"
            } else {
                "journal-less"
            },
            name_of(*how, *direct)
        );
        match promise(mode, read_path, *how) {
            Promise::Survives if got != RECS => failures.push(format!("{what}, all promised")),
            Promise::Lost if got != 0 => failures.push(format!(
                "{what}, none expected: the cut did not drop unsynced data"
            )),
            Promise::Nothing => eprintln!("{what} (nothing promised)"),
            _ => {}
        }
    }
    failures
}

fn matrix(mode: &str, journal: bool) {
    let mut failures = Vec::new();
    for read_path in ["pagecache", "engine-direct", "engine-cached"] {
        for group in groups(read_path) {
            failures.extend(cut(mode, journal, read_path, &group));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn power_cut_in_sync_mode_on_a_journalled_backing() {
    matrix("sync", true);
}

#[test]
fn power_cut_in_sync_mode_on_a_journal_less_backing() {
    matrix("sync", false);
}

#[test]
fn power_cut_in_fsync_mode_on_a_journalled_backing() {
    matrix("fsync", true);
}

#[test]
fn power_cut_in_fsync_mode_on_a_journal_less_backing() {
    matrix("fsync", false);
}

#[test]
fn power_cut_in_periodic_mode_on_a_journalled_backing() {
    matrix(PERIODIC, true);
}

#[test]
fn power_cut_in_periodic_mode_on_a_journal_less_backing() {
    matrix(PERIODIC, false);
}

/// The reproduction of the report: a database-style log (O_DIRECT|O_DSYNC, aligned 4 KiB
/// writes) on a mount in `fsync` mode; every write it acknowledged must survive the cut.
#[test]
fn o_direct_o_dsync_log_writes_survive_a_power_cut_in_fsync_mode() {
    let s = Scratch::new("cut-log");
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    File::create(backing.join("log")).expect("log");
    let (ok, out) = sh(&format!("sync -f {}", backing.display()));
    assert!(ok, "sync: {out}");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    const N: usize = 64;
    {
        let f = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(m.path("log"))
            .expect("open");
        let mut buf = Aligned::new(REC);
        for i in 0..N {
            buf.bytes().copy_from_slice(&record("log", i));
            f.write_all_at(buf.bytes(), (i * REC) as u64)
                .expect("write");
        }
    }
    cut_and_remount(&disk, &mnt, m);
    let got = records_intact(&backing.join("log"), "log", N);
    assert_eq!(got, N, "{got} of {N} acknowledged O_DSYNC writes survived");
}

/// Every create-like request in `sync` mode is acknowledged only once the new inode is on
/// the disk, not only its parent's entry: on a journal-less backing nothing else writes
/// the inode. The new inodes are kept out of the parent's inode-table block (64 files made
/// before the mount take the inode numbers after it), so that the parent's own write does
/// not carry them by chance.
#[test]
fn create_like_requests_are_durable_on_reply_in_sync_mode_on_a_journal_less_backing() {
    let lost = create_like_then_cut("sync");
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
}

/// The control of the test above: in `fsync` mode nothing syncs these changes, and the
/// cut must lose them, or it could not have shown a loss in `sync` mode either.
#[test]
fn create_like_requests_without_a_sync_are_lost_by_the_cut() {
    let lost = create_like_then_cut("fsync");
    assert!(
        lost.iter().any(|l| l.starts_with("symlink:")) && lost.len() >= 5,
        "the cut kept changes nobody synced: {lost:?}"
    );
}

/// Makes one entry of every kind, one request at a time, cuts the power and returns
/// those missing afterwards.
fn create_like_then_cut(mode: &str) -> Vec<String> {
    let s = Scratch::new(&format!("cut-create-{mode}"));
    let disk = LoopFs::journal_less(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(backing.join("fill")).expect("backing");
    for i in 0..64 {
        File::create(backing.join(format!("fill/{i}"))).expect("filler");
    }
    fs::write(backing.join("old"), b"old").expect("old");
    let (ok, out) = sh(&format!("sync -f {}", backing.display()));
    assert!(ok, "sync: {out}");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", mode]);
    let long_target = "t".repeat(200);
    let mk = |name: &str, mode: u32, dev: u64| {
        let p = std::ffi::CString::new(m.path(name).into_os_string().into_encoded_bytes())
            .expect("path");
        // SAFETY: mknod of a path the test owns.
        let r = unsafe { libc::mknod(p.as_ptr(), mode | 0o644, dev) };
        check_io(r as isize, name);
    };
    // One request at a time, each acknowledged before the next starts. Requests whose
    // sync covers the whole file system (a syncfs on this backing) come first, so they
    // cannot cover the ones after them.
    mk("regular", libc::S_IFREG, 0);
    fs::create_dir(m.path("dir")).expect("mkdir");
    File::create(m.path("created")).expect("create");
    fs::hard_link(m.path("old"), m.path("link")).expect("link");
    fs::rename(m.path("created"), m.path("renamed")).expect("rename");
    std::os::unix::fs::symlink("target", m.path("symlink")).expect("symlink");
    std::os::unix::fs::symlink(&long_target, m.path("long-symlink")).expect("long symlink");
    mk("fifo", libc::S_IFIFO, 0);
    mk("socket", libc::S_IFSOCK, 0);
    mk("chardev", libc::S_IFCHR, libc::makedev(1, 3));
    cut_and_remount(&disk, &mnt, m);
    use std::os::unix::fs::FileTypeExt;
    let kind = |name: &str| fs::symlink_metadata(backing.join(name)).map(|m| m.file_type());
    let mut lost = Vec::new();
    let mut want = |name: &str, ok: bool| {
        if !ok {
            lost.push(format!("{name}: {:?}", kind(name)));
        }
    };
    want(
        "symlink",
        fs::read_link(backing.join("symlink")).is_ok_and(|t| t == Path::new("target")),
    );
    want(
        "long-symlink",
        fs::read_link(backing.join("long-symlink")).is_ok_and(|t| t == Path::new(&long_target)),
    );
    want("fifo", kind("fifo").is_ok_and(|k| k.is_fifo()));
    want("socket", kind("socket").is_ok_and(|k| k.is_socket()));
    want("chardev", kind("chardev").is_ok_and(|k| k.is_char_device()));
    want("regular", kind("regular").is_ok_and(|k| k.is_file()));
    want("dir", kind("dir").is_ok_and(|k| k.is_dir()));
    want("renamed", kind("renamed").is_ok_and(|k| k.is_file()));
    want("created (renamed away)", kind("created").is_err());
    want(
        "link",
        fs::read(backing.join("link")).is_ok_and(|d| d == b"old")
            && fs::metadata(backing.join("old")).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.nlink() == 2
            }),
    );
    lost
}

/// What `fsync` mode promises for names (docs/crash-model.md): an fsync'd file survives
/// with its name, and with the names of the new directories above it; an fsync'd
/// directory keeps its entries (symlinks and FIFOs too); a renamed file fsync'd after the
/// rename is found under its new name only (the directory it left is synced too); a hard link fsync'd through the new name
/// keeps both names. The fsyncs sync only what names the file, not the backing file
/// system: on the journal-less backing a file created alongside and never synced is lost
/// (on a journalled one the journal commit of the fsync may carry it, which is allowed).
fn names_survive_a_power_cut(journal: bool, read_path: &str) -> Vec<String> {
    let s = Scratch::new(&format!(
        "cut-names-{}-{read_path}",
        if journal { "j" } else { "nj" }
    ));
    let disk = if journal {
        LoopFs::new(&s)
    } else {
        LoopFs::journal_less(&s)
    };
    let backing = disk.mnt.join("backing");
    for d in ["from", "moved", "links", "elsewhere"] {
        fs::create_dir_all(backing.join(d)).expect("dir");
    }
    fs::write(backing.join("orig"), b"orig").expect("orig");
    fs::write(backing.join("from/old"), b"old").expect("old");
    let (mnt, m) = sync_and_mount(&s, &backing, "fsync", read_path);
    let write_synced = |rel: &str| {
        let mut f = File::create(m.path(rel)).unwrap_or_else(|e| panic!("create {rel}: {e}"));
        std::io::Write::write_all(&mut f, rel.as_bytes()).expect("write");
        f.sync_all().unwrap_or_else(|e| panic!("fsync {rel}: {e}"));
    };
    let fsync_dir = |rel: &str| {
        File::open(m.path(rel))
            .and_then(|d| d.sync_all())
            .unwrap_or_else(|e| panic!("fsyncdir {rel}: {e}"));
    };
    // Symlinks and FIFOs cannot be opened for fsync: on a backing without a journal their
    // directory's sync is a syncfs (the fallback), so they come first.
    std::os::unix::fs::symlink("target", m.path("links/symlink")).expect("symlink");
    let fifo = std::ffi::CString::new(m.path("links/fifo").into_os_string().into_encoded_bytes())
        .expect("path");
    // SAFETY: mkfifo of a path the test owns.
    check_io(
        unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) } as isize,
        "mkfifo",
    );
    fsync_dir("links");
    // Never synced: made before the fsyncs below, which would cover it if they synced the
    // whole backing.
    fs::write(m.path("elsewhere/bystander"), b"bystander").expect("bystander");
    write_synced("new");
    fs::create_dir(m.path("dir")).expect("mkdir");
    write_synced("dir/inner");
    fsync_dir(".");
    fs::create_dir_all(m.path("nested/deeper")).expect("mkdir -p");
    write_synced("nested/deeper/file");
    // An old file moved between two old directories: ext4 itself writes the directory
    // that gets the new entry at the file's fsync (the inode is marked as newly named),
    // but not the one that loses the old entry.
    fs::rename(m.path("from/old"), m.path("moved/renamed")).expect("rename");
    File::open(m.path("moved/renamed"))
        .and_then(|f| f.sync_all())
        .expect("fsync after rename");
    fs::hard_link(m.path("orig"), m.path("hard")).expect("link");
    File::open(m.path("hard"))
        .and_then(|f| f.sync_all())
        .expect("fsync of the new link");
    cut_and_remount(&disk, &mnt, m);
    let mut lost = Vec::new();
    let content = |rel: &str| fs::read(backing.join(rel)).ok();
    for rel in ["new", "dir/inner", "nested/deeper/file"] {
        if content(rel).as_deref() != Some(rel.as_bytes()) {
            lost.push(format!("{rel}: {:?}", content(rel)));
        }
    }
    if content("moved/renamed").as_deref() != Some(b"old".as_slice()) {
        lost.push(format!("moved/renamed: {:?}", content("moved/renamed")));
    }
    if backing.join("from/old").exists() {
        lost.push("from/old: still there after its rename was fsync'd".into());
    }
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if fs::read_link(backing.join("links/symlink")).ok() != Some("target".into()) {
        lost.push("links/symlink".into());
    }
    if !fs::symlink_metadata(backing.join("links/fifo")).is_ok_and(|m| m.file_type().is_fifo()) {
        lost.push("links/fifo".into());
    }
    let nlink = fs::metadata(backing.join("hard")).map(|m| m.nlink()).ok();
    if content("hard").as_deref() != Some(b"orig".as_slice()) || nlink != Some(2) {
        lost.push(format!("hard: {:?}, {nlink:?} links", content("hard")));
    }
    let kind = if journal {
        "journalled"
    } else {
        "journal-less"
    };
    let bystander = backing.join("elsewhere/bystander").exists();
    eprintln!("{kind} {read_path}: the never-synced bystander survived: {bystander}");
    if !journal && bystander {
        lost.push("elsewhere/bystander survived: an fsync synced the whole backing".into());
    }
    lost.into_iter()
        .map(|l| format!("{kind} {read_path}: {l}"))
        .collect()
}

#[test]
fn fsynced_names_survive_a_power_cut_in_fsync_mode() {
    let mut failures = Vec::new();
    for journal in [true, false] {
        for read_path in ["pagecache", "engine-direct"] {
            failures.extend(names_survive_a_power_cut(journal, read_path));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `periodic:N` makes durable, with no sync call, what was written before a period that
/// began after it (docs/crash-model.md): plain buffered writes into a new file in a new
/// directory. The backing is journal-less, so nothing else writes them home within the
/// test's seconds; the control runs the same with a period that never ends and must lose
/// them, or the check could not have seen a loss.
#[test]
fn a_completed_period_makes_plain_writes_and_new_names_durable() {
    let mut failures = Vec::new();
    for read_path in ["pagecache", "engine-direct"] {
        let (records, named) = period_then_cut("periodic:1", read_path);
        if records != RECS || !named {
            failures.push(format!(
                "{read_path}: {records} of {RECS} records, the new name kept: {named}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let (records, named) = period_then_cut(PERIODIC, "pagecache");
    assert!(
        records == 0 && !named,
        "with no period completed the cut kept {records} records (the new name: {named}): \
         it did not drop unsynced data"
    );
}

/// Makes a directory and a file in it, writes RECS records with no sync, waits for two
/// completed periodic flushes (the second began after the writes; with a period that
/// never ends, for as long as two periods of a second would take), cuts the power.
/// Returns the records found intact and whether the file kept its name.
fn period_then_cut(mode: &str, read_path: &str) -> (usize, bool) {
    let s = Scratch::new(&format!("cut-period-{}-{read_path}", mode.replace(':', "")));
    let disk = LoopFs::journal_less(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    let (mnt, m) = sync_and_mount(&s, &backing, mode, read_path);
    fs::create_dir(m.path("new")).expect("mkdir");
    let f = File::create(m.path("new/plain")).expect("create");
    for i in 0..RECS {
        f.write_all_at(&record("plain", i), (i * REC) as u64)
            .expect("write");
    }
    drop(f);
    let flushes = |s: &serde_json::Value| s["counters"]["periodic_flushes"].as_u64();
    let before = flushes(&m.status_json()).expect("periodic_flushes in the status");
    if mode == PERIODIC {
        std::thread::sleep(std::time::Duration::from_secs(3));
        assert_eq!(flushes(&m.status_json()), Some(before), "a flush ran");
    } else {
        m.wait_for("two more periodic flushes", |s| {
            flushes(s).is_some_and(|n| n >= before + 2)
        });
    }
    cut_and_remount(&disk, &mnt, m);
    let records = records_intact(&backing.join("new/plain"), "plain", RECS);
    (records, backing.join("new/plain").exists())
}
