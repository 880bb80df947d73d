//! `dhrd nbd` on a Ceph RBD image (SPEC R1), against a real one-node cluster: round trips
//! through the standard NBD clients, SIGKILL under writes with every acknowledged write
//! found after the restart, a second dhrd refused by the image's exclusive lock, and the
//! OSD stopped under load (writes wait, or fail cleanly with a timeout, and are never
//! acknowledged before Ceph stored them), and device timing on an image.

#[path = "../../dhrd-rbd/tests/cluster/mod.rs"]
mod cluster;
mod nbd_common;

use dhrd_nbd::client::Client;
use nbd_common::*;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn start(dir: &Path, c: &cluster::Cluster, image: &str, extra: &[&str]) -> Dhrd {
    let conf = c.conf.to_string_lossy().into_owned();
    let owners = dir.join("owners").to_string_lossy().into_owned();
    let mut args = vec![
        "--ceph-conf",
        conf.as_str(),
        "--rbd-owner-dir",
        owners.as_str(),
    ];
    args.extend_from_slice(extra);
    Dhrd::start(dir, Path::new(&format!("rbd:rbd/{image}")), &args)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn nbd_uri(d: &Dhrd) -> String {
    format!("nbd+unix:///?socket={}", d.sock.display())
}

#[test]
fn nbd_clients_round_trip_through_an_rbd_image() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("clients");
    let mut d = start(dir.path(), c, &image, &["--size", "32M"]);
    let info = run(Command::new(tool("nbdinfo")).arg("--size").arg(nbd_uri(&d)));
    assert_eq!(info.trim(), (32u64 << 20).to_string());
    // 32 MiB of known data in with nbdcopy, back out, and compared with qemu-img.
    let src = dir.path().join("src.img");
    let mut data = Vec::with_capacity(32 << 20);
    for i in 0..(32 << 20) / BLOCK as u64 {
        data.extend_from_slice(&block(i, 3));
    }
    std::fs::write(&src, &data).unwrap_or_else(|e| panic!("{e}"));
    run(Command::new(tool("nbdcopy")).arg(&src).arg(nbd_uri(&d)));
    let back = dir.path().join("back.img");
    run(Command::new(tool("nbdcopy")).arg(nbd_uri(&d)).arg(&back));
    assert!(
        std::fs::read(&back).unwrap_or_default() == data,
        "nbdcopy round trip differs"
    );
    run(Command::new(tool("qemu-img"))
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(nbd_uri(&d)));
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    // The data is in the cluster, not only in dhrd's RAM: rbd export sees it.
    assert!(
        c.export_image(&image, &dir.path().join("exported.img")) == data,
        "rbd export differs"
    );
    c.remove_image(&image);
}

#[test]
fn nbd_rbd_sigkill_during_writes_keeps_every_acknowledged_write() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("kill");
    let mut d = start(dir.path(), c, &image, &["--size", "64M"]);
    let order: Vec<u64> = (0..1024).collect();
    let (acked, _) = write_until_killed(&mut d, &order, 5, false, 16, 200);
    drop(d);
    // The killed holder's lock would stay until its watch expires on the OSD (5 s on the
    // test cluster, 30 s by default); the owner record lets the restart break it at once,
    // well within a lock wait shorter than the watch timeout.
    let restarted = Instant::now();
    let mut d = start(dir.path(), c, &image, &["--rbd-lock-wait-secs", "2"]);
    eprintln!(
        "restart after SIGKILL took the lock in {:?}",
        restarted.elapsed()
    );
    assert!(
        d.stderr_text().contains("took over the lock"),
        "{}",
        d.stderr_text()
    );
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    for &i in &acked {
        let got = read_block(&mut cl, i);
        assert!(
            got == block(i, 5),
            "acknowledged block {i} lost after SIGKILL"
        );
    }
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    c.remove_image(&image);
}

#[test]
fn a_second_dhrd_on_the_same_image_is_refused() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("second");
    let mut first = start(dir.path(), c, &image, &["--size", "8M"]);
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--rbd-lock-wait-secs", "2", "--socket"])
        .arg(dir.path().join("second.sock"))
        .arg("--ceph-conf")
        .arg(&c.conf)
        .arg("--backing")
        .arg(format!("rbd:rbd/{image}"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second dhrd started on a held image"
    );
    assert!(err.contains("in use by another client"), "{err}");
    // The first one still serves writes.
    let mut cl = Client::connect(&first.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 9), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(cl);
    assert_eq!(first.term(), Some(0));
    // A clean stop releases the lock at once: the next dhrd does not wait for the
    // cluster's watch timeout (5 s on the test cluster) to break it.
    let mut next = start(dir.path(), c, &image, &["--rbd-lock-wait-secs", "1"]);
    assert_eq!(next.term(), Some(0));
    c.remove_image(&image);
}

#[test]
fn bad_rbd_arguments_get_clear_errors() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cases: [(&[&str], &str); 3] = [
        (&["--backing", "rbd:rbd"], "expected rbd:POOL/IMAGE"),
        (&["--backing", "rbd:rbd/does-not-exist"], "give a size"),
        (&["--backing", "rbd:nopool/x", "--size", "1M"], "nopool"),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
            .arg("nbd")
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .arg("--ceph-conf")
            .arg(&c.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

/// Sends one write and returns a receiver for its reply, from a thread of its own.
fn write_in_background(sock: &Path, i: u64, gen: u64) -> mpsc::Receiver<u32> {
    let (tx, rx) = mpsc::channel();
    let mut cl = Client::connect(sock).unwrap_or_else(|e| panic!("{e}"));
    std::thread::spawn(move || {
        if let Ok(()) = cl
            .write(i * BLOCK as u64, &block(i, gen), false)
            .map(|_| ())
        {
            let _ = tx.send(0);
        } else {
            let _ = tx.send(libc::EIO as u32);
        }
    });
    rx
}

#[test]
fn with_the_osd_down_writes_wait_and_loaded_reads_go_on() {
    let (c, _g) = cluster::exclusive();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("osdwait");
    let (mut d, mut cl) = start_with_loaded_blocks(dir.path(), c, &image, &[]);
    c.stop_osd();
    // Default policy: a write waits for the cluster; it is not acknowledged meanwhile.
    let pending = write_in_background(&d.sock, 3, 2);
    assert!(
        pending.recv_timeout(Duration::from_secs(3)).is_err(),
        "a write was acknowledged while the only OSD was down"
    );
    // Reads of loaded chunks never touch the network: they are served meanwhile.
    for i in [0u64, 5, 7] {
        let got = read_block(&mut cl, i);
        assert!(
            got == block(i, 1),
            "loaded block {i} not served while the OSD was down"
        );
    }
    c.start_osd();
    let r = pending
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| {
            panic!(
                "the write did not complete after the OSD came back:\n{}",
                d.stderr_text()
            )
        });
    assert_eq!(r, 0, "the waiting write failed after the OSD came back");
    let got = read_block(&mut cl, 3);
    assert!(got == block(3, 2));
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    let disk = c.export_image(&image, &dir.path().join("e.img"));
    assert!(
        disk[3 * BLOCK..4 * BLOCK] == block(3, 2)[..],
        "the write is not in the cluster"
    );
    c.remove_image(&image);
}

#[test]
fn with_an_op_timeout_a_lost_osd_fails_writes_cleanly() {
    let (c, _g) = cluster::exclusive();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("osdtimeout");
    let (mut d, mut cl) =
        start_with_loaded_blocks(dir.path(), c, &image, &["--rbd-op-timeout-secs", "3"]);
    c.stop_osd();
    let failed = cl.write(3 * BLOCK as u64, &block(3, 2), false);
    assert!(
        failed.is_err(),
        "a write was acknowledged while the only OSD was down"
    );
    // The export turned read-only (C4) and still serves what it holds.
    let got = read_block(&mut cl, 5);
    assert!(got == block(5, 1));
    assert!(
        cl.write(6 * BLOCK as u64, &block(6, 2), false).is_err(),
        "writable after a failure"
    );
    c.start_osd();
    drop(cl);
    let _ = d.term();
    drop(d);
    // After a restart every acknowledged write is there; the failed one may or may not be.
    let mut d = start(dir.path(), c, &image, &[]);
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    for i in [0u64, 1, 2, 4, 5, 6, 7] {
        let got = read_block(&mut cl, i);
        assert!(got == block(i, 1), "block {i} changed");
    }
    let b3 = read_block(&mut cl, 3);
    assert!(
        b3 == block(3, 1) || b3 == block(3, 2),
        "block 3 is neither old nor new"
    );
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    c.remove_image(&image);
}

/// Block `i` as the export serves it.
fn read_block(cl: &mut Client, i: u64) -> Vec<u8> {
    cl.read(i * BLOCK as u64, BLOCK as u32)
        .unwrap_or_else(|e| panic!("read of block {i}: {e}"))
}

/// A dhrd on a new 16 MiB image whose blocks 0..8 hold generation 1, fully loaded, and a
/// client connected to it.
fn start_with_loaded_blocks(
    dir: &Path,
    c: &cluster::Cluster,
    image: &str,
    extra: &[&str],
) -> (Dhrd, Client) {
    let mut args = vec!["--size", "16M"];
    args.extend_from_slice(extra);
    let d = start(dir, c, image, &args);
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..8 {
        cl.write(i * BLOCK as u64, &block(i, 1), false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_loaded(&d);
    (d, cl)
}

/// Waits for the "loaded ... into RAM" line of the background load.
fn wait_loaded(d: &Dhrd) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d.stderr_text().contains("into RAM") {
        assert!(
            Instant::now() < deadline,
            "load did not finish:\n{}",
            d.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A dhrd cut off from the cluster (here: frozen with SIGSTOP) past the watch timeout
/// loses its lock to a second dhrd, which then writes. With a read lease, the first one,
/// once it runs again, refuses reads instead of serving its stale RAM.
#[test]
fn with_a_read_lease_a_dhrd_that_lost_its_lock_serves_no_stale_reads() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("lease");
    let mut first = start(
        dir.path(),
        c,
        &image,
        &["--size", "8M", "--rbd-read-lease-secs", "2"],
    );
    let mut cl = Client::connect(&first.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 1), false)
        .unwrap_or_else(|e| panic!("{e}"));
    let pid = first.child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // The test cluster's watch timeout is 5 s: after it, a second client may break the
    // lock. (Its own owner directory: the first process is alive, only stopped.)
    std::thread::sleep(Duration::from_secs(6));
    let second_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut second = start(
        second_dir.path(),
        c,
        &image,
        &["--rbd-lock-wait-secs", "60"],
    );
    let mut c2 = Client::connect(&second.sock).unwrap_or_else(|e| panic!("{e}"));
    c2.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(c2);
    assert_eq!(second.term(), Some(0), "{}", second.stderr_text());
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    for _ in 0..3 {
        match cl.read(0, BLOCK as u32) {
            Err(_) => {}
            Ok(got) => assert!(
                got != block(0, 1),
                "a dhrd that lost its lock served stale data from RAM"
            ),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(cl);
    first.kill9();
    let _ = Command::new("rbd")
        .arg("-c")
        .arg(&c.conf)
        .args(["rm", "--no-progress", &format!("rbd/{image}")])
        .output();
}

/// `--backing-timing` wraps an RBD image as it wraps a file (E1): the startup line names
/// the timing, a read from the image takes at least the emulated latency (the real round
/// trip counts towards it, so this is a floor), and the data reaches the cluster.
#[test]
fn backing_timing_applies_to_an_rbd_image() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("timing");
    // A RAM budget of one chunk keeps block 100 (chunk 6) on the image.
    let mut d = start(
        dir.path(),
        c,
        &image,
        &[
            "--size",
            "8M",
            "--chunk",
            "1M",
            "--mem",
            "1M",
            "--backing-timing",
            "2000,2000,2000,0",
        ],
    );
    assert!(
        d.ready_line.contains("backing timing read 2000 us"),
        "startup line without the timing: {}",
        d.ready_line
    );
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    let i = 100u64;
    cl.write(i * BLOCK as u64, &block(i, 4), false)
        .unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let got = read_block(&mut cl, i);
    let took = t.elapsed();
    assert!(got == block(i, 4), "block {i} read back wrong");
    assert!(
        took >= Duration::from_micros(2000),
        "read took only {took:?}"
    );
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    let disk = c.export_image(&image, &dir.path().join("e.img"));
    let o = i as usize * BLOCK;
    assert!(
        disk[o..o + BLOCK] == block(i, 4)[..],
        "block {i} not in the image"
    );
    c.remove_image(&image);
}
