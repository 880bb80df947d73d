//! The page cache data path (the default): writes durable when they return, whoever makes
//! them and however (passthrough, the daemon for O_DIRECT opens, copy_file_range,
//! fallocate); shared mappings durable at msync; the RAM tier surviving a daemon restart;
//! fsync after a restart covering what the killed daemon's files left dirty; reads and
//! writes during the warm-up; the sync flag's life; and the fallback to the engine where
//! the backing file system cannot keep the flag.
//!
//! "On the device" is checked with cachestat(2) on the backing file: no page of it dirty
//! or under writeback once a write returned. The tests run one at a time (a lock): some
//! count the disk's reads, some drop the page cache.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use dhrd_pagecache::{self as pagecache, CacheStat, CacheStatSource};
use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static DISK_LOCK: Mutex<()> = Mutex::new(());

fn cache_of(path: &Path) -> (CacheStat, CacheStatSource) {
    let f = File::open(path).unwrap();
    pagecache::cachestat(f.as_fd(), 0, 0).unwrap()
}

/// Pages of the backing file not yet on the device. cachestat(2) (Linux 6.5) is required:
/// without it nothing here could tell written from durable.
fn unsynced(path: &Path) -> u64 {
    let (c, src) = cache_of(path);
    assert_eq!(
        src,
        CacheStatSource::Cachestat,
        "cachestat(2) is needed to see whether pages reached the device (Linux 6.5 or later)"
    );
    c.dirty_pages + c.writeback_pages
}

fn assert_on_device(path: &Path, what: &str) {
    let n = unsynced(path);
    assert_eq!(
        n,
        0,
        "{what}: {n} pages of {} not on the device",
        path.display()
    );
}

/// Bytes read so far from the block device that holds `path`'s file system (its
/// major:minor in /sys/dev/block; a partition has its own counters). Panics if there is no
/// such device: a count of zero would make every "few disk reads" check true.
fn device_read_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(path).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stat_path = format!("/sys/dev/block/{major}:{minor}/stat");
    let stat = fs::read_to_string(&stat_path).unwrap_or_else(|e| {
        panic!(
            "{} is on device {major}:{minor}, which has no {stat_path}: {e}",
            path.display()
        )
    });
    let sectors: u64 = stat
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no sectors-read field in {stat_path}: {stat:?}"));
    sectors * 512
}

/// An ext4 file system on a loop device of its own, mounted, for tests that count the
/// disk's reads: no other process reads that device, and its counters surely exist.
struct OwnDisk {
    mnt: std::path::PathBuf,
    dev: String,
}

impl OwnDisk {
    fn new(s: &Scratch, bytes: u64) -> Self {
        let img = s.0.join("own-disk.img");
        File::create(&img).unwrap().set_len(bytes).unwrap();
        let (ok, dev) = sh(&format!("losetup -f --show {}", img.display()));
        assert!(ok, "losetup: {dev}");
        let dev = dev.trim().to_string();
        let disk = Self {
            mnt: s.sub("own-disk"),
            dev,
        };
        let (ok, out) = sh(&format!("mkfs.ext4 -q -F {}", disk.dev));
        assert!(ok, "mkfs: {out}");
        let (ok, out) = sh(&format!("mount {} {}", disk.dev, disk.mnt.display()));
        assert!(ok, "mount: {out}");
        disk
    }
}

impl Drop for OwnDisk {
    fn drop(&mut self) {
        let t = Instant::now();
        // A killed daemon's FUSE connection may hold backing files for a moment.
        while is_mounted(&self.mnt) && t.elapsed() < Duration::from_secs(10) {
            let _ = sh(&format!("umount {}", self.mnt.display()));
            std::thread::sleep(Duration::from_millis(20));
        }
        if is_mounted(&self.mnt) {
            let _ = sh(&format!("umount -l {}", self.mnt.display()));
        }
        let _ = sh(&format!("losetup -d {}", self.dev));
    }
}

fn synced_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap();
    File::open(path).unwrap().sync_all().unwrap();
}

fn rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Every kind of write through the mount is on the device when it returns (sync mode).
#[test]
fn every_write_is_on_the_device_when_it_returns() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-durable");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    synced_file(&backing.join("f"), &vec![b'a'; 1 << 20]);
    synced_file(&backing.join("src"), &vec![b's'; 256 << 10]);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let bf = backing.join("f");

    let f = rw(&mnt.join("f"));
    f.write_all_at(&[1u8; 4096], 8192).unwrap();
    assert_on_device(&bf, "aligned write in place");
    f.write_all_at(b"unaligned", 12345).unwrap();
    assert_on_device(&bf, "unaligned write");
    f.write_all_at(&[2u8; 5000], (1 << 20) + 100).unwrap();
    assert_on_device(&bf, "extending write");
    let a = OpenOptions::new().append(true).open(mnt.join("f")).unwrap();
    (&a).write_all_ref(b"appended");
    assert_on_device(&bf, "O_APPEND write");
    // Through the daemon: an O_DIRECT open.
    let d = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("f"))
        .unwrap();
    d.write_all_at(b"direct", 3).unwrap();
    assert_on_device(&bf, "O_DIRECT write");
    // copy_file_range (done by the daemon) and fallocate.
    let src = File::open(mnt.join("src")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 4096i64);
    // SAFETY: two descriptors we hold and two offsets that outlive the call.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            f.as_raw_fd(),
            &mut off_out,
            64 << 10,
            0,
        )
    };
    assert_eq!(n, 64 << 10, "{}", std::io::Error::last_os_error());
    assert_on_device(&bf, "copy_file_range");
    // SAFETY: fallocate on our descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 4 << 20) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_on_device(&bf, "fallocate");
    // A new file: create, write, and its size.
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.join("g"))
        .unwrap();
    g.write_all_at(&[3u8; 10_000], 0).unwrap();
    assert_on_device(&backing.join("g"), "write to a new file");

    // Every write is there, through the mount and in the backing.
    let mut want = vec![b'a'; 1 << 20];
    want[8192..12288].fill(1);
    want[12345..12354].copy_from_slice(b"unaligned");
    want.resize((1 << 20) + 100, 0);
    want.extend_from_slice(&[2u8; 5000]);
    want.extend_from_slice(b"appended");
    want[3..9].copy_from_slice(b"direct");
    want[4096..4096 + (64 << 10)].fill(b's');
    want.resize(4 << 20, 0);
    assert!(
        fs::read(mnt.join("f")).unwrap() == want,
        "through the mount"
    );
    drop((f, a, d, g, src));
    m.kill9();
    assert!(
        fs::read(&bf).unwrap() == want,
        "in the backing after SIGKILL"
    );
}

trait WriteAllRef {
    fn write_all_ref(self, b: &[u8]);
}
impl WriteAllRef for &File {
    fn write_all_ref(mut self, b: &[u8]) {
        std::io::Write::write_all(&mut self, b).unwrap();
    }
}

/// A shared writable mapping: stores are seen by every reader at once (one page cache)
/// and are durable at msync or fsync, as POSIX promises, not before.
#[test]
fn shared_mappings_are_seen_at_once_and_durable_at_msync() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-mmap");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    synced_file(&backing.join("f"), &vec![0u8; 64 << 10]);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let f = rw(&mnt.join("f"));
    let len = 64 << 10;
    let map = SharedMap::new(&f, len);
    map.fill(5000, 0x5A, 100);
    // Another open (another process would see the same) reads the stores.
    let mut buf = [0u8; 100];
    File::open(mnt.join("f"))
        .unwrap()
        .read_exact_at(&mut buf, 5000)
        .unwrap();
    assert_eq!(buf, [0x5A; 100]);
    map.msync();
    assert_on_device(&backing.join("f"), "after msync");
    // fsync instead of msync: the same promise. The daemon's group commit makes metadata
    // durable with one journal commit per round, which writes no file's pages: an
    // application's fsync must still write the file.
    map.fill(20000, 0xA5, 100);
    assert!(
        unsynced(&backing.join("f")) > 0,
        "a store into a shared mapping left no dirty page"
    );
    f.sync_all().unwrap();
    assert_on_device(&backing.join("f"), "after fsync");
    drop(map);
    drop(f);
    m.kill9();
    let mut b = [0u8; 100];
    File::open(backing.join("f"))
        .unwrap()
        .read_exact_at(&mut b, 5000)
        .unwrap();
    assert_eq!(b, [0x5A; 100]);
    File::open(backing.join("f"))
        .unwrap()
        .read_exact_at(&mut b, 20000)
        .unwrap();
    assert_eq!(b, [0xA5; 100]);
}

/// SIGKILL of the daemon and a new mount: the page cache is the kernel's, so the data is
/// still in RAM; the new daemon's warm-up and a full read barely touch the disk.
#[test]
fn ram_survives_a_daemon_restart() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-restart");
    let own = OwnDisk::new(&s, 160 << 20);
    let backing = own.mnt.join("backing");
    fs::create_dir(&backing).unwrap();
    let mnt = s.sub("mnt");
    let data: Vec<u8> = (0..(64u32 << 20)).map(|i| (i % 249) as u8).collect();
    synced_file(&backing.join("f"), &data);
    // Out of the cache: the first mount's warm-up reads it from the disk, which the
    // disk's counters must show (else the check after the restart would prove nothing).
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let cold = device_read_bytes(&backing);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let (c, _) = cache_of(&backing.join("f"));
    assert_eq!(c.cached_bytes(), 64 << 20, "warmed: {c:?}");
    let warm_up = device_read_bytes(&backing) - cold;
    assert!(
        warm_up >= 64 << 20,
        "the cold warm-up read {warm_up} bytes from {}: not the disk of the backing",
        own.dev
    );
    m.kill9();

    let before = device_read_bytes(&backing);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    assert!(fs::read(mnt.join("f")).unwrap() == data);
    let read = device_read_bytes(&backing) - before;
    eprintln!("disk reads during the remount and a full read: {read} bytes");
    assert!(
        read < (64 << 20) / 20,
        "{read} bytes read from the disk: the RAM tier did not survive the restart"
    );
    drop(m);
    drop(own);
}

/// fsync mode: a file written through a daemon that was then killed has dirty pages in
/// the page cache; an fsync through the next daemon must make them durable, though that
/// daemon wrote nothing itself.
#[test]
fn fsync_after_a_restart_covers_what_the_killed_daemon_left() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-fsync-restart");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    synced_file(&backing.join("f"), &vec![0u8; 1 << 20]);
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    rw(&mnt.join("f"))
        .write_all_at(&vec![7u8; 512 << 10], 0)
        .unwrap();
    m.kill9();
    if unsynced(&backing.join("f")) == 0 {
        // Possible only if the kernel's writeback ran in the moment since the write
        // (dirty pages expire after 30 s by default): nothing is left to check.
        dhrd_testkit::skip("the kernel wrote the pages back before the test looked");
        return;
    }
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    let f = File::open(mnt.join("f")).unwrap();
    f.sync_all().unwrap();
    assert_on_device(&backing.join("f"), "fsync through the new daemon");
    drop(f);
    drop(m);
}

/// The daemon's reads of the backing are not an application's: files the walk warms at
/// mount and a file written through the mount and pinned after its close keep their
/// access times (O_NOATIME). Under `relatime` the first read after a write sets it, which
/// a mail reader takes for mail read and a cleaner by access time for a file in use. The
/// files are over 2 MiB, which in `fsync` mode the warm-up brings in through a mapping
/// (whose `mmap` sets the access time too); `sync` mode reads order-0 pages.
#[test]
fn warmed_and_pinned_files_keep_their_access_times() {
    for mode in ["sync", "fsync"] {
        let s = Scratch::new(&format!("pc-atime-{mode}"));
        let backing = s.sub("backing");
        let mnt = s.sub("mnt");
        assert!(
            reads_set_atime(&backing),
            "the control: relatime on the scratch disk"
        );
        synced_file(&backing.join("walked"), &vec![1u8; (3 << 20) + 100]);
        let f = File::open(backing.join("walked")).unwrap();
        // SAFETY: fadvise on a descriptor we hold; a hint only.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        drop(f);
        let walked = age_atime(&backing.join("walked"));
        let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", mode]);
        m.wait_loaded();
        fs::write(mnt.join("new"), vec![2u8; (3 << 20) + 100]).unwrap();
        let new = age_atime(&mnt.join("new"));
        m.wait_for("both files pinned", |st| st["ram"]["pinned_files"] == 2);
        assert_eq!(atime(&backing.join("walked")), walked, "{mode}: walked");
        assert_eq!(
            atime(&backing.join("new")),
            new,
            "{mode}: written, then pinned"
        );
        drop(m);
    }
}

/// O_DIRECT opens are served by the daemon from the page cache (a passthrough O_DIRECT
/// open would read the disk and drop cached pages): reads hit RAM, writes are durable on
/// return and seen by every other open, and a mapping of such an open shares the page
/// cache.
#[test]
fn o_direct_opens_are_served_from_ram_by_the_daemon() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-odirect");
    let own = OwnDisk::new(&s, 64 << 20);
    let backing = own.mnt.join("backing");
    fs::create_dir(&backing).unwrap();
    let mnt = s.sub("mnt");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 241) as u8).collect();
    synced_file(&backing.join("f"), &data);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let direct_before = direct_opens(&m);
    let d = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("f"))
        .unwrap();
    let disk_before = device_read_bytes(&backing);
    let mut got = vec![0u8; data.len()];
    d.read_exact_at(&mut got, 0).unwrap();
    assert!(got == data);
    let disk = device_read_bytes(&backing) - disk_before;
    assert!(
        disk < (1 << 20),
        "{disk} bytes read from the disk for an O_DIRECT read"
    );
    let st = m.status();
    assert!(m.status_count("reads (daemon):") > 0, "{st}");
    assert_eq!(direct_opens(&m), direct_before + 1, "{st}");
    d.write_all_at(b"odirect", 1000).unwrap();
    assert_on_device(&backing.join("f"), "O_DIRECT write");
    let mut b = [0u8; 7];
    File::open(mnt.join("f"))
        .unwrap()
        .read_exact_at(&mut b, 1000)
        .unwrap();
    assert_eq!(&b, b"odirect");
    // SAFETY: a read-only shared mapping of the O_DIRECT open; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            d.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: in bounds of the live mapping.
    let mapped = unsafe { std::slice::from_raw_parts((p as *const u8).add(1000), 7) }.to_vec();
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(p, 4096) };
    assert_eq!(&mapped, b"odirect");
    drop(d);
    drop(m);
    drop(own);
}

/// The count of opens served on the direct path ("opens: passthrough N, direct M, ...").
fn direct_opens(m: &Mount) -> u64 {
    let st = m.status();
    st.lines()
        .filter_map(|l| l.strip_prefix("opens:"))
        .find_map(|l| l.split("direct ").nth(1))
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no direct opens count in status:\n{st}"))
}

/// While the warm-up runs (slowed down), reads and writes go on: every read returns the
/// last bytes written, none is lost, and the warm-up never brings back older bytes (the
/// rule Linux md broke in 2024 holds by construction: the page cache is the only copy).
#[test]
fn reads_and_writes_during_the_warmup_see_the_last_write() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-warmup");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    const LEN: usize = 32 << 20;
    let mut model: Vec<u8> = (0..LEN).map(|i| (i % 233) as u8).collect();
    synced_file(&backing.join("f"), &model);
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let m = Mount::start(&backing, &mnt, &["--quiet", "--load-rate", "8M"]);
    let f = rw(&mnt.join("f"));
    let mut rng = Rng(7);
    let t = Instant::now();
    let mut ops = 0;
    while t.elapsed() < Duration::from_secs(2) {
        let off = rng.below(LEN as u64 - 8192) as usize;
        let len = 1 + rng.below(8000) as usize;
        if rng.below(2) == 0 {
            let b = vec![(ops % 250) as u8 + 1; len];
            f.write_all_at(&b, off as u64).unwrap();
            model[off..off + len].copy_from_slice(&b);
        } else {
            let mut b = vec![0u8; len];
            f.read_exact_at(&mut b, off as u64).unwrap();
            assert!(
                b == model[off..off + len],
                "read at {off} during the warm-up"
            );
        }
        ops += 1;
    }
    assert!(
        !m.status().contains("complete after"),
        "the warm-up ended before the test: slow it down further"
    );
    m.wait_loaded();
    assert!(
        fs::read(mnt.join("f")).unwrap() == model,
        "after the warm-up"
    );
    drop(f);
    m.kill9();
    assert!(
        fs::read(backing.join("f")).unwrap() == model,
        "in the backing"
    );
    eprintln!("{ops} reads and writes during the warm-up");
}

/// `sync` mode sets the inode's sync flag (and marks it as dhrd's); `fsync` mode clears a
/// flag dhrd set, never one an administrator set.
#[test]
fn the_sync_flag_follows_the_durability_mode() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-flag");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let d = File::open(&backing).unwrap();
    if let Err(e) = pagecache::probe_sync_flag(d.as_fd()) {
        panic!(
            "the scratch file system ({}) refuses FS_SYNC_FL ({e}); the page cache path needs \
             it: set DHRD_TEST_DIR to a directory on ext4, xfs or btrfs",
            backing.display()
        );
    }
    fs::write(backing.join("ours"), b"o").unwrap();
    fs::write(backing.join("admins"), b"a").unwrap();
    pagecache::set_sync_flag(rw(&backing.join("admins")).as_fd(), true).unwrap();
    let flag =
        |n: &str| pagecache::sync_flag(File::open(backing.join(n)).unwrap().as_fd()).unwrap();
    assert!(!flag("ours"));
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    fs::read(mnt.join("ours")).unwrap();
    fs::read(mnt.join("admins")).unwrap();
    assert!(flag("ours") && flag("admins"));
    // The mark is the daemon's own: on the backing file, not visible through the mount.
    let mark = dhrd_fuse::page::SYNC_MARK_XATTR;
    let on_backing = dhrd_io::xattr::get(&File::open(backing.join("ours")).unwrap(), mark);
    assert!(
        matches!(on_backing, Ok(Some(_))),
        "no {mark} on the backing: {on_backing:?}"
    );
    let names = xattr_names(&mnt.join("ours"));
    assert!(
        !names.iter().any(|n| n.contains("dhrd")),
        "listed through the mount: {names:?}"
    );
    let through = dhrd_io::xattr::get(&File::open(mnt.join("ours")).unwrap(), mark);
    assert!(
        matches!(through, Ok(None)),
        "{mark} read through the mount: {through:?}"
    );
    drop(m);
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    fs::read(mnt.join("ours")).unwrap();
    fs::read(mnt.join("admins")).unwrap();
    assert!(!flag("ours"), "dhrd's flag stays in fsync mode");
    assert!(flag("admins"), "an administrator's flag was cleared");
    drop(m);
}

/// A backing file system that does not keep the sync flag (tmpfs): in `sync` mode the
/// mount runs on the engine and says why; `--read-path pagecache` refuses to mount; in
/// `fsync` mode, which needs no flag, the page cache path runs.
#[test]
fn a_backing_without_the_sync_flag_falls_back_to_the_engine() {
    let _g = DISK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("pc-tmpfs");
    let tmp = s.sub("tmpfs");
    let (ok, out) = sh(&format!(
        "mount -t tmpfs -o size=64M tmpfs {}",
        tmp.display()
    ));
    assert!(ok, "{out}");
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = sh(&format!("umount -l {}", self.0.display()));
        }
    }
    let _u = Umount(tmp.clone());
    let backing = tmp.join("backing");
    fs::create_dir(&backing).unwrap();
    fs::write(backing.join("f"), b"on tmpfs").unwrap();
    let mnt = s.sub("mnt");

    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let st = m.status();
    assert!(st.contains("data path:       engine"), "{st}");
    assert!(st.contains("fallback:") && st.contains("sync flag"), "{st}");
    assert!(m.log_text().contains("sync flag"), "{}", m.log_text());
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"on tmpfs");
    fs::write(mnt.join("g"), b"written").unwrap();
    assert_eq!(fs::read(backing.join("g")).unwrap(), b"written");
    drop(m);

    let r = Mount::try_start(&backing, &mnt, &["--quiet", "--read-path", "pagecache"]);
    match r {
        Ok(m) => {
            // The kernel mounts before INIT is answered; the daemon then fails and exits.
            let t = Instant::now();
            while is_mounted(&mnt) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(m.log_text().contains("pagecache"), "{}", m.log_text());
            drop(m);
        }
        Err(e) => assert!(e.contains("pagecache"), "{e}"),
    }

    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    assert!(
        m.status().contains("data path:       page cache"),
        "{}",
        m.status()
    );
    drop(m);
}

/// The names of `path`'s extended attributes (listxattr(2)); panics if it fails.
fn xattr_names(path: &Path) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: a NUL-terminated path and a buffer of the length passed, both live.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    buf.truncate(n as usize);
    buf.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}
