//! `sync` in place: every write is on the device when it returns (cachestat(2) finds no
//! page of the file dirty or under writeback right after), for a file created in the
//! directory, one renamed in, and one whose sync flag someone cleared; and detach undoes
//! exactly what attach changed.
//!
//! Where the directory is the root of its file system (dhrd mounts it `sync`) that holds
//! with no window. In a subdirectory (inode flags) a file renamed in and a cleared flag
//! are repaired after the fact: the tests hold the repair back (fault injection) and show
//! the write that is not durable in between, then the repair, as docs/crash-model.md
//! states.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writes 8 KiB at `off` through a plain open and returns the file's unwritten pages
/// right after the write returned.
fn write_and_look(p: &Path, off: u64) -> Option<u64> {
    let f = OpenOptions::new().read(true).write(true).open(p).unwrap();
    f.write_all_at(&[0x5a; 8192], off).unwrap();
    unwritten_pages(&f)
}

fn durable_on_return(p: &Path, what: &str) {
    for i in 0..4 {
        match write_and_look(p, i * 8192) {
            Some(n) => assert_eq!(n, 0, "{what}: write {i} left {n} pages unwritten"),
            None => dhrd_testkit::skip("no cachestat(2): cannot see unwritten pages"),
        }
    }
}

fn chattr(args: &str, p: &Path) {
    let (ok, out) = sh(&format!("chattr {args} {}", p.display()));
    assert!(ok, "chattr: {out}");
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn at_the_root_of_a_file_system_every_write_is_durable_on_return_with_no_window() {
    let s = Scratch::new("attach-sync-root");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.clone();
    std::fs::create_dir(dir.join("a")).unwrap();
    std::fs::write(dir.join("a/old"), vec![1u8; 32768]).unwrap();
    assert!(!super_options(&dir).split(',').any(|o| o == "sync"));
    let a = Attach::start(&dir, &["--durability", "sync"]);
    assert!(
        super_options(&dir).split(',').any(|o| o == "sync"),
        "not remounted sync"
    );
    let st = a.status_json();
    assert_eq!(st["sync_by"], "mount_option", "{st}");
    // Created in the directory.
    std::fs::write(dir.join("new"), vec![0u8; 32768]).unwrap();
    durable_on_return(&dir.join("new"), "created");
    // Renamed (from elsewhere in the file system: here all of it is the directory).
    std::fs::rename(dir.join("a/old"), dir.join("moved")).unwrap();
    durable_on_return(&dir.join("moved"), "renamed");
    // A cleared flag changes nothing: the file system is synchronous.
    chattr("-S", &dir.join("moved"));
    durable_on_return(&dir.join("moved"), "flag cleared");
    assert!(a.status_json()["page_cache"]["dirty_bytes"] == 0);
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    assert!(
        !super_options(&dir).split(',').any(|o| o == "sync"),
        "sync left after detach: {}",
        super_options(&dir)
    );
    assert_eq!(record_of(&dir), None);
}

#[test]
fn a_file_system_mounted_sync_before_stays_sync_after_detach() {
    let s = Scratch::new("attach-sync-before");
    let disk = LoopFs::new(&s);
    let (ok, out) = sh(&format!("mount -o remount,sync {}", disk.mnt.display()));
    assert!(ok, "{out}");
    let a = Attach::start(&disk.mnt, &["--durability", "sync"]);
    assert_eq!(a.status_json()["sync_option_before"], true);
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    assert!(
        super_options(&disk.mnt).split(',').any(|o| o == "sync"),
        "not dhrd's to clear"
    );
}

#[test]
fn in_a_subdirectory_flags_hold_and_moves_in_and_cleared_flags_are_repaired() {
    let s = Scratch::new("attach-sync-flags");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    let out = disk.mnt.join("outside");
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&out).unwrap();
    std::fs::write(dir.join("before"), vec![1u8; 32768]).unwrap();
    let stall = s.0.join("stall");
    let a = Attach::start_env(
        &dir,
        &["--durability", "sync"],
        &[
            ("DHRD_FAULT_WATCH_STALL_FILE", stall.to_str().unwrap()),
            ("DHRD_FAULT_AUDIT_INTERVAL_MS", "3600000"),
        ],
    );
    let st = a.status_json();
    assert_eq!(st["sync_by"], "inode_flags");
    assert!(has_sync_flag(&dir) && has_sync_flag(&dir.join("before")));
    durable_on_return(&dir.join("before"), "there before");
    // Created in the directory: inherits the flag the moment it exists.
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/new"), vec![0u8; 32768]).unwrap();
    durable_on_return(&dir.join("sub/new"), "created");

    // Renamed in from outside, with the repair held back: the window.
    std::fs::write(out.join("f"), vec![2u8; 32768]).unwrap();
    File::open(out.join("f")).unwrap().sync_all().unwrap();
    std::fs::write(&stall, b"").unwrap();
    std::fs::rename(out.join("f"), dir.join("moved")).unwrap();
    if let Some(n) = write_and_look(&dir.join("moved"), 0) {
        assert!(
            n > 0,
            "a write to a file renamed in was durable before its repair"
        );
    }
    File::open(dir.join("moved")).unwrap().sync_all().unwrap();
    std::fs::remove_file(&stall).unwrap();
    wait_until("the moved-in file's flag", || {
        has_sync_flag(&dir.join("moved"))
    });
    durable_on_return(&dir.join("moved"), "renamed in, repaired");

    // A directory moved in: it and what is in it get their flags.
    std::fs::create_dir_all(out.join("tree/deep")).unwrap();
    std::fs::write(out.join("tree/deep/g"), vec![3u8; 8192]).unwrap();
    std::fs::rename(out.join("tree"), dir.join("tree")).unwrap();
    wait_until("the moved-in tree's flags", || {
        has_sync_flag(&dir.join("tree/deep/g"))
    });
    durable_on_return(&dir.join("tree/deep/g"), "in a directory moved in");
    std::fs::write(dir.join("tree/deep/h"), vec![4u8; 8192]).unwrap();
    durable_on_return(&dir.join("tree/deep/h"), "created in a directory moved in");
    drop(a);

    // A cleared flag sends no event: the audit finds it.
    let a = Attach::start_env(
        &dir,
        &["--durability", "sync"],
        &[("DHRD_FAULT_AUDIT_INTERVAL_MS", "200")],
    );
    chattr("-S", &dir.join("before"));
    File::open(dir.join("before")).unwrap().sync_all().unwrap();
    let window = write_and_look(&dir.join("before"), 0);
    if let Some(n) = window {
        // The audit may have come between the chattr and the write; only then is it 0.
        assert!(
            n > 0 || has_sync_flag(&dir.join("before")),
            "cleared flag: {n}"
        );
    }
    wait_until("the audit's repair", || has_sync_flag(&dir.join("before")));
    durable_on_return(&dir.join("before"), "flag cleared, repaired");
    let st = a.status_json();
    assert!(st["sync_flags"]["repaired"].as_u64().unwrap() >= 1, "{st}");
    let (ok, text) = a.detach();
    assert!(ok, "{text}");
    // Detach clears what dhrd set and what inherited it, and the record.
    for p in [
        "",
        "before",
        "sub",
        "sub/new",
        "moved",
        "tree",
        "tree/deep/g",
        "tree/deep/h",
    ] {
        assert!(!has_sync_flag(&dir.join(p)), "{p}: flag left after detach");
    }
    assert_eq!(record_of(&dir), None);
}

/// A daemon killed leaves its changes (durable still); the next attach in another mode
/// knows them for its own and undoes them, and so does a detach without a daemon.
#[test]
fn what_a_killed_daemon_left_is_undone_by_the_next_attach_or_a_detach() {
    let s = Scratch::new("attach-sync-orphan");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f"), b"x").unwrap();
    Attach::start(&dir, &["--durability", "sync"]).kill9();
    assert!(
        has_sync_flag(&dir.join("f")),
        "the flag stays after a SIGKILL"
    );
    assert!(record_of(&dir).is_some());
    let a = Attach::start(&dir, &["--durability", "fsync"]);
    assert!(
        !has_sync_flag(&dir.join("f")),
        "fsync mode clears the flags dhrd left"
    );
    a.kill9();
    Attach::start(&disk.mnt, &["--durability", "sync"]).kill9();
    assert!(super_options(&disk.mnt).split(',').any(|o| o == "sync"));
    let o = std::process::Command::new(common::dhrd())
        .arg("detach")
        .arg(&disk.mnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!super_options(&disk.mnt).split(',').any(|o| o == "sync"));
    assert_eq!(record_of(&disk.mnt), None);
}

/// `dhrd detach DIR` returns only once the daemon holds nothing of the file system: a
/// single `umount` right after it succeeds (no retry). The daemon is the test's child, so
/// the test does not reap it first: a zombie holds no files, a live process would.
#[test]
fn the_file_system_is_free_when_detach_returns() {
    let s = Scratch::new("attach-detach-umount");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f"), vec![7u8; 1 << 20]).unwrap();
    let mut a = Attach::start(&dir, &["--durability", "sync"]);
    a.wait_warm();
    let o = std::process::Command::new(common::dhrd())
        .arg("detach")
        .arg(&dir)
        .output()
        .expect("detach");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, out) = sh(&format!("umount {}", disk.mnt.display()));
    let child = a.child.take();
    if let Some(mut c) = child {
        let _ = c.wait();
    }
    assert!(ok, "umount right after detach: {out}");
    let (ok, out) = sh(&format!(
        "mount -o loop {} {}",
        disk.img.display(),
        disk.mnt.display()
    ));
    assert!(ok, "mount again for the cleanup: {out}");
}
