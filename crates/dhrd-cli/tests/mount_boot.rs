//! Boot integration: mount(8) with `-t fuse.dhrd` through the `mount.fuse.dhrd` helper and
//! through fuse3's `mount.fuse`, fstab lines (with `mount -a` run twice), the defaults
//! file, unmounting that flushes (plain umount(8), the `umount.fuse.dhrd` helper,
//! `dhrd umount` on busy and dead mounts), readiness for a `Type=notify` unit, and the
//! systemd side: `systemd-analyze verify` of the template unit and of the mount unit
//! systemd's fstab generator makes from a dhrd line, and the ordering systemd derives from
//! both (`systemd --test`, which loads units and computes the boot transaction offline).
//!
//! mount(8) and umount(8) look for their helpers in /sbin, and mount(8) runs fuse3's
//! helper with the default PATH, so the tests link the binary under test there (and put
//! back whatever was there). The tests that touch those links run one at a time (a lock).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MOUNT_HELPER: &str = "/sbin/mount.fuse.dhrd";
const UMOUNT_HELPER: &str = "/sbin/umount.fuse.dhrd";
/// Where fuse3's mount.fuse finds `dhrd`: the first directory of the default PATH that
/// mount(8) leaves its helpers (it drops the caller's PATH).
const FUSE3_PATH_LINK: &str = "/usr/local/sbin/dhrd";
/// How long a daemon may take to exit after a plain unmount (its flush runs then).
const EXIT_WAIT: Duration = Duration::from_secs(20);
/// How long a foreground mount may take to say READY=1.
const READY_WAIT: Duration = Duration::from_secs(20);
static LINK_LOCK: Mutex<()> = Mutex::new(());

/// A link to the binary under test at `at` for the duration of a test (or no file there,
/// with `None`); whatever was there before comes back on drop.
struct Link {
    at: &'static str,
    old: Option<PathBuf>,
}

impl Link {
    fn set(at: &'static str, to: Option<&str>) -> Self {
        let old = std::fs::read_link(at).ok();
        let _ = std::fs::remove_file(at);
        if let Some(to) = to {
            std::os::unix::fs::symlink(to, at).expect("helper link");
        }
        Self { at, old }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.at);
        if let Some(old) = &self.old {
            let _ = std::os::unix::fs::symlink(old, self.at);
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LINK_LOCK.lock().unwrap_or_else(|e| e.into_inner())
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

/// Whether a daemon still answers for `mnt`.
fn daemon_answers(mnt: &Path) -> bool {
    Command::new(dhrd())
        .arg("status")
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("status")
        .success()
}

/// The file system type of the mount at `mnt`, from /proc/self/mountinfo.
fn fstype(mnt: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.to_string_lossy();
    info.lines().find_map(|l| {
        let (head, tail) = l.split_once(" - ")?;
        (head.split(' ').nth(4) == Some(want.as_ref()))
            .then(|| tail.split(' ').next().unwrap_or("").to_string())
    })
}

/// Waits until no daemon answers for `mnt` (it exits once its flush is done).
fn wait_daemon_gone(mnt: &Path) {
    let t = Instant::now();
    while daemon_answers(mnt) {
        assert!(t.elapsed() < EXIT_WAIT, "the daemon outlived the unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Plain umount(8); the daemon then flushes and exits, and the file written through the
/// mount (fsync mode, never fsynced) must be in the backing.
fn umount_flushes(mnt: &Path, backing: &Path) {
    let (ok, out) = sh(&format!("umount {}", mnt.display()));
    assert!(ok, "umount: {out}");
    assert!(!is_mounted(mnt));
    wait_daemon_gone(mnt);
    assert_eq!(
        std::fs::read(backing.join("f")).ok().as_deref(),
        Some(&b"boot"[..])
    );
}

#[test]
fn mount_t_fuse_dhrd_with_options_and_umount_flushes() {
    let _g = lock();
    let _m = Link::set(MOUNT_HELPER, Some(dhrd()));
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

    // An unknown option is refused with a message, and nothing is mounted...
    let (ok, out) = sh(&format!(
        "mount -t fuse.dhrd {} {} -o speed=fast 2>&1",
        backing.display(),
        mnt.display()
    ));
    assert!(!ok && out.contains("unknown mount option"), "{out}");
    assert!(!is_mounted(&mnt));
    // ...unless mount(8) is asked to be sloppy (-s), as for a line shared with other types.
    let (ok, out) = sh(&format!(
        "mount -s -t fuse.dhrd {} {} -o speed=fast,durability=periodic:7 2>&1",
        backing.display(),
        mnt.display()
    ));
    assert!(ok, "mount -s: {out}");
    assert!(out.contains("ignored"), "{out}");
    assert_eq!(status_json(&mnt)["durability"], "periodic:7");
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    umount_flushes(&mnt, &backing);
}

#[test]
fn fstab_line_mounts_with_defaults_file_and_options() {
    let _g = lock();
    let _m = Link::set(MOUNT_HELPER, Some(dhrd()));
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
    // `mount -a` again (boot scripts, an admin): the line is mounted already, which is not
    // an error, and no second daemon starts.
    let (ok, out) = sh(&format!("mount --fstab {} -a 2>&1", fstab.display()));
    assert!(ok, "mount -a over a mounted line: {out}");
    assert!(out.contains("already mounted"), "{out}");
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    umount_flushes(&mnt, &backing);
    // The same mountpoint from another backing is refused while mounted.
    let (ok, out) = sh(&format!("mount --fstab {} -a 2>&1", fstab.display()));
    assert!(ok, "mount -a after the unmount: {out}");
    let other = s.sub("other");
    let (ok, out) = sh(&format!(
        "mount -t fuse.dhrd {} {} 2>&1",
        other.display(),
        mnt.display()
    ));
    assert!(!ok && out.contains("already mounted from"), "{out}");
    umount_flushes(&mnt, &backing);
}

#[test]
fn fuse3_mount_helper_runs_dhrd_from_path() {
    let _g = lock();
    // No mount.fuse.dhrd: mount(8) falls back to fuse3's mount.fuse, which runs
    // `dhrd BACKING MOUNTPOINT -o OPTIONS` (plus dev,suid) from the default PATH.
    assert!(
        Path::new("/sbin/mount.fuse3").exists(),
        "/sbin/mount.fuse3 is missing (Debian package fuse3, installed by \
         scripts/install-deps.sh)"
    );
    let _m = Link::set(MOUNT_HELPER, None);
    let _p = Link::set(FUSE3_PATH_LINK, Some(dhrd()));
    let s = Scratch::new("boot-fuse3");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    let (ok, out) = sh(&format!(
        "mount -t fuse.dhrd {} {} -o durability=fsync,mem=16M,nofail",
        backing.display(),
        mnt.display()
    ));
    assert!(ok, "mount -t fuse.dhrd through mount.fuse3: {out}");
    let doc = status_json(&mnt);
    assert_eq!(doc["durability"], "fsync");
    assert_eq!(doc["ram"]["budget_bytes"], 16u64 << 20);
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    umount_flushes(&mnt, &backing);
}

/// Starts `dhrd mount --daemon` with fsync durability (nothing reaches the backing before
/// the unmount's flush unless asked).
fn mount_daemon(backing: &Path, mnt: &Path) {
    let o = Command::new(dhrd())
        .arg("mount")
        .arg(backing)
        .arg(mnt)
        .args(["--durability", "fsync", "--daemon"])
        .output()
        .expect("dhrd mount --daemon");
    assert!(o.status.success(), "dhrd mount --daemon: {o:?}");
}

#[test]
fn umount_helper_returns_after_the_flush() {
    let _g = lock();
    let _u = Link::set(UMOUNT_HELPER, Some(dhrd()));
    let s = Scratch::new("boot-umount");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    mount_daemon(&backing, &mnt);
    std::fs::write(mnt.join("f"), b"boot").expect("write");
    // umount(8) runs /sbin/umount.fuse.dhrd for mounts whose type reads fuse.dhrd; for
    // others it unmounts itself. Either way the helper's contract is tested by running it
    // as umount(8) does.
    let cmd = if fstype(&mnt).as_deref() == Some("fuse.dhrd") {
        format!("umount {}", mnt.display())
    } else {
        eprintln!(
            "note: the kernel reports type {:?}, not fuse.dhrd: umount(8) would not run the helper, so it runs directly",
            fstype(&mnt)
        );
        format!("{UMOUNT_HELPER} {}", mnt.display())
    };
    let (ok, out) = sh(&cmd);
    assert!(ok, "{cmd}: {out}");
    // No waiting: the helper returned after the daemon flushed and exited.
    assert!(!is_mounted(&mnt));
    assert!(!daemon_answers(&mnt), "the daemon outlived the helper");
    assert_eq!(std::fs::read(backing.join("f")).expect("backing"), b"boot");

    // A busy mount: refused and left mounted; with -l detached, and flushed once the last
    // user is gone.
    mount_daemon(&backing, &mnt);
    std::fs::write(mnt.join("g"), b"busy").expect("write");
    let holder = std::fs::File::open(mnt.join("g")).expect("open");
    let (ok, out) = sh(&format!("{UMOUNT_HELPER} {} 2>&1", mnt.display()));
    assert!(!ok && out.contains("busy"), "{out}");
    assert!(is_mounted(&mnt) && daemon_answers(&mnt));
    // A second request after the refusal must really unmount (or fail), never report
    // success while the mount stays.
    let (ok, out) = sh(&format!("{UMOUNT_HELPER} {} -l 2>&1", mnt.display()));
    assert!(ok, "umount -l: {out}");
    assert!(!is_mounted(&mnt));
    drop(holder);
    wait_daemon_gone(&mnt);
    assert_eq!(std::fs::read(backing.join("g")).expect("backing"), b"busy");
}

#[test]
fn dhrd_umount_clears_a_dead_mount_and_nothing_else() {
    let s = Scratch::new("boot-dead");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let mnt = m.kill9_keep_mount();
    assert!(is_mounted(&mnt));
    let o = Command::new(dhrd())
        .arg("umount")
        .arg(&mnt)
        .output()
        .expect("dhrd umount");
    let ok = o.status.success();
    if !ok {
        force_unmount(&mnt);
    }
    assert!(ok, "dhrd umount of a dead mount: {o:?}");
    assert!(!is_mounted(&mnt));

    // Not a dhrd mount: refused, and left alone.
    let other = s.sub("tmpfs");
    let (ok, out) = sh(&format!("mount -t tmpfs dhrd-test {}", other.display()));
    assert!(ok, "{out}");
    let o = Command::new(dhrd())
        .args(["umount", "--lazy"])
        .arg(&other)
        .output()
        .expect("dhrd umount");
    let still = is_mounted(&other);
    let _ = sh(&format!("umount {}", other.display()));
    assert!(
        !o.status.success() && still,
        "dhrd umount touched a tmpfs: {o:?}"
    );
}

#[test]
fn foreground_mount_tells_systemd_when_it_is_ready() {
    let s = Scratch::new("boot-notify");
    let (backing, mnt) = (s.sub("b"), s.sub("m"));
    let sock_path = s.0.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    sock.set_read_timeout(Some(READY_WAIT)).expect("timeout");
    let mut child = Command::new(dhrd())
        .arg("mount")
        .arg(&backing)
        .arg(&mnt)
        .arg("--quiet")
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .spawn()
        .expect("dhrd mount");
    let mut buf = [0u8; 512];
    let got = sock.recv(&mut buf);
    // Ready means mounted: units ordered after the service find the file system there.
    let mounted = is_mounted(&mnt) && std::fs::metadata(&mnt).is_ok();
    let umount = Command::new(dhrd())
        .arg("umount")
        .arg(&mnt)
        .status()
        .expect("umount");
    let st = child.wait().expect("wait");
    let n = got.expect("no READY=1 from the mount");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(mounted, "READY=1 came before the mount was up");
    assert!(umount.success() && st.success(), "{umount} {st}");
}

/// The unit as the package installs it, with the binary under test where the package
/// puts `dhrd`.
fn unit_text() -> String {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/dhrd@.service"),
    )
    .expect("unit file");
    unit.replace("/usr/bin/dhrd", dhrd())
}

/// Panics unless `tool` runs. systemd need not be running (it is not PID 1 in a container
/// or CI job): the package is installed by scripts/install-deps.sh, and what these tests
/// use of it (unit verification, the fstab generator, `systemd --test`) works without it.
fn require_systemd_tool(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} does not run (Debian package systemd, installed by scripts/install-deps.sh)"
    );
}

/// `systemd-analyze verify` on unit files; only complaints about these units count (the
/// host's own units may have some).
fn verify(units: &[PathBuf], names: &[&str]) {
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(units)
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&o.stderr);
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| names.iter().any(|n| l.contains(n)))
        .collect();
    assert!(
        o.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
}

/// Runs systemd's fstab generator on `fstab` into `out` (what systemd does at boot with
/// /etc/fstab).
fn fstab_generator(fstab: &Path, out: &Path) {
    let gen = ["/usr/lib/systemd", "/lib/systemd"]
        .iter()
        .map(|d| Path::new(d).join("system-generators/systemd-fstab-generator"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("systemd-fstab-generator is missing (Debian package systemd)"));
    let o = Command::new(gen)
        .args([out, out, out])
        .env("SYSTEMD_FSTAB", fstab)
        // Not the host's kernel command line (fstab=no, root= ...) and not an initrd.
        .env("SYSTEMD_PROC_CMDLINE", "")
        .env("SYSTEMD_IN_INITRD", "0")
        .output()
        .expect("fstab generator");
    assert!(o.status.success(), "systemd-fstab-generator: {o:?}");
}

#[test]
fn systemd_units_verify() {
    require_systemd_tool("systemd-analyze");
    let s = Scratch::new("boot-unit");
    let path = s.0.join("dhrd@test.service");
    std::fs::write(&path, unit_text()).expect("unit copy");
    verify(&[path], &["dhrd@"]);

    // The mount unit systemd makes from a dhrd fstab line.
    let fstab = s.0.join("fstab");
    std::fs::write(
        &fstab,
        "/var/lib/dhrd/data /srv/dhrdtestdata fuse.dhrd durability=sync,mem=4G,x-systemd.requires-mounts-for=/var/lib/dhrd/data 0 0\n",
    )
    .expect("fstab");
    let out = s.sub("gen");
    fstab_generator(&fstab, &out);
    let unit = out.join("srv-dhrdtestdata.mount");
    let text = std::fs::read_to_string(&unit).expect("generated mount unit");
    for want in [
        "Type=fuse.dhrd",
        "What=/var/lib/dhrd/data",
        "RequiresMountsFor=/var/lib/dhrd/data",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
    assert!(
        out.join("local-fs.target.requires/srv-dhrdtestdata.mount")
            .exists(),
        "local-fs.target does not require the mount"
    );
    verify(&[unit], &["dhrdtestdata"]);
}

/// The unit `name` in a `systemd --test` dump: its lines, up to the next unit.
fn unit_dump<'a>(dump: &'a str, name: &str) -> Vec<&'a str> {
    let head = format!("-> Unit {name}:");
    dump.lines()
        .skip_while(|l| l.trim() != head)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("-> Unit "))
        .map(str::trim)
        .collect()
}

fn has_dep(dump: &str, unit: &str, dep: &str, other: &str) -> bool {
    let want = format!("{dep}: {other} ");
    unit_dump(dump, unit).iter().any(|l| l.starts_with(&want))
}

#[test]
fn systemd_orders_services_after_the_mount_and_the_mount_after_its_backing() {
    // systemd's test mode builds the boot transaction from unit files without running
    // anything; it refuses to run as root, so it runs as nobody.
    let systemd = ["/usr/lib/systemd/systemd", "/lib/systemd/systemd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or_else(|| panic!("systemd is missing (Debian package systemd)"));
    let s = Scratch::new("boot-order");
    let units = s.sub("units");
    // fstab: the backing's own file system, then the dhrd line ordered after it.
    let fstab = s.0.join("fstab");
    std::fs::write(
        &fstab,
        "LABEL=dhrdtestssd /srv/dhrdtestssd ext4 defaults 0 2\n\
         /srv/dhrdtestssd/data /srv/dhrdtestdata fuse.dhrd durability=sync,x-systemd.requires-mounts-for=/srv/dhrdtestssd/data 0 0\n",
    )
    .expect("fstab");
    fstab_generator(&fstab, &units);
    // The template route, one instance.
    std::fs::write(units.join("dhrd@.service"), unit_text()).expect("unit");
    // A service on each route, as docs/boot.md tells them to declare it.
    std::fs::write(
        units.join("dhrdtest-db.service"),
        "[Unit]\nRequiresMountsFor=/srv/dhrdtestdata/db\n[Service]\nExecStart=/bin/true\n",
    )
    .expect("consumer");
    std::fs::write(
        units.join("dhrdtest-app.service"),
        "[Unit]\nRequires=dhrd@data.service\nAfter=dhrd@data.service\n[Service]\nExecStart=/bin/true\n",
    )
    .expect("consumer");
    std::fs::write(
        units.join("dhrdtest.target"),
        "[Unit]\nRequires=dhrdtest-db.service dhrdtest-app.service local-fs.target\n",
    )
    .expect("target");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", systemd])
        .args([
            "--test",
            "--system",
            "--unit=dhrdtest.target",
            "--log-target=console",
        ])
        // The trailing colon appends the standard unit directories (local-fs.target...).
        .env("SYSTEMD_UNIT_PATH", format!("{}:", units.display()))
        .output()
        .expect("systemd --test");
    let dump = String::from_utf8_lossy(&o.stdout);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && dump.contains("-> Unit dhrdtest.target:"),
        "systemd --test: {log}"
    );
    assert!(!log.contains("ordering cycle"), "{log}");

    let mnt = "srv-dhrdtestdata.mount";
    let ssd = "srv-dhrdtestssd.mount";
    // fstab: the service waits for the dhrd mount and pulls it in...
    assert!(has_dep(&dump, "dhrdtest-db.service", "Requires", mnt));
    assert!(has_dep(&dump, "dhrdtest-db.service", "After", mnt));
    // ...which comes after the file system of its backing and before local-fs.target,
    // like any local mount, so services ordered after local-fs.target find it too.
    assert!(has_dep(&dump, mnt, "Requires", ssd));
    assert!(has_dep(&dump, mnt, "After", ssd));
    assert!(has_dep(&dump, mnt, "Before", "local-fs.target"));
    // Template: the service waits for the instance, which comes after the local file
    // systems and before the remote ones.
    let inst = "dhrd@data.service";
    assert!(has_dep(&dump, "dhrdtest-app.service", "After", inst));
    assert!(has_dep(&dump, inst, "After", "local-fs.target"));
    assert!(has_dep(&dump, inst, "Before", "remote-fs-pre.target"));
    assert!(
        unit_dump(&dump, inst).contains(&"Type: notify"),
        "{:#?}",
        unit_dump(&dump, inst)
    );
}
