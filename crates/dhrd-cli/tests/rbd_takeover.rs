//! One writer per RBD image, and no stale bytes after another client changed it, on the
//! real `dhrd nbd` process against the one-node test cluster: a cache (--tier-ssd) over an
//! image rolled back or taken over by another host, a dhrd whose lock was broken, the read
//! lease's bound, an image shrunk under dhrd by `rbd resize --allow-shrink`, and the owner
//! record and status files, which root rewrites, in directories others may write.

#[path = "../../dhrd-rbd/tests/cluster/mod.rs"]
mod cluster;
mod nbd_common;

use dhrd_nbd::client::Client;
use dhrd_nbd::NbdError;
use nbd_common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn start(dir: &Path, owners: &Path, c: &cluster::Cluster, image: &str, extra: &[&str]) -> Dhrd {
    let conf = c.conf.to_string_lossy().into_owned();
    let owners = owners.to_string_lossy().into_owned();
    let mut args = vec![
        "--ceph-conf",
        conf.as_str(),
        "--rbd-owner-dir",
        owners.as_str(),
    ];
    args.extend_from_slice(extra);
    Dhrd::start(dir, Path::new(&format!("rbd:rbd/{image}")), &args)
}

/// Runs `dhrd nbd` on `image` expecting it to stop before it serves; its stderr, or None
/// when it started serving (then it is stopped cleanly).
fn start_refused(
    dir: &Path,
    owners: &Path,
    c: &cluster::Cluster,
    image: &str,
    extra: &[&str],
) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .arg("nbd")
        .arg("--socket")
        .arg(dir.join("refused.sock"))
        .arg("--ceph-conf")
        .arg(&c.conf)
        .arg("--rbd-owner-dir")
        .arg(owners)
        .arg("--backing")
        .arg(format!("rbd:rbd/{image}"))
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // A dhrd that serves runs until stopped: give it the lock wait, then stop it.
    let pid = out.id() as libc::pid_t;
    let waiter = std::thread::spawn(move || out.wait_with_output());
    let deadline = Instant::now() + Duration::from_secs(45);
    while !waiter.is_finished() && Instant::now() < deadline {
        if dir.join("refused.sock").exists() {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let _ = waiter.join();
            let _ = std::fs::remove_file(dir.join("refused.sock"));
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waiter
        .join()
        .unwrap_or_else(|_| panic!("waiter"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success(), "dhrd exited 0 without serving");
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

fn read_block(cl: &mut Client, i: u64) -> Result<Vec<u8>, NbdError> {
    cl.read(i * BLOCK as u64, BLOCK as u32)
}

fn image_block(c: &cluster::Cluster, image: &str, dir: &Path, i: u64) -> Vec<u8> {
    let scratch = dir.join(format!("export-{i}.img"));
    let _ = std::fs::remove_file(&scratch);
    let disk = c.export_image(image, &scratch);
    disk[i as usize * BLOCK..(i as usize + 1) * BLOCK].to_vec()
}

fn remove_with_snapshots(c: &cluster::Cluster, image: &str) {
    let _ = Command::new("rbd")
        .arg("-c")
        .arg(&c.conf)
        .args(["snap", "purge", "--no-progress", &format!("rbd/{image}")])
        .output();
    let _ = Command::new("rbd")
        .arg("-c")
        .arg(&c.conf)
        .args(["rm", "--no-progress", &format!("rbd/{image}")])
        .output();
}

/// The SSD-tier arguments over an image: 64 KiB chunks (one block each), an SSD of 34
/// slots.
fn tier_args(ssd: &Path) -> Vec<String> {
    [
        "--tier-ssd",
        &ssd.to_string_lossy(),
        "--tier-ssd-size",
        "2200K",
        "--chunk",
        "64K",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Item (a) of the cache over an image: stopped cleanly, the image rolled back to a
/// snapshot, restarted with the same SSD: the SSD's clean copy of a block the rollback
/// changed must not be served.
#[test]
fn an_ssd_over_a_rolled_back_image_serves_no_stale_chunk() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let owners = dir.path().join("owners");
    let image = c.image_name("rollback");
    let ssd = dir.path().join("ssd.img");
    let mut args = tier_args(&ssd);
    args.extend(["--size".into(), "8M".into()]);
    let mut d = start(dir.path(), &owners, c, &image, &strs(&args));
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 1), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    c.rbd(&["snap", "create", &format!("rbd/{image}@s1")]);
    let mut d = start(dir.path(), &owners, c, &image, &strs(&args));
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    assert!(
        image_block(c, &image, dir.path(), 0) == block(0, 2),
        "the clean stop did not write block 0 back:\n{}",
        d.stderr_text()
    );
    c.rbd(&[
        "snap",
        "rollback",
        "--no-progress",
        &format!("rbd/{image}@s1"),
    ]);
    let mut d = start(dir.path(), &owners, c, &image, &strs(&args));
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    let got = read_block(&mut cl, 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got == block(0, 1),
        "the SSD served its copy of block 0 from before the rollback (generation 2):\n{}",
        d.stderr_text()
    );
    drop(cl);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    remove_with_snapshots(c, &image);
}

/// Item (b): host A acknowledges a write on its SSD and dies before writing it back. A
/// dhrd without that SSD (host B) must refuse the image; forced (--drop-cache-mark), it
/// writes; A restarted with its SSD must then not write its old dirty chunk over B's data.
#[test]
fn a_cache_holding_acknowledged_writes_keeps_other_hosts_off_and_never_writes_back_late() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (owners_a, owners_b) = (dir.path().join("owners-a"), dir.path().join("owners-b"));
    let image = c.image_name("takeover");
    let ssd = dir.path().join("ssd.img");
    c.rbd(&["create", "--size", "8M", &format!("rbd/{image}")]);
    // Every request to the image takes 3 s: the write-back is far behind the kill.
    let mut args_a = tier_args(&ssd);
    args_a.extend(["--backing-timing".into(), "0,3000000,0,0".into()]);
    let mut a = start(dir.path(), &owners_a, c, &image, &strs(&args_a));
    let mut cl = Client::connect(&a.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("{e}"));
    a.kill9();
    drop(cl);
    assert!(
        image_block(c, &image, dir.path(), 0) != block(0, 2),
        "the write reached the image before the kill: the test needs a dirty chunk"
    );
    // Host B: no SSD. (Its lock wait covers the dead holder's watch timeout, 5 s here.)
    let dir_b = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let wait = ["--rbd-lock-wait-secs", "30"];
    let refused = start_refused(dir_b.path(), &owners_b, c, &image, &wait);
    let mut b_args = wait.to_vec();
    match &refused {
        Some(err) => {
            assert!(
                err.contains("lacks data"),
                "refused for another reason: {err}"
            );
            b_args.push("--drop-cache-mark");
        }
        None => eprintln!("FAILED (item b, first half): host B served the image without A's SSD"),
    }
    let mut b = start(dir_b.path(), &owners_b, c, &image, &b_args);
    let mut cl = Client::connect(&b.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 3), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(cl);
    assert_eq!(b.term(), Some(0), "{}", b.stderr_text());
    // Host A comes back with its SSD: it must not write generation 2 over B's 3.
    let mut args_a = tier_args(&ssd);
    args_a.extend(["--rbd-lock-wait-secs".into(), "30".into()]);
    // Refused, or started and stopped cleanly: what it wrote back is checked below.
    if let Some(err) = start_refused(dir.path(), &owners_a, c, &image, &strs(&args_a)) {
        assert!(err.contains("dirty"), "A refused for another reason: {err}");
    }
    let now = image_block(c, &image, dir.path(), 0);
    assert!(
        now == block(0, 3),
        "host A wrote its stale dirty chunk back over host B's write (or B's write is lost)"
    );
    assert!(refused.is_some(), "host B served the image without A's SSD");
    remove_with_snapshots(c, &image);
}

/// `rbd lock ls` of `image`: (lock id, locker) of its one lock.
fn lock_of(c: &cluster::Cluster, image: &str) -> (String, String) {
    let out = c.rbd(&["lock", "ls", "--format", "json", &format!("rbd/{image}")]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let l = &v[0];
    let s = |k: &str| {
        l[k].as_str()
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .to_owned()
    };
    (s("id"), s("locker"))
}

/// Item 2: without a read lease, a dhrd whose lock was broken (and which is blocklisted)
/// learns it at its next request to the cluster; from then on it must not serve RAM that
/// another client may have changed.
#[test]
fn a_dhrd_that_knows_it_lost_its_lock_serves_no_stale_ram() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let owners = dir.path().join("owners");
    let image = c.image_name("lost");
    let mut a = start(dir.path(), &owners, c, &image, &["--size", "8M"]);
    let mut cl = Client::connect(&a.sock).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..4 {
        cl.write(i * BLOCK as u64, &block(i, 1), false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Another client breaks the lock: librbd blocklists the holder as it does.
    let (id, locker) = lock_of(c, &image);
    c.rbd(&["lock", "rm", &format!("rbd/{image}"), &id, &locker]);
    let dir_b = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut b = start(dir_b.path(), &dir_b.path().join("owners"), c, &image, &[]);
    let mut c2 = Client::connect(&b.sock).unwrap_or_else(|e| panic!("{e}"));
    c2.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(c2);
    assert_eq!(b.term(), Some(0), "{}", b.stderr_text());
    // A's next write meets the blocklist: it fails, and A now knows.
    assert!(
        cl.write(BLOCK as u64, &block(1, 3), false).is_err(),
        "a blocklisted dhrd acknowledged a write"
    );
    for _ in 0..3 {
        if let Ok(got) = read_block(&mut cl, 0) {
            assert!(
                got != block(0, 1),
                "a dhrd that lost its lock served block 0 from RAM, older than the new \
                 owner's write"
            );
        }
    }
    drop(cl);
    a.kill9();
    remove_with_snapshots(c, &image);
}

/// Item 3: a lease is only sound while it is shorter than the time another client must
/// wait before it may break the lock: the watch timeout (5 s on the test cluster) less a
/// ping interval and a margin. A longer one is refused at start.
#[test]
fn a_read_lease_longer_than_the_watch_allows_is_refused() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let owners = dir.path().join("owners");
    let image = c.image_name("longlease");
    let args = ["--size", "8M", "--rbd-read-lease-secs", "5"];
    let refused = start_refused(dir.path(), &owners, c, &image, &args);
    remove_with_snapshots(c, &image);
    let err = refused.unwrap_or_else(|| {
        panic!("a 5 s read lease was accepted on a cluster whose watch timeout is 5 s")
    });
    assert!(err.contains("osd_client_watch_timeout"), "{err}");
}

/// Item 4: another client shrinks the image (`rbd resize --allow-shrink`; the lock
/// owner, dhrd, carries the resize out). A write across the new end must fail cleanly,
/// not kill the connection, and RAM past the new end must not be served as the image.
#[test]
fn an_image_shrunk_under_dhrd_fails_cleanly() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let owners = dir.path().join("owners");
    let image = c.image_name("shrink");
    let mut d = start(dir.path(), &owners, c, &image, &["--size", "16M"]);
    let mut cl = Client::connect(&d.sock).unwrap_or_else(|e| panic!("{e}"));
    let last = (16 << 20) / BLOCK as u64 - 1;
    cl.write(last * BLOCK as u64, &block(last, 1), false)
        .unwrap_or_else(|e| panic!("{e}"));
    c.rbd(&[
        "resize",
        "--no-progress",
        "--size",
        "8M",
        "--allow-shrink",
        &format!("rbd/{image}"),
    ]);
    // Across the new end (8 MiB): 32 KiB below it, 32 KiB above.
    let across = cl.write((8 << 20) - BLOCK as u64 / 2, &block(7, 2), false);
    match &across {
        Err(NbdError::Errno(_)) => {}
        other => panic!(
            "a write across the shrunk image's end: {other:?} (want an error reply)\n{}",
            d.stderr_text()
        ),
    }
    // The block past the new end is gone from the image: RAM must not serve it.
    match read_block(&mut cl, last) {
        Err(NbdError::Errno(_)) => {}
        Ok(got) => assert!(
            got != block(last, 1),
            "RAM served a block the image no longer has"
        ),
        Err(e) => panic!("the connection broke: {e}\n{}", d.stderr_text()),
    }
    drop(cl);
    let _ = d.term();
    assert!(
        !d.stderr_text().contains("panicked"),
        "dhrd panicked:\n{}",
        d.stderr_text()
    );
    remove_with_snapshots(c, &image);
}

/// Item 6: the owner record is replaced through a temporary file in --rbd-owner-dir; one
/// planted there as a symlink must not be followed. And a record that another user could
/// have written (a directory others may write) must not make dhrd break a live lock.
#[test]
fn owner_records_are_not_trusted_beyond_what_they_prove() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let owners = dir.path().join("owners");
    std::fs::create_dir(&owners).unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("forged");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap_or_else(|e| panic!("{e}"));
    let record = owners.join(format!("rbd%{image}.owner"));
    let mut tmp = record.clone().into_os_string();
    tmp.push(".tmp");
    std::os::unix::fs::symlink(&victim, &tmp).unwrap_or_else(|e| panic!("{e}"));
    let mut a = start(dir.path(), &owners, c, &image, &["--size", "8M"]);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap_or_default(),
        "precious\n",
        "the owner record was written through a planted symlink"
    );
    // A forged record in a directory anyone may write: the live owner's address, a pid
    // that is gone.
    let real = std::fs::read_to_string(&record).unwrap_or_else(|e| panic!("{e}"));
    let rest: Vec<&str> = real.split_whitespace().skip(2).collect();
    assert!(!rest.is_empty(), "owner record {real:?}");
    let gone = Command::new("true")
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let gone_pid = gone.id();
    let _ = gone.wait_with_output();
    let open_dir = dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777))
        .unwrap_or_else(|e| panic!("{e}"));
    let forged = open_dir.join(format!("rbd%{image}.owner"));
    let text = format!("{gone_pid} 1 {}\n", rest.join(" "));
    std::fs::write(&forged, text).unwrap_or_else(|e| panic!("{e}"));
    // Written by another user (nobody), as a user who may write the directory could.
    std::os::unix::fs::chown(&forged, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
    let b_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let taken = start_refused(
        b_dir.path(),
        &open_dir,
        c,
        &image,
        &["--rbd-lock-wait-secs", "2"],
    );
    // A still holds the lock: its writes go on.
    let mut cl = Client::connect(&a.sock).unwrap_or_else(|e| panic!("{e}"));
    let still = cl.write(0, &block(0, 1), false);
    drop(cl);
    let _ = a.term();
    remove_with_snapshots(c, &image);
    assert!(
        taken.is_some(),
        "a forged owner record made dhrd break a live lock"
    );
    assert!(
        still.is_ok(),
        "the live holder lost its lock to a forged record: {still:?}"
    );
}

/// Item 6: the status file is replaced every second through a temporary file in its
/// directory; one planted there as a symlink must not be followed (root would overwrite
/// whatever it points to).
#[test]
fn status_files_are_not_written_through_planted_symlinks() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("backing.img");
    blocks_file(&backing, 16, 1);
    let status = dir.path().join("status.json");
    let victims = [
        dir.path().join("victim-json"),
        dir.path().join("victim-prom"),
    ];
    for (v, tmp) in victims
        .iter()
        .zip(["status.json.tmp", "status.json.prom.tmp"])
    {
        std::fs::write(v, "precious\n").unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(v, dir.path().join(tmp)).unwrap_or_else(|e| panic!("{e}"));
    }
    let status_s = status.to_string_lossy().into_owned();
    let mut d = Dhrd::start(dir.path(), &backing, &["--status-file", &status_s]);
    // The status is rewritten every second: wait for two rewrites.
    std::thread::sleep(Duration::from_millis(2200));
    let _ = d.term();
    for v in &victims {
        assert_eq!(
            std::fs::read_to_string(v).unwrap_or_default(),
            "precious\n",
            "{} was overwritten through a planted symlink",
            v.display()
        );
    }
    let doc = std::fs::read_to_string(&status).unwrap_or_default();
    assert!(doc.contains("\"size_bytes\""), "no status written: {doc}");
}

/// Item 2 with no request of its own: a dhrd without a lease, frozen (SIGSTOP) past the
/// watch timeout while a second one takes the image over and writes, learns of the loss
/// from its check of the lock once it runs again, and from then on refuses reads of RAM,
/// although it sent nothing that could fail. (Until that check, about a second, a read may
/// still be served from RAM: docs/rbd.md.)
#[test]
fn a_frozen_dhrd_without_a_lease_stops_serving_ram_once_it_sees_the_takeover() {
    let (c, _g) = cluster::shared();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let image = c.image_name("frozen");
    let mut a = start(
        dir.path(),
        &dir.path().join("owners"),
        c,
        &image,
        &["--size", "8M"],
    );
    let mut cl = Client::connect(&a.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 1), false)
        .unwrap_or_else(|e| panic!("{e}"));
    let pid = a.child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let dir_b = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let wait = ["--rbd-lock-wait-secs", "60"];
    let mut b = start(dir_b.path(), &dir_b.path().join("owners"), c, &image, &wait);
    let mut c2 = Client::connect(&b.sock).unwrap_or_else(|e| panic!("{e}"));
    c2.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("{e}"));
    drop(c2);
    assert_eq!(b.term(), Some(0), "{}", b.stderr_text());
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Only reads: the loss must be found by the dhrd itself. A bound on the wait, not a
    // timing assertion: the check runs every second.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match read_block(&mut cl, 0) {
            Err(NbdError::Errno(_)) => break true,
            Err(e) => panic!("the connection broke: {e}"),
            Ok(_) if Instant::now() > deadline => break false,
            Ok(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(
        refused,
        "a dhrd whose lock another client took still served RAM after 30 s:\n{}",
        a.stderr_text()
    );
    for _ in 0..3 {
        assert!(
            read_block(&mut cl, 0).is_err(),
            "a refused read was served again"
        );
    }
    drop(cl);
    a.kill9();
    remove_with_snapshots(c, &image);
}
