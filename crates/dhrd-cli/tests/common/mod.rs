//! Shared helpers of the FUSE integration tests: scratch directories and a mount guard that
//! always cleans up (unmount on Drop, even when the test panics).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod freeze;
pub mod pjdfstest;
pub mod read_fault;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a mount may take to appear.
pub const MOUNT_WAIT: Duration = Duration::from_secs(20);

pub fn dhrd() -> &'static str {
    env!("CARGO_BIN_EXE_dhrd")
}

/// A scratch directory removed on drop (after any mount inside it is gone).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var("DHRD_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into());
        let p = PathBuf::from(base).join(format!(
            "dhrd-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Self(p)
    }
    pub fn sub(&self, name: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(&p).expect("sub dir");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn is_mounted(mnt: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_string_lossy().to_string();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Forcefully removes a (possibly dead) FUSE mount.
pub fn force_unmount(mnt: &Path) {
    for _ in 0..50 {
        if !is_mounted(mnt) {
            return;
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(mnt)
            .stderr(Stdio::null())
            .status();
        if is_mounted(mnt) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(mnt)
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `dhrd mount`; unmounts (or kills and cleans up) on drop.
pub struct Mount {
    pub child: Option<Child>,
    pub mnt: PathBuf,
    pub backing: PathBuf,
    pub log: PathBuf,
}

impl Mount {
    pub fn start(backing: &Path, mnt: &Path, extra: &[&str]) -> Self {
        Self::try_start(backing, mnt, extra).expect("mount")
    }

    pub fn try_start(backing: &Path, mnt: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::try_start_env(backing, mnt, extra, &[])
    }

    /// Like `start`, with extra environment for the daemon (fault injection).
    #[allow(dead_code)] // not every test binary injects faults
    pub fn start_env(backing: &Path, mnt: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::try_start_env(backing, mnt, extra, env).expect("mount")
    }

    pub fn try_start_env(
        backing: &Path,
        mnt: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let log = mnt.with_extension("log");
        let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(dhrd())
            .envs(env.iter().copied())
            .arg("mount")
            .arg(backing)
            .arg(mnt)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut m = Mount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            backing: backing.to_path_buf(),
            log,
        };
        let t = Instant::now();
        while t.elapsed() < MOUNT_WAIT {
            if is_mounted(mnt) && std::fs::metadata(mnt).is_ok() {
                return Ok(m);
            }
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    m.child = None;
                    return Err(format!("dhrd mount exited {st}: {}", m.log_text()));
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(format!("mount did not appear: {}", m.log_text()))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The first number on the status line that starts with `prefix` (e.g. "copies:").
    #[allow(dead_code)] // not every test binary reads counters
    pub fn status_count(&self, prefix: &str) -> u64 {
        let st = self.status();
        st.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|r| {
                r.split(|c: char| !c.is_ascii_digit())
                    .find(|w| !w.is_empty())
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} count in status:\n{st}"))
    }

    pub fn status(&self) -> String {
        let o = Command::new(dhrd())
            .arg("status")
            .arg(&self.mnt)
            .output()
            .expect("status");
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    /// `dhrd status --json`.
    #[allow(dead_code)] // not every test binary reads it
    pub fn status_json(&self) -> serde_json::Value {
        let o = Command::new(dhrd())
            .args(["status", "--json"])
            .arg(&self.mnt)
            .output()
            .expect("status");
        serde_json::from_slice(&o.stdout).expect("status JSON")
    }

    /// Waits up to 60 s until `f` holds of `dhrd status --json` (`what` names it in the
    /// failure); returns that status.
    #[allow(dead_code)] // not every test binary waits on it
    pub fn wait_for(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for_status(what, Duration::from_secs(60), || self.status_json(), f)
    }

    /// Waits until `dhrd status` reports the load complete.
    pub fn wait_loaded(&self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            let s = self.status();
            if s.contains("complete") && s.contains("tree walk:       done") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("load did not complete: {}", self.status());
    }

    /// `dhrd umount`, then waits for the daemon; returns its exit status.
    pub fn umount(mut self) -> std::process::ExitStatus {
        let st = Command::new(dhrd())
            .arg("umount")
            .arg(&self.mnt)
            .status()
            .expect("umount");
        assert!(st.success(), "dhrd umount failed; log: {}", self.log_text());
        let mut c = self.child.take().expect("child");
        c.wait().expect("wait")
    }

    /// SIGKILL the daemon but leave the dead mount in place (requests on it fail with
    /// ENOTCONN); returns the mountpoint to clean up with `force_unmount`.
    pub fn kill9_keep_mount(mut self) -> PathBuf {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mnt = self.mnt.clone();
        // Drop would unmount: skip it, the caller cleans up.
        self.mnt = PathBuf::new();
        mnt
    }

    /// SIGKILL the daemon and clean up the dead mount.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        force_unmount(&self.mnt);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn take_child(&mut self) -> Option<Child> {
        self.child.take()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new(dhrd())
                .arg("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if !self.mnt.as_os_str().is_empty() {
            force_unmount(&self.mnt);
        }
    }
}

/// Runs a shell command, returning (success, stdout+stderr).
pub fn sh(cmd: &str) -> (bool, String) {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    let mut s = String::from_utf8_lossy(&o.stdout).to_string();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    (o.status.success(), s)
}

/// Tiny deterministic RNG for the tests.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `_IOR('X', 125, __u32)`: ext4's (and xfs's) "the file system is going down" ioctl.
pub const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587D;
/// Shut down without flushing the journal: the disk is gone.
pub const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// An ext4 file system on a loop device over a file in a scratch directory, mounted; it
/// can be shut down like a dead disk (`shut_down`), losing what its journal had not
/// committed, and mounted again from the same image (`remount`).
pub struct LoopFs {
    pub mnt: std::path::PathBuf,
    pub img: std::path::PathBuf,
}

impl LoopFs {
    pub fn new(s: &Scratch) -> Self {
        Self::with_mkfs(s, "")
    }

    /// Without a journal (`mkfs.ext4 -O ^has_journal`), as on some cloud images: nothing
    /// reaches the disk until it is written back or synced.
    pub fn journal_less(s: &Scratch) -> Self {
        Self::with_mkfs(s, "-O ^has_journal")
    }

    /// `mkfs_opts`: extra options of mkfs.ext4.
    pub fn with_mkfs(s: &Scratch, mkfs_opts: &str) -> Self {
        Self::with_image(s, &s.0.join("disk.img"), mkfs_opts)
    }

    /// Like `with_mkfs`, with the image at `img`, which is made and fully allocated.
    pub fn with_image(s: &Scratch, img: &Path, mkfs_opts: &str) -> Self {
        let img = img.to_path_buf();
        let mnt = s.sub("ext4");
        let f = std::fs::File::create(&img).expect("image");
        f.set_len(64 << 20).expect("size");
        // SAFETY: fallocate of a descriptor we hold.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 64 << 20) };
        assert_eq!(
            r,
            0,
            "allocating the image: {}",
            std::io::Error::last_os_error()
        );
        drop(f);
        let (ok, out) = sh(&format!("mkfs.ext4 -q -F {mkfs_opts} {}", img.display()));
        assert!(ok, "mkfs: {out}");
        let (ok, out) = sh(&format!(
            "mount -o loop {} {}",
            img.display(),
            mnt.display()
        ));
        assert!(ok, "mount: {out}");
        Self { mnt, img }
    }

    pub fn shut_down(&self) {
        let d = std::fs::File::open(&self.mnt).expect("open fs root");
        let mut flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
        // SAFETY: the ioctl reads one u32 from the pointer, which outlives the call.
        let r = unsafe { libc::ioctl(d.as_raw_fd(), EXT4_IOC_SHUTDOWN as _, &mut flags) };
        assert_eq!(r, 0, "shutdown: {}", std::io::Error::last_os_error());
    }

    /// A power cut: shuts the file system down (it issues no I/O of its own after this)
    /// and copies the image as the device holds it now, which `remount` then mounts.
    /// Unlike the shutdown alone, this also loses what a journal-less ext4 keeps in dirty
    /// metadata buffers: the unmount after a shutdown still writes those home.
    pub fn cut(&self) {
        self.shut_down();
        let (ok, out) = sh(&format!(
            "cp --sparse=always {} {}",
            self.img.display(),
            self.cut_img().display()
        ));
        assert!(ok, "copy of the image at the cut: {out}");
    }

    fn cut_img(&self) -> std::path::PathBuf {
        self.img.with_extension("cut")
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if !self.unmount() {
            // Still busy: detached from the tree now, freed with its last user.
            let _ = Command::new("umount")
                .args(["-l", "-d"])
                .arg(&self.mnt)
                .status();
        }
    }
}

/// A disk whose writes to chosen blocks fail while the rest works, as with bad sectors: an
/// ext4 on a loop device over an image in a small tmpfs. The image is
/// fully allocated; `fail_writes_to` punches holes in it under a file's blocks and fills
/// the tmpfs, so the loop device's writes there fail (ENOSPC from the tmpfs, which the
/// file system's writeback reports as that file's write error) and every other write
/// lands. No device-mapper needed.
pub struct FaultyDisk {
    /// Dropped before the tmpfs goes.
    pub fs: Option<LoopFs>,
    tmpfs: PathBuf,
}

impl FaultyDisk {
    /// `journal`: the ext4 has its journal (else `-O ^has_journal`).
    pub fn new(s: &Scratch, journal: bool) -> Self {
        let tmpfs = s.sub("tmpfs");
        let (ok, out) = sh(&format!(
            "mount -t tmpfs -o size=72m dhrd-test {}",
            tmpfs.display()
        ));
        assert!(ok, "tmpfs: {out}");
        let opts = if journal { "" } else { "-O ^has_journal" };
        let fs = LoopFs::with_image(s, &tmpfs.join("disk.img"), opts);
        Self {
            fs: Some(fs),
            tmpfs,
        }
    }

    pub fn mnt(&self) -> &Path {
        &self.fs.as_ref().expect("mounted").mnt
    }

    /// From now on, writes to the blocks `file` (on this disk, already allocated) has now
    /// fail.
    pub fn fail_writes_to(&self, file: &Path) {
        let (ok, out) = sh(&format!("filefrag -e -b4096 {}", file.display()));
        assert!(ok, "filefrag: {out}");
        let img = self.tmpfs.join("disk.img");
        let mut punched = 0;
        for line in out.lines() {
            // "   0:        0..      15:       2016..      2031:     16:   last,eof"
            let cols: Vec<&str> = line.split(':').map(str::trim).collect();
            if cols.len() < 4 || cols[0].parse::<u64>().is_err() {
                continue;
            }
            let (a, b) = cols[2].split_once("..").expect("physical range");
            let (a, b): (u64, u64) = (
                a.trim().parse().expect("start"),
                b.trim().parse().expect("end"),
            );
            let (ok, out) = sh(&format!(
                "fallocate --punch-hole --offset {} --length {} {}",
                a * 4096,
                (b - a + 1) * 4096,
                img.display()
            ));
            assert!(ok, "punch: {out}");
            punched += 1;
        }
        assert!(punched > 0, "no extents of {}: {out}", file.display());
        // Every page of the tmpfs taken: nothing can fill the holes.
        let _ = sh(&format!(
            "dd if=/dev/zero of={} bs=64k status=none",
            self.tmpfs.join("fill").display()
        ));
        let (_, df) = sh(&format!("df -B1 --output=avail {}", self.tmpfs.display()));
        assert!(
            df.lines().nth(1).is_some_and(|l| l.trim() == "0"),
            "the tmpfs kept room: {df}"
        );
    }
}

impl Drop for FaultyDisk {
    fn drop(&mut self) {
        drop(self.fs.take());
        let _ = Command::new("umount").arg(&self.tmpfs).status();
    }
}

/// How long an unmount of the loop file system is retried while it is busy.
const LOOP_UMOUNT_WAIT: Duration = Duration::from_secs(10);

impl LoopFs {
    /// Unmounts and detaches the loop device; retries while the file system is busy (a
    /// killed daemon's FUSE connection may still hold backing files for a moment).
    /// Returns whether it is unmounted.
    fn unmount(&self) -> bool {
        let t = Instant::now();
        loop {
            // umount -d also detaches the loop device.
            let (ok, _) = sh(&format!("umount -d {}", self.mnt.display()));
            if ok {
                return true;
            }
            if t.elapsed() > LOOP_UMOUNT_WAIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unmounts (the image keeps what reached it) and mounts the image again (the copy
    /// made at the `cut`, if there was one), as after a reboot: the journal is replayed. Never on top of the old mount: a second mount
    /// stacked there would leave the first (and its loop device) behind for good.
    pub fn remount(&self) {
        assert!(
            self.unmount(),
            "{} stayed busy for {LOOP_UMOUNT_WAIT:?}",
            self.mnt.display()
        );
        // After a `cut`, the device as it was at the cut.
        let img = if self.cut_img().exists() {
            self.cut_img()
        } else {
            self.img.clone()
        };
        let (ok, out) = sh(&format!(
            "mount -o loop {} {}",
            img.display(),
            self.mnt.display()
        ));
        assert!(ok, "remount: {out}");
    }
}

/// A shared read-write mapping of the first `len` bytes of an open file, unmapped when
/// dropped: stores into it are the application stores the mount must make durable at
/// msync or fsync.
pub struct SharedMap {
    addr: *mut libc::c_void,
    len: usize,
}

impl SharedMap {
    pub fn new(f: &std::fs::File, len: usize) -> Self {
        // SAFETY: a new shared mapping of a descriptor the caller holds; owned by the
        // returned value and unmapped exactly once in Drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            addr,
            libc::MAP_FAILED,
            "{}",
            std::io::Error::last_os_error()
        );
        Self { addr, len }
    }

    /// Stores `n` bytes of `v` at `off`.
    pub fn fill(&self, off: usize, v: u8, n: usize) {
        assert!(off + n <= self.len, "store past the mapping");
        // SAFETY: in bounds of the live mapping (checked above).
        unsafe { std::ptr::write_bytes((self.addr as *mut u8).add(off), v, n) };
    }

    /// msync(MS_SYNC) of the whole mapping.
    pub fn msync(&self) {
        // SAFETY: the live mapping, whole.
        let r = unsafe { libc::msync(self.addr, self.len, libc::MS_SYNC) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this value made and owns.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// The simulation, crash and power-cut tests lean on the invariants the code checks with
/// `debug_assert!` on its hot paths, so they run only in a profile that keeps them (the
/// workspace's dev and test profiles say so in Cargo.toml; `--release` does not).
#[test]
#[allow(clippy::assertions_on_constants)] // the constant is the profile's: what is checked
fn debug_assertions_are_on() {
    assert!(
        cfg!(debug_assertions),
        "these tests need debug assertions: run them without --release"
    );
}

/// `p` as a C string for the libc calls the tests make.
pub fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path")
}

/// "ok", or the errno of a failed call: what a transcript compares between two trees.
pub fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

/// The names in directory `p`, sorted, comma-separated ("" when it cannot be read).
pub fn listing(p: &Path) -> String {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| format!("{:?}", e.file_name()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(",")
}

/// Puts `p`'s access time an hour before its modification time, where `relatime` makes
/// the next read set it; returns that time.
pub fn age_atime(p: &Path) -> std::time::SystemTime {
    let f = std::fs::File::open(p).expect("open");
    let mtime = f.metadata().expect("meta").modified().expect("mtime");
    let old = mtime - std::time::Duration::from_secs(3600);
    f.set_times(std::fs::FileTimes::new().set_accessed(old))
        .expect("set atime");
    old
}

/// `p`'s access time.
pub fn atime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p)
        .expect("meta")
        .accessed()
        .expect("atime")
}

/// Whether a plain read of a file in `dir` sets its access time after `age_atime` (the
/// file system is mounted `relatime` or `strictatime`): the control of the tests that
/// show dhrd's own reads do not.
pub fn reads_set_atime(dir: &Path) -> bool {
    let p = dir.join(".atime-control");
    std::fs::write(&p, b"control").expect("write");
    let aged = age_atime(&p);
    std::fs::read(&p).expect("read");
    let set = atime(&p) != aged;
    std::fs::remove_file(&p).expect("remove");
    set
}

/// Polls `status` every 50 ms until `f` holds of it, for at most `limit` (`what` names the
/// wait in the failure); returns that status. Both daemons' guards wait this way.
pub fn wait_for_status(
    what: &str,
    limit: Duration,
    status: impl Fn() -> serde_json::Value,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let st = status();
        if f(&st) {
            return st;
        }
        assert!(t.elapsed() < limit, "{what}: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
