//! Boot integration: mount(8) with `-t fuse.dhrd` through the `mount.fuse.dhrd` helper,
//! an fstab line, plain umount(8) flushing, and the systemd unit passing
//! `systemd-analyze verify`.
//!
//! mount(8) looks for its helper at /sbin/mount.fuse.dhrd, so the test links it there to
//! the binary under test (and puts back whatever was there). The tests share that link and
//! run one at a time (a lock).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const HELPER: &str = "/sbin/mount.fuse.dhrd";
const EXIT_WAIT: Duration = Duration::from_secs(20);
static HELPER_LOCK: Mutex<()> = Mutex::new(());

/// The helper link for the duration of a test; the previous one comes back on drop.
struct HelperLink(Option<PathBuf>);

impl HelperLink {
    fn install() -> Self {
        let old = std::fs::read_link(HELPER).ok();
        let _ = std::fs::remove_file(HELPER);
        std::os::unix::fs::symlink(dhrd(), HELPER).expect("helper link");
        Self(old)
    }
}

impl Drop for HelperLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(HELPER);
        if let Some(old) = &self.0 {
            let _ = std::os::unix::fs::symlink(old, HELPER);
        }
    }
}

fn status_json(mnt: &Path) -> serde_json::Value {
    let o = Command::new(dhrd())
        .args(["status", "--json"])
        .arg(mnt)
        .output()
        .expect("status");
    assert!(o.status.success(), "status: {o:?}");
    serde_json::from_slice(&o.stdout).expect("status JSON")
}

/// Plain umount(8), then the daemon must be gone (its control socket answers no more)
/// and the file written through the mount must be in the backing.
fn umount_flushes(mnt: &Path, backing: &Path) {
    let (ok, out) = sh(&format!("umount {}", mnt.display()));
    assert!(ok, "umount: {out}");
    let t = Instant::now();
    loop {
        let o = Command::new(dhrd())
            .arg("status")
            .arg(mnt)
            .output()
            .expect("status");
        if !o.status.success() {
            break;
        }
        assert!(t.elapsed() < EXIT_WAIT, "the daemon outlived the unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read(backing.join("f")).ok().as_deref(),
        Some(&b"boot"[..])
    );
}

#[test]
fn mount_t_fuse_dhrd_with_options_and_umount_flushes() {
    let _g = HELPER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _link = HelperLink::install();
    let s = Scratch::new("boot-mount");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    let (ok, out) = sh(&format!(
        "mount -t fuse.dhrd {} {} -o rw,nofail,durability=fsync,mem=64M,x-systemd.device-timeout=5",
        backing.display(),
        mnt.display()
    ));
    assert!(ok, "mount -t fuse.dhrd: {out}");
    let doc = status_json(&mnt);
    assert_eq!(doc["durability"], "fsync");
    assert_eq!(doc["ram"]["budget_bytes"], 64u64 << 20);
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    umount_flushes(&mnt, &backing);
    // An unknown option is refused with a message, and nothing is mounted.
    let (ok, out) = sh(&format!(
        "mount -t fuse.dhrd {} {} -o speed=fast 2>&1",
        backing.display(),
        mnt.display()
    ));
    assert!(!ok && out.contains("unknown mount option"), "{out}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn fstab_line_mounts_with_defaults_file_and_options() {
    let _g = HELPER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _link = HelperLink::install();
    let s = Scratch::new("boot-fstab");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    let conf = s.0.join("dhrd.conf");
    std::fs::write(&conf, "# defaults\nDURABILITY=periodic:5\nmem=32M\n").expect("conf");
    let fstab = s.0.join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# a dhrd mount\n{} {} fuse.dhrd config={},mem=48M,nofail,x-systemd.requires-mounts-for={} 0 0\n",
            backing.display(),
            mnt.display(),
            conf.display(),
            backing.display()
        ),
    )
    .expect("fstab");
    let (ok, out) = sh(&format!(
        "mount --fstab {} {}",
        fstab.display(),
        mnt.display()
    ));
    assert!(ok, "mount --fstab: {out}");
    let doc = status_json(&mnt);
    // From the defaults file, and the fstab option overriding the file.
    assert_eq!(doc["durability"], "periodic:5");
    assert_eq!(doc["ram"]["budget_bytes"], 48u64 << 20);
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    umount_flushes(&mnt, &backing);
}

#[test]
fn systemd_unit_verifies() {
    let Ok(o) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    };
    assert!(o.status.success());
    let s = Scratch::new("boot-unit");
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/dhrd@.service"),
    )
    .expect("unit file");
    // Verify the unit as installed, with the binary under test where install.sh puts it.
    let unit = unit.replace("/usr/local/bin/dhrd", dhrd());
    let path = s.0.join("dhrd@test.service");
    std::fs::write(&path, unit).expect("unit copy");
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&o.stderr);
    // Only complaints about this unit count (the host's own units may have some).
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("dhrd@")).collect();
    assert!(
        o.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
}
