//! The RAM tier in place: files an application opens during the warm-up go first, a file
//! written after attach is pinned once it is closed, and a pinned file that is deleted
//! gives back its pin, its budget and its space (the pin's mapping would otherwise keep
//! the deleted file on the disk).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

fn free_bytes(p: &std::path::Path) -> u64 {
    let st = statvfs(p);
    st.0 * st.1
}

fn statvfs(p: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain old data; all zeroes is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct we own; the path is NUL-terminated.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_bfree, st.f_frsize)
}

/// `fsync` mode attached to `dir` and warm, with the watch's stall file (events wait while
/// it exists) at the returned path.
fn attach_warm_with_stall(s: &Scratch, dir: &std::path::Path) -> (Attach, std::path::PathBuf) {
    let stall = s.0.join("stall");
    let a = Attach::start_env(
        dir,
        &["--durability", "fsync"],
        &[("DHRD_FAULT_WATCH_STALL_FILE", stall.to_str().unwrap())],
    );
    a.wait_warm();
    (a, stall)
}

#[test]
fn opened_files_go_first_new_files_are_pinned_and_deleted_ones_let_go() {
    let s = Scratch::new("attach-resident");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..16 {
        std::fs::write(dir.join(format!("f{i:02}")), vec![i as u8; 1 << 20]).unwrap();
    }
    let (ok, out) = sh(&format!("sync -f {}", dir.display()));
    assert!(ok, "{out}");
    for i in 0..16 {
        let f = File::open(dir.join(format!("f{i:02}"))).unwrap();
        // SAFETY: fadvise on a descriptor we hold; a hint only.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    // A slow warm-up (1 MiB/s, one thread) reaches the directory's last entry last. The
    // walk goes in readdir order, which on ext4 is the order of a hash seeded per file
    // system, not the order of the names: ask the directory which entry that is.
    let last = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .last()
        .unwrap();
    let a = Attach::start(
        &dir,
        &[
            "--durability",
            "fsync",
            "--load-rate",
            "1M",
            "--loader-threads",
            "1",
        ],
    );
    let mut buf = [0u8; 16];
    File::open(dir.join(&last))
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    let st = a.wait_for("the opened file demanded", |s| {
        s["warmup"]["files_demanded"].as_u64() >= Some(1)
    });
    assert!(st["watch"]["demanded"].as_u64() >= Some(1), "{st}");
    drop(a);

    let a = Attach::start(&dir, &["--durability", "fsync"]);
    a.wait_warm();
    let st = a.wait_for("all pinned", |s| s["ram"]["pinned_files"] == 16);
    assert_eq!(st["ram"]["pinned_bytes"], 16 << 20);
    // Written after attach: pinned once closed (after the watch's and warm-up's delays).
    std::fs::write(dir.join("new"), vec![7u8; 2 << 20]).unwrap();
    a.wait_for("the new file pinned", |s| s["ram"]["pinned_files"] == 17);
    // Deleted: its pin, budget and blocks come back.
    let (ok, out) = sh(&format!("sync -f {}", dir.display()));
    assert!(ok, "{out}");
    let before = free_bytes(&dir);
    std::fs::remove_file(dir.join("f03")).unwrap();
    let st = a.wait_for("the deleted file let go", |s| {
        s["ram"]["pinned_files"] == 16
    });
    assert_eq!(st["ram"]["used_bytes"], (15 << 20) + (2 << 20), "{st}");
    let (ok, out) = sh(&format!("sync -f {}", dir.display()));
    assert!(ok, "{out}");
    let t = Instant::now();
    while free_bytes(&dir) < before + (1 << 20) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the deleted file's blocks stayed in use"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A name of a file with another one left: still pinned.
    std::fs::hard_link(dir.join("f04"), dir.join("f04-link")).unwrap();
    std::fs::remove_file(dir.join("f04")).unwrap();
    // Replaced by a rename over it: the old file has no name left, and is let go; the new
    // one is pinned after the delay (14 old files, the new one, and this one).
    std::fs::write(dir.join("tmp"), vec![9u8; 4096]).unwrap();
    std::fs::rename(dir.join("tmp"), dir.join("f05")).unwrap();
    // The new names (the link, the file renamed over f05) are handed on after the delay.
    a.wait_for("the new names handed on", |s| {
        s["watch"]["refreshed"] == 3 && s["watch"]["changed_waiting"] == 0
    });
    let st = a.wait_for("the file renamed over let go, its successor pinned", |s| {
        s["watch"]["forgotten"] == 2 && s["ram"]["pinned_files"] == 16
    });
    std::thread::sleep(Duration::from_millis(300));
    let st2 = a.status_json();
    assert_eq!(st2["watch"]["forgotten"], 2, "{st}\n{st2}");
    assert_eq!(st2["ram"]["pinned_files"], 16, "{st}\n{st2}");
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
}

/// The daemon's reads are not an application's: files it warms at attach, and files it
/// pins after they were written, keep the access times they had (O_NOATIME). Under
/// `relatime` the first read after a write sets it, which a mail reader takes for mail
/// read and a cleaner by access time for a file in use. In `sync` mode the warm-up reads
/// through an order-0 description of its own; in `fsync` mode a file over 2 MiB through
/// a mapping, whose `mmap` sets the access time too.
#[test]
fn warmed_and_pinned_files_keep_their_access_times() {
    for mode in ["sync", "fsync"] {
        let s = Scratch::new(&format!("attach-atime-{mode}"));
        let disk = LoopFs::new(&s);
        let dir = disk.mnt.join("data");
        std::fs::create_dir(&dir).unwrap();
        assert!(
            reads_set_atime(&dir),
            "the control: relatime on the test's ext4"
        );
        std::fs::write(dir.join("small"), vec![1u8; 64 << 10]).unwrap();
        std::fs::write(dir.join("big"), vec![2u8; (3 << 20) + 100]).unwrap();
        let (ok, out) = sh(&format!("sync -f {}", dir.display()));
        assert!(ok, "{out}");
        let mut aged = Vec::new();
        for name in ["small", "big"] {
            let p = dir.join(name);
            let f = File::open(&p).unwrap();
            // SAFETY: fadvise on a descriptor we hold; a hint only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            aged.push((p.clone(), age_atime(&p)));
        }
        let a = Attach::start(&dir, &["--durability", mode]);
        a.wait_warm();
        a.wait_for("the walked files pinned", |s| s["ram"]["pinned_files"] == 2);
        // Written after attach: pinned once closed and the delay is over.
        let new = dir.join("new");
        std::fs::write(&new, vec![3u8; (3 << 20) + 100]).unwrap();
        aged.push((new.clone(), age_atime(&new)));
        a.wait_for("the new file pinned", |s| s["ram"]["pinned_files"] == 3);
        for (p, t) in &aged {
            assert_eq!(
                atime(p),
                *t,
                "{mode}: dhrd set the access time of {}",
                p.display()
            );
        }
        let (ok, out) = a.detach();
        assert!(ok, "{out}");
    }
}

/// Files in a directory made after attach are pinned through the changed files' delay (as
/// any file written after attach), not by the warm-up the moment the directory is seen:
/// an extraction still writing them would pay for each pin on its own CPUs. The watch is
/// held back while the directory and its files are made, so no close of theirs reaches
/// the daemon (the directory's mark comes after them) and only the directory's walk can
/// find them; that they are counted as refreshed shows which way they went. The directory
/// itself is adopted (marked, walked) only after the same delay: it waits, counted, while
/// an extraction would still be filling it.
#[test]
fn files_of_a_directory_made_after_attach_are_pinned_after_the_delay() {
    let s = Scratch::new("attach-made-dir");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let (a, stall) = attach_warm_with_stall(&s, &dir);
    // The watch looks at the stall whenever it wakes, so events wait from here on;
    // `poke`, a directory made under the stall, is there for the removal checked last.
    std::fs::write(&stall, b"").unwrap();
    std::fs::create_dir(dir.join("poke")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::create_dir_all(dir.join("made/deeper")).unwrap();
    std::fs::write(dir.join("made/a"), vec![1u8; 1 << 20]).unwrap();
    std::fs::write(dir.join("made/deeper/b"), vec![2u8; 1 << 20]).unwrap();
    std::fs::remove_file(&stall).unwrap();
    // `poke` and `made` heard, neither marked yet (nor `deeper`, which only the walk of
    // `made` can find).
    let st = a.wait_for("the made directories waiting", |s| {
        s["watch"]["dirs_waiting"] == 2
    });
    assert_eq!(st["watch"]["dirs_marked"], 1, "{st}");
    assert_eq!(st["ram"]["pinned_files"], 0, "{st}");
    let st = a.wait_for("the made directory's files pinned", |s| {
        s["ram"]["pinned_files"] == 2
    });
    assert_eq!(st["ram"]["pinned_bytes"], 2 << 20, "{st}");
    assert_eq!(st["watch"]["refreshed"], 2, "{st}");
    assert_eq!(st["warmup"]["files_demanded"], 2, "{st}");
    // Each file handed on is followed by a mark of its own.
    assert_eq!(st["watch"]["dirs_marked"], 4, "{st}");
    assert_eq!(st["watch"]["dirs_waiting"], 0, "{st}");
    assert_eq!(st["watch"]["files_followed"], 2, "{st}");
    // A directory removed gives back its place among the marked ones.
    std::fs::remove_dir(dir.join("poke")).unwrap();
    a.wait_for("the removed directory unmarked", |s| {
        s["watch"]["dirs_marked"] == 3
    });
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
}

/// Files made in a burst cost one creation event per directory and period, not one each:
/// the directory stops hearing creations at the first it reads and is read again for
/// them a second later. Every file made meanwhile is pinned all the same, and so is a file
/// in a directory made meanwhile (which the read finds, as its creation went unheard), and
/// a file and a directory made meanwhile and renamed out of the muted directory before its
/// read (their rename within the tree is heard instead).
#[test]
fn a_burst_of_files_costs_one_event_and_every_file_is_pinned() {
    let s = Scratch::new("attach-burst");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir_all(dir.join("spool")).unwrap();
    let (a, stall) = attach_warm_with_stall(&s, &dir);
    // The first file's creation is read on its own (the watch held back until then), so
    // the rest are made with the directory muted whatever the daemon's timing.
    std::fs::write(&stall, b"").unwrap();
    std::fs::write(dir.join("spool/f000"), vec![1u8; 8192]).unwrap();
    std::fs::remove_file(&stall).unwrap();
    let st = a.wait_for("the spool muted", |s| s["watch"]["dirs_muted"] == 1);
    let events_muted = st["watch"]["events"].as_u64().unwrap();
    for i in 1..200 {
        std::fs::write(dir.join(format!("spool/f{i:03}")), vec![1u8; 8192]).unwrap();
    }
    std::fs::create_dir(dir.join("spool/sub")).unwrap();
    std::fs::write(dir.join("spool/sub/g"), vec![2u8; 8192]).unwrap();
    std::fs::write(dir.join("spool/moved"), vec![3u8; 8192]).unwrap();
    std::fs::rename(dir.join("spool/moved"), dir.join("moved")).unwrap();
    std::fs::create_dir(dir.join("spool/sub2")).unwrap();
    std::fs::write(dir.join("spool/sub2/h"), vec![4u8; 8192]).unwrap();
    std::fs::rename(dir.join("spool/sub2"), dir.join("sub2")).unwrap();
    let st = a.wait_for("every file of the burst pinned", |s| {
        s["ram"]["pinned_files"] == 203
    });
    assert!(st["watch"]["rescans"].as_u64().unwrap() >= 1, "{st}");
    // None of the files and directories made while muted was heard, only the two renames
    // (the files' own marks come with their pins, after they were closed).
    assert_eq!(
        st["watch"]["events"].as_u64().unwrap(),
        events_muted + 2,
        "{st}"
    );
    assert_eq!(st["watch"]["dirs_marked"], 4, "{st}");
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
}

/// A file or a directory renamed out of the tree is no longer dhrd's: its pins go, its
/// marks go (a directory leaves the marked set), and writing to it afterwards is not heard.
#[test]
fn files_and_directories_moved_out_are_let_go_and_no_longer_followed() {
    let s = Scratch::new("attach-moved-out");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    let out = disk.mnt.join("outside");
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    std::fs::create_dir(&out).unwrap();
    for p in ["a", "b", "sub/c", "sub/deeper/d"] {
        std::fs::write(dir.join(p), vec![1u8; 1 << 20]).unwrap();
    }
    let a = Attach::start(&dir, &["--durability", "fsync"]);
    a.wait_warm();
    let st = a.wait_for("all pinned", |s| s["ram"]["pinned_files"] == 4);
    assert_eq!(st["watch"]["dirs_marked"], 3, "{st}");

    std::fs::rename(dir.join("a"), out.join("a")).unwrap();
    let st = a.wait_for("the file moved out let go", |s| {
        s["ram"]["pinned_files"] == 3
    });
    assert_eq!(st["watch"]["moved_out"], 1, "{st}");
    std::fs::rename(dir.join("sub"), out.join("sub")).unwrap();
    let st = a.wait_for("the directory moved out let go", |s| {
        s["ram"]["pinned_files"] == 1
    });
    assert_eq!(st["watch"]["moved_out"], 2, "{st}");
    assert_eq!(st["watch"]["dirs_marked"], 1, "{st}");
    assert_eq!(st["ram"]["pinned_bytes"], 1 << 20, "{st}");

    // Written outside now: nothing of it reaches the watch's hand-on.
    let refreshed = st["watch"]["refreshed"].clone();
    for p in ["a", "sub/c", "sub/deeper/d"] {
        std::fs::write(out.join(p), vec![2u8; 4096]).unwrap();
    }
    std::fs::write(out.join("sub/new"), vec![3u8; 4096]).unwrap();
    // Past the changed files' delay, with room for the hand-on.
    std::thread::sleep(dhrd_pagecache::resident::CHANGED_DELAY + Duration::from_secs(1));
    let st = a.status_json();
    assert_eq!(st["watch"]["refreshed"], refreshed, "{st}");
    assert_eq!(st["watch"]["changed_waiting"], 0, "{st}");
    assert_eq!(st["ram"]["pinned_files"], 1, "{st}");
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
}
