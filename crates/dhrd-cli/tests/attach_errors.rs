//! `dhrd attach` refuses what it cannot hold, with a message that names what is missing
//! and the alternative, and changes nothing before it refuses: a missing directory, a
//! file, tmpfs, a FUSE mount (a dhrd mount), the backing directory of a running mount, a
//! directory attached already, and one above an attached directory. Checks of file
//! systems this machine cannot mount (NFS, xfs subdirectories) are unit tests of
//! `dhrd_attach::check`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::path::Path;

/// What an attach could have changed on `dir` and its file system.
fn fingerprint(dir: &Path, mnt: &Path) -> (Option<String>, i32, String) {
    (record_of(dir), flags_of(dir), super_options(mnt))
}

#[test]
fn bad_directories_are_refused_with_what_is_missing() {
    let s = Scratch::new("attach-bad");
    let missing = s.0.join("nope");
    let m = refused(&[missing.to_str().unwrap()]);
    assert!(m.contains("no such directory"), "{m}");
    let file = s.0.join("file");
    std::fs::write(&file, b"x").unwrap();
    let m = refused(&[file.to_str().unwrap()]);
    assert!(m.contains("is not a directory"), "{m}");

    let tmp = s.sub("tmpfs");
    let (ok, out) = sh(&format!("mount -t tmpfs dhrd-test {}", tmp.display()));
    assert!(ok, "{out}");
    let before = (record_of(&tmp), super_options(&tmp));
    for mode in ["sync", "fsync"] {
        let m = refused(&[tmp.to_str().unwrap(), "--durability", mode]);
        assert!(
            m.contains("tmpfs") && m.contains("power cut") && m.contains("dhrd mount"),
            "{m}"
        );
    }
    assert_eq!((record_of(&tmp), super_options(&tmp)), before);
    let _ = sh(&format!("umount {}", tmp.display()));

    // proc keeps no xattrs, so no record of an attach: refused by the watch, and a detach
    // says it is not attached rather than failing to read a record.
    let m = refused(&["/proc", "--durability", "fsync"]);
    assert!(m.contains("fanotify cannot watch"), "{m}");
    let out = std::process::Command::new(dhrd())
        .args(["detach", "/proc"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not attached"),
        "{err}"
    );
}

#[test]
fn a_dhrd_mount_its_backing_and_an_attached_directory_are_refused_naming_the_holder() {
    let s = Scratch::new("attach-held");
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    std::fs::create_dir(&backing).unwrap();
    std::fs::write(backing.join("f"), b"data").unwrap();
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let msg = refused(&[mnt.to_str().unwrap()]);
    assert!(
        msg.contains("dhrd mount") && msg.contains(&format!("pid {}", m.pid())),
        "the mount point: {msg}"
    );
    let before = fingerprint(&backing, &disk.mnt);
    let msg = refused(&[backing.to_str().unwrap()]);
    assert!(
        msg.contains("held already")
            && msg.contains(&format!("pid {}", m.pid()))
            && msg.contains("mount"),
        "the backing directory: {msg}"
    );
    assert_eq!(
        fingerprint(&backing, &disk.mnt),
        before,
        "changed before refusing"
    );
    drop(m);

    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let a = Attach::start(&dir, &["--durability", "sync"]);
    let msg = refused(&[dir.to_str().unwrap()]);
    assert!(
        msg.contains("held already")
            && msg.contains(&format!("pid {}", a.pid()))
            && msg.contains("attach"),
        "a second attach: {msg}"
    );
    // The file system root is above it: refused before the remount it would make.
    let before = fingerprint(&disk.mnt, &disk.mnt);
    let msg = refused(&[disk.mnt.to_str().unwrap()]);
    assert!(
        msg.contains("overlaps") && msg.contains(&format!("pid {}", a.pid())),
        "{msg}"
    );
    assert_eq!(
        fingerprint(&disk.mnt, &disk.mnt),
        before,
        "changed before refusing"
    );
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    assert_eq!(record_of(&dir), None, "the record outlived the detach");
}

/// A file system mounted inside DIR is not DIR's: attach neither warms nor keeps its files
/// durable, and says so (in the status, text and JSON, and at start), instead of claiming
/// the mode for every file under DIR.
#[test]
fn file_systems_mounted_inside_are_named_and_not_held() {
    let s = Scratch::new("attach-inside");
    let dir = s.sub("data");
    std::fs::write(dir.join("outer"), b"held").unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (ok, out) = sh(&format!(
        "mount -t tmpfs dhrd-test-inside {}",
        sub.display()
    ));
    assert!(ok, "{out}");
    std::fs::write(sub.join("inner"), b"not held").unwrap();
    let a = Attach::start(&dir, &["--durability", "fsync"]);
    let st = a.wait_warm();
    let inside = st["mounts_inside"].as_array().cloned().unwrap_or_default();
    assert_eq!(inside.len(), 1, "{st}");
    assert_eq!(inside[0]["fstype"], "tmpfs");
    assert_eq!(inside[0]["path"], sub.display().to_string());
    assert_eq!(
        st["warmup"]["files_seen"], 1,
        "the walk went into the mount: {st}"
    );
    let text = a.status_text();
    assert!(
        text.contains("not held:") && text.contains(&format!("{} (tmpfs)", sub.display())),
        "{text}"
    );
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    let _ = sh(&format!("umount {}", sub.display()));
}
