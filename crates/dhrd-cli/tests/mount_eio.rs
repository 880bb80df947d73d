//! The backing disk fails under a mounted dhrd: the backing directory lives on an ext4 file
//! system (a loop device over a file), which the test shuts down with the
//! `EXT4_IOC_SHUTDOWN` ioctl, after which every I/O to it fails with EIO, as on a dead disk.
//! No device-mapper is needed. Expected (C4): the write that hits the error gets EIO, the
//! mount reports the read-only state with its cause in `dhrd status`, every write
//! acknowledged before the failure is on the disk, and the daemon unmounts cleanly.
//!
//! Reads after the failure differ by data path. The engine keeps serving them from its own
//! RAM copy. On the page cache path the kernel reads through the backing file system,
//! which refuses every read once shut down, so reads fail with EIO too (docs/crash-model.md).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::FileExt;
use std::process::Command;

#[test]
fn backing_eio_makes_the_mount_read_only() {
    eio("pagecache");
}

#[test]
fn backing_eio_makes_the_file_read_only_and_reads_continue_from_ram_on_the_engine() {
    eio("engine-direct");
}

fn eio(read_path: &str) {
    let s = Scratch::new(&format!("eio-{read_path}"));
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    let before: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 253) as u8).collect();
    fs::write(backing.join("f"), &before).expect("f");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    m.wait_loaded();

    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .expect("open");
    // Acknowledged before the failure: must stay readable afterwards.
    let acked = vec![0xA5u8; 8192];
    f.write_all_at(&acked, 4096)
        .expect("write before the failure");

    disk.shut_down();

    let err = f
        .write_all_at(&[0x5Au8; 4096], 65536)
        .expect_err("a write after the disk died must fail");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // Sticky: the next write fails too, without touching the backing.
    let err2 = f
        .write_all_at(&[1u8; 10], 0)
        .expect_err("writes stay refused");
    assert!(
        matches!(err2.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)),
        "{err2}"
    );

    let mut want = before.clone();
    want[4096..4096 + 8192].copy_from_slice(&acked);
    let mut got = vec![0u8; before.len()];
    if read_path == "engine-direct" {
        // Reads continue from RAM, with the acknowledged data and nothing of the failed
        // write.
        f.read_exact_at(&mut got, 0)
            .expect("read after the failure");
        assert!(got == want, "data after the failure differs");
    } else {
        let err = f
            .read_exact_at(&mut got, 0)
            .expect_err("the backing file system refuses reads once shut down");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    drop(f);

    let st = m.status();
    assert!(
        st.contains("read-only:") && !st.contains("read-only:       no"),
        "status must report the read-only state: {st}"
    );
    assert!(
        st.to_lowercase().contains("input/output error") || st.contains("EIO"),
        "status must say why: {st}"
    );

    // The daemon still unmounts and exits (its exit status reports the failed flush).
    let out = Command::new(dhrd())
        .arg("umount")
        .arg(&mnt)
        .output()
        .expect("umount");
    drop(m);
    assert!(!is_mounted(&mnt), "umount: {:?}", out);
    // What was acknowledged is on the disk: remount the file system and look.
    drop(disk);
    let img = s.0.join("disk.img");
    let check = s.sub("check");
    let (ok, out) = sh(&format!(
        "mount -o loop {} {}",
        img.display(),
        check.display()
    ));
    assert!(ok, "remount: {out}");
    let on_disk = fs::read(check.join("backing/f"));
    let _ = Command::new("umount").arg("-d").arg(&check).status();
    assert!(
        on_disk.expect("f on the disk") == want,
        "an acknowledged write is lost"
    );
}
