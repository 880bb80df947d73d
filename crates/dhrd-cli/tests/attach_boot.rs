//! `dhrd attach` at boot: the template unit `dist/dhrd-attach@.service` verifies, an
//! instance named by an escaped path orders after that path's file system and is a
//! `Type=notify` service, and a foreground attach tells systemd READY=1 once the mode is
//! in force (the directory answers `dhrd status`), then `--daemon` runs it in the
//! background.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn unit_text() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/dhrd-attach@.service"),
    )
    .expect("unit file")
    .replace("/usr/bin/dhrd", common::dhrd())
}

#[test]
fn the_attach_unit_verifies_and_orders_after_the_directory_s_file_system() {
    let ok = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "systemd-analyze does not run (Debian package systemd, scripts/install-deps.sh)"
    );
    let s = Scratch::new("attach-unit");
    let path = s.0.join("dhrd-attach@srv-dhrdtestdata.service");
    std::fs::write(&path, unit_text()).unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("dhrd-attach@")).collect();
    assert!(
        o.status.success() && ours.is_empty(),
        "systemd-analyze verify: {err}"
    );
    // The instance's path comes from its name: %f of srv-dhrdtestdata is /srv/dhrdtestdata.
    let text = unit_text();
    assert!(text.contains("RequiresMountsFor=%f") && text.contains("Type=notify"));
    assert!(text.contains("ExecStart=") && text.contains("attach --quiet %f"));
}

#[test]
fn a_foreground_attach_tells_systemd_when_the_mode_is_in_force_and_daemon_mode_returns() {
    let s = Scratch::new("attach-notify");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let sock_path = s.0.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = Command::new(common::dhrd())
        .arg("attach")
        .arg(&dir)
        .arg("--quiet")
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let got = sock.recv(&mut buf);
    let ready = dhrd_attach::is_attached(&dir) && has_sync_flag(&dir);
    let o = Command::new(common::dhrd())
        .arg("detach")
        .arg(&dir)
        .output()
        .unwrap();
    let st = child.wait().unwrap();
    let n = got.expect("no READY=1 from the attach");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(ready, "READY=1 came before the mode was in force");
    assert!(o.status.success() && st.success(), "{o:?} {st}");

    // --daemon returns once attached; detach stops it.
    let o = Command::new(common::dhrd())
        .args(["attach", "--daemon", "--durability", "fsync"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(dhrd_attach::is_attached(&dir));
    let st = Command::new(common::dhrd())
        .arg("status")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(text.contains("durability:      fsync"), "{text}");
    let prom = Command::new(common::dhrd())
        .args(["status", "--prometheus"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&prom.stdout).contains("dhrd_attach_ram_pinned_bytes"),
        "{prom:?}"
    );
    let o = Command::new(common::dhrd())
        .arg("detach")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(!dhrd_attach::is_attached(&dir));
}
