//! An ext4 file system whose device fails reads while the test says so: nbdkit's `error`
//! filter over an image file, exposed as a file by nbdfuse, under a loop device. With no
//! device-mapper here, this is how a read error reaches the page cache of a file (the
//! kernel's own read of it, which a daemon's warm-up makes) the way a failing disk's
//! would. Writes always succeed, so the file system itself stays healthy.

use super::{sh, Scratch};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ReadFaultFs {
    pub mnt: PathBuf,
    /// While this file exists, every read of the device fails with EIO.
    trigger: PathBuf,
    fuse: PathBuf,
    loop_dev: String,
    nbdfuse: Child,
}

impl ReadFaultFs {
    pub fn new(s: &Scratch) -> Self {
        let img = s.0.join("faulty.img");
        let f = std::fs::File::create(&img).expect("image");
        f.set_len(64 << 20).expect("size");
        drop(f);
        let (ok, out) = sh(&format!("mkfs.ext4 -q -F {}", img.display()));
        assert!(ok, "mkfs: {out}");
        let fuse = s.sub("nbdfuse");
        let trigger = s.0.join("fail-reads");
        let pid_file = s.0.join("nbdfuse.pid");
        let nbdfuse = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pid_file)
            .arg(fuse.join("disk"))
            .args([
                "--command",
                "nbdkit",
                "-s",
                "--exit-with-parent",
                "--filter=error",
            ])
            .arg("file")
            .arg(&img)
            .args(["error-pread=EIO", "error-pread-rate=1"])
            .arg(format!("error-pread-file={}", trigger.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nbdfuse (apt install nbdfuse nbdkit)");
        // From here on the guard exists, so a failed step below still unmounts and stops
        // what was set up; each field is filled in once its step worked.
        let mut me = ReadFaultFs {
            mnt: PathBuf::new(),
            trigger,
            fuse,
            loop_dev: String::new(),
            nbdfuse,
        };
        let t = Instant::now();
        while std::fs::metadata(&pid_file).map_or(true, |m| m.len() == 0) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "nbdfuse did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (ok, loop_dev) = sh(&format!(
            "losetup --find --show {}",
            me.fuse.join("disk").display()
        ));
        assert!(ok, "losetup: {loop_dev}");
        me.loop_dev = loop_dev.trim().to_string();
        let mnt = s.sub("faulty");
        let (ok, out) = sh(&format!("mount {} {}", me.loop_dev, mnt.display()));
        assert!(ok, "mount: {out}");
        me.mnt = mnt;
        me
    }

    /// From now on every read of the device fails with EIO (`on`), or none does.
    pub fn fail_reads(&self, on: bool) {
        if on {
            std::fs::write(&self.trigger, b"").expect("trigger");
        } else {
            std::fs::remove_file(&self.trigger).expect("trigger");
        }
    }

    /// Writes `files` to the device and drops their cached pages, and those of the
    /// device's file under the loop device, so that their next reads reach the device.
    /// The file system's metadata stays cached: opening and sizing them reads nothing.
    pub fn uncache(&self, files: &[&Path]) {
        let (ok, out) = sh(&format!("sync -f {}", self.mnt.display()));
        assert!(ok, "{out}");
        let under = self.fuse.join("disk");
        for p in files.iter().copied().chain([under.as_path()]) {
            let f = std::fs::File::open(p).expect("open");
            f.sync_all().expect("sync");
            // SAFETY: fadvise on a descriptor we hold; a hint only.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0, "fadvise {}", p.display());
        }
    }
}

impl Drop for ReadFaultFs {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.trigger);
        if !self.mnt.as_os_str().is_empty() {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if !self.loop_dev.is_empty() {
            let _ = Command::new("losetup")
                .args(["-d", &self.loop_dev])
                .status();
        }
        let unmounted = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.fuse)
            .status()
            .is_ok_and(|st| st.success());
        if !unmounted {
            // Never mounted (it failed to start): nothing else would make it exit.
            let _ = self.nbdfuse.kill();
        }
        let _ = self.nbdfuse.wait();
    }
}
