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
use std::os::unix::fs::{FileExt, MetadataExt};
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
    let ino = fs::metadata(backing.join("f")).expect("stat f").ino();
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
    // One file failed, not the file system: status says which (by backing inode).
    assert!(
        st.contains(&format!("backing inode {ino} (that file only)")),
        "status must name the failed file, not the whole backing: {st}"
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

/// One block, aligned for O_DIRECT.
#[repr(align(4096))]
struct Block([u8; 4096]);

/// Opens `path` read-write with `flags` added.
fn open_with(path: &std::path::Path, flags: i32) -> fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .expect("open")
}

/// A write that syncs itself and fails must leave the file failed: every later fsync of
/// it, through any open, fails (C4). `flags`: how the file is opened for that write.
/// Returns the write's error, for the caller to look at.
fn a_failing_self_syncing_write(
    name: &str,
    mode: &str,
    journal: bool,
    flags: i32,
) -> std::io::Error {
    let s = Scratch::new(name);
    let (disk, backing, m) = bad_spot(&s, mode, journal);
    let w = open_with(&m.path("f"), flags);
    let other = open_with(&m.path("f"), 0);
    disk.fail_writes_to(&backing.join("f"));
    let err = w
        .write_all_at(&Block([7u8; 4096]).0, 0)
        .expect_err("the write's own sync must fail");
    // fdatasync first: it writes the inode only for a changed size, so only the data's
    // writeback error can make it fail.
    let r_other = other.sync_data();
    let r_own = w.sync_data();
    let r_again = other.sync_all();
    let st = m.status();
    drop((w, other));
    teardown(m);
    assert!(
        r_other.is_err() && r_own.is_err() && r_again.is_err(),
        "after a self-syncing write failed ({err}), an fsync reported success for data the \
         disk never got: other open {r_other:?}, own open {r_own:?}, again {r_again:?}"
    );
    assert!(
        st.contains("read-only:") && !st.contains("read-only:       no"),
        "status must report the failure: {st}"
    );
    err
}

/// A write the daemon serves (an O_DIRECT open) with RWF_DSYNC, whose own sync takes the
/// writeback error. The failure injected here fails the device write with ENOSPC (the
/// loop device's image has no room), which reaches the application as ENOSPC although
/// it is a sync's error: the pages are lost, so it must be sticky like any other (C4),
/// and not taken for a C5 ENOSPC of the write itself, which changes nothing. In `fsync`
/// mode ext4 reports the failure to the daemon's next fsync by another route as well
/// (a journal commit, or the mapping's error flag), so this passed before the daemon
/// wrote through a description of its own; the `sync` mode case below did not.
#[test]
fn a_daemon_served_o_dsync_write_whose_sync_fails_fails_every_later_fsync() {
    let flags = libc::O_DIRECT | libc::O_DSYNC;
    let err = a_failing_self_syncing_write("wberr-dsync-daemon", "fsync", true, flags);
    eprintln!("the daemon-served O_DSYNC write failed with: {err}");
}

/// The same through an open the kernel serves by passthrough: the write never reaches
/// the daemon. The kernel opens its own description of the backing file for every
/// passthrough open, so the write's sync takes the error on that description only; the
/// daemon's fsync, on its own description, sees the error as well.
#[test]
fn a_passthrough_o_dsync_write_whose_sync_fails_fails_every_later_fsync() {
    let err = a_failing_self_syncing_write("wberr-dsync-pt", "fsync", true, libc::O_DSYNC);
    eprintln!("the passthrough O_DSYNC write failed with: {err}");
}

/// `sync` mode: a plain open's writes are passthrough writes made synchronous by the
/// backing inode's sync flag.
#[test]
fn a_passthrough_write_in_sync_mode_whose_sync_fails_fails_every_later_fsync() {
    let err = a_failing_self_syncing_write("wberr-sync-pt", "sync", true, 0);
    eprintln!("the passthrough write in sync mode failed with: {err}");
}

/// `sync` mode: an O_DIRECT open's writes are served by the daemon with RWF_DSYNC. Its
/// fsync of a clean file asks the backing file only for its writeback error and commits
/// the journal. Before, the write and that question used one description: the write's
/// sync took the error, the ENOSPC was taken for C5's, and every fsync succeeded.
#[test]
fn a_daemon_served_write_in_sync_mode_whose_sync_fails_fails_every_later_fsync() {
    let err = a_failing_self_syncing_write("wberr-sync-daemon", "sync", true, libc::O_DIRECT);
    eprintln!("the daemon-served write in sync mode failed with: {err}");
}

/// Files opened and closed after the failing write, to push its registration out of the
/// idle ones kept (`page::LINGER_MAX`, 1,024) with room to spare.
const OTHER_FILES: usize = dhrd_fuse::page::LINGER_MAX * 2;

/// A self-syncing write fails (`flags`, `mode` as above) and its file is closed before
/// any sync of it through the mount ran, so the error is only reported to the daemon's
/// descriptor of the inode, not yet recorded. Then enough other files are opened and
/// closed for the daemon to drop its idle registration of the file. A later open must
/// still see the failure: its first fsync fails, and every one from then on with EIO
/// (C4). Before, the registration's
/// descriptor was closed with the error unseen; the next open got a new one that sampled
/// the error sequence after the error, and its fsyncs all succeeded.
fn a_failure_outlives_its_dropped_registration(name: &str, mode: &str, flags: i32) {
    let s = Scratch::new(name);
    let disk = FaultyDisk::new(&s, true);
    let backing = disk.mnt().join("backing");
    fs::create_dir_all(&backing).expect("backing");
    fs::write(backing.join("f"), vec![1u8; 65536]).expect("f");
    for i in 0..OTHER_FILES {
        fs::write(backing.join(format!("o{i}")), b"").expect("other file");
    }
    fs::File::open(backing.join("f"))
        .and_then(|f| f.sync_all())
        .expect("allocate f");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", mode]);
    let w = open_with(&m.path("f"), flags);
    // The first fsync after a mount is a syncfs of the backing (docs/crash-model.md),
    // which would fail the whole mount later and hide what this test looks at.
    w.sync_all().expect("fsync before the fault");
    disk.fail_writes_to(&backing.join("f"));
    let err = w
        .write_all_at(&Block([7u8; 4096]).0, 0)
        .expect_err("the write's own sync must fail");
    drop(w);
    for i in 0..OTHER_FILES {
        drop(fs::File::open(m.path(&format!("o{i}"))).expect("open other file"));
    }
    let g = open_with(&m.path("f"), 0);
    let r_first = g.sync_data();
    let r_again = g.sync_all();
    let h = open_with(&m.path("f"), 0);
    let r_other = h.sync_all();
    let st = m.status();
    drop((g, h));
    teardown(m);
    let eio = |r: &std::io::Result<()>| {
        r.as_ref()
            .err()
            .is_some_and(|e| e.raw_os_error() == Some(libc::EIO))
    };
    // The first fsync reports the error it took (ENOSPC here); every later one EIO.
    assert!(
        r_first.is_err() && eio(&r_again) && eio(&r_other),
        "after a self-syncing write failed ({err}) and its registration was dropped, an \
         fsync reported success: first {r_first:?}, again {r_again:?}, another open \
         {r_other:?}"
    );
    assert!(
        st.contains("read-only:") && !st.contains("read-only:       no"),
        "status must report the failure: {st}"
    );
    // The file failed, not the whole mount: no syncfs ran to catch the error.
    assert!(
        !st.contains("syncfs:"),
        "the failure was only caught by a syncfs of the backing: {st}"
    );
}

/// Passthrough: the write's error went to the kernel's description of the open only.
#[test]
fn a_passthrough_write_failure_outlives_its_dropped_registration() {
    a_failure_outlives_its_dropped_registration("wberr-drop-pt", "fsync", libc::O_DSYNC);
}

/// Daemon-served: the write returned ENOSPC (C5 does not record it), its sync lost pages.
#[test]
fn a_daemon_served_write_failure_outlives_its_dropped_registration() {
    let flags = libc::O_DIRECT | libc::O_DSYNC;
    a_failure_outlives_its_dropped_registration("wberr-drop-daemon", "fsync", flags);
}

/// Read errors of the backing's device during the warm-up (`common::read_fault`): the mount
/// stays up and serves, status counts the failed reads and says so, and once the device
/// reads again the file is read again (after the retry delay), pinned and intact. The file
/// is over 2 MiB: in `fsync` mode the warm-up reads it through the populating mapping.
#[test]
fn warm_up_reads_that_fail_are_retried_and_the_file_pinned_once_the_device_reads() {
    let s = Scratch::new("eio-warm-up");
    let disk = common::read_fault::ReadFaultFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir(&backing).unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) + 100).map(|i| (i % 251) as u8).collect();
    fs::write(backing.join("f"), &data).unwrap();
    disk.uncache(&[&backing.join("f")]);
    disk.fail_reads(true);
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    m.wait_for("the read failed", |st| {
        st["warmup"]["read_errors"].as_u64() >= Some(1)
    });
    assert!(m.status().contains("failed reads"), "{}", m.status());
    disk.fail_reads(false);
    let st = m.wait_for("pinned after a retry", |st| st["ram"]["pinned_files"] == 1);
    assert_eq!(st["warmup"]["files_failed"], 0, "{st}");
    assert!(fs::read(m.path("f")).unwrap() == data);
    drop(m);
}
