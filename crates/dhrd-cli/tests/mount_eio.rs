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

/// A disk with a bad spot under file `f` (64 KiB, allocated), and a mount of it.
fn bad_spot(s: &Scratch, mode: &str, journal: bool) -> (FaultyDisk, std::path::PathBuf, Mount) {
    let disk = FaultyDisk::new(s, journal);
    let backing = disk.mnt().join("backing");
    fs::create_dir_all(&backing).expect("backing");
    fs::write(backing.join("f"), vec![1u8; 65536]).expect("f");
    fs::File::open(backing.join("f"))
        .and_then(|f| f.sync_all())
        .expect("allocate f");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", mode]);
    (disk, backing, m)
}

/// Unmounts after a failure (the daemon's unmount-time sync fails: its exit status says
/// so).
fn teardown(m: Mount) {
    let _ = Command::new(dhrd()).arg("umount").arg(&m.mnt).output();
    drop(m);
}

/// Two open file descriptions of one file whose dirty pages both failed writeback: each
/// must see the error at its next fsync (as ext4 reports it to each of its own opens), and
/// later fsyncs must not report success for data the disk never got (C4). Before, the
/// daemon fsync'ed one shared descriptor of the backing file, so the first fsync took the
/// error and the second returned 0.
#[test]
fn a_writeback_error_reaches_every_open_at_its_next_fsync_and_stays() {
    let s = Scratch::new("wberr-fsync");
    let (disk, backing, m) = bad_spot(&s, "fsync", false);
    let open = || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("f"))
            .expect("open")
    };
    let (a, b) = (open(), open());
    a.write_all_at(&[2u8; 4096], 0).expect("write a");
    b.write_all_at(&[3u8; 4096], 8192).expect("write b");
    disk.fail_writes_to(&backing.join("f"));
    let ra = a.sync_all();
    let rb = b.sync_all();
    let ra_again = a.sync_all();
    let rb_again = b.sync_all();
    drop((a, b));
    let st = m.status();
    teardown(m);
    assert!(ra.is_err(), "the first fsync missed the failed writeback");
    assert!(
        rb.is_err(),
        "the second open's fsync reported success: {ra:?} then {rb:?}"
    );
    assert!(
        ra_again.is_err() && rb_again.is_err(),
        "a later fsync reported success for data the disk never got: {ra_again:?} {rb_again:?}"
    );
    assert!(
        st.contains("read-only:") && !st.contains("read-only:       no"),
        "status must report the failure: {st}"
    );
}

/// `sync` mode: stores into a shared mapping whose writeback failed before the
/// application's fsync (the page is clean again, its bytes never reached the disk) must
/// make that fsync fail. Before, the daemon saw no dirty page and only committed the
/// journal, never asking the file for its writeback error.
#[test]
fn a_failed_writeback_of_mapped_stores_fails_the_fsync_in_sync_mode() {
    let s = Scratch::new("wberr-mmap");
    let (disk, backing, m) = bad_spot(&s, "sync", true);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .expect("open");
    let map = SharedMap::new(&f, 65536);
    map.fill(0, 9, 4096);
    disk.fail_writes_to(&backing.join("f"));
    // The kernel's writeback of the page, before the application asks (here forced by
    // another open of the backing file, which sees the failure itself).
    let other = fs::File::open(backing.join("f")).expect("open backing");
    assert!(other.sync_data().is_err(), "the fault did not fire");
    let r = f.sync_all();
    drop(map);
    drop((f, other));
    teardown(m);
    assert!(
        r.is_err(),
        "fsync after a failed writeback of mapped stores succeeded"
    );
}
