//! Many files: the daemon's memory and descriptors stay bounded however many files are
//! read (the full 500k-file run is in bench/fuse/startup.sh), every file of a tree is in
//! RAM after the warm-up and pinned there, and nothing is ever served stale.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs;
use std::os::fd::AsFd;

const FILES: usize = 3000;
// The test must overflow the engine's object cache to show it is bounded.
const _: () = assert!(FILES > dhrd_fuse::engine::objects::CLOSED_OBJECTS_MAX);

fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Reads every file three times through a mount on `read_path`; RSS must stay flat and
/// descriptors bounded: by the object cache on the engine path, by the open files (none
/// between reads) and the idle registrations kept for reopening on the page cache path.
fn memory_and_descriptors_stay_bounded(read_path: &str, fds_max: usize) {
    let s = Scratch::new(&format!("scale-{read_path}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    for d in 0..(FILES / 500) {
        let dir = backing.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..500 {
            fs::write(dir.join(format!("f{i}")), format!("{d}/{i}").repeat(64)).unwrap();
        }
    }
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    let pid = m.pid();
    let read_all = || {
        let mut n = 0;
        for d in 0..(FILES / 500) {
            for i in 0..500 {
                let got = fs::read(mnt.join(format!("d{d}/f{i}"))).unwrap();
                assert_eq!(got, format!("{d}/{i}").repeat(64).into_bytes());
                n += 1;
            }
        }
        n
    };
    assert_eq!(read_all(), FILES);
    let rss1 = rss_kib(pid);
    assert_eq!(read_all(), FILES);
    assert_eq!(read_all(), FILES);
    let rss2 = rss_kib(pid);
    // The kernel sends RELEASE after close(2) returns, so the last files' releases may
    // still be on their way (their objects open, three descriptors each): the bound is
    // the count once they are in, waited for up to 10 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut nfd = fds(pid);
    while nfd >= fds_max && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        nfd = fds(pid);
    }
    eprintln!(
        "{read_path}: daemon RSS {rss1} KiB -> {rss2} KiB, {nfd} descriptors for {FILES} files"
    );
    assert!(
        rss2 < rss1 + 64 * 1024,
        "{read_path}: RSS grew from {rss1} KiB to {rss2} KiB while files churned"
    );
    assert!(nfd < fds_max, "{read_path}: {nfd} descriptors, not bounded");
    drop(m);
}

#[test]
fn thousands_of_files_keep_memory_and_descriptors_bounded() {
    // Idle registrations are kept for the next open of their files, up to LINGER_MAX.
    memory_and_descriptors_stay_bounded("pagecache", dhrd_fuse::page::LINGER_MAX + 64);
}

#[test]
fn thousands_of_files_keep_memory_and_descriptors_bounded_on_the_engine() {
    memory_and_descriptors_stay_bounded(
        "engine-direct",
        3 * dhrd_fuse::engine::objects::CLOSED_OBJECTS_MAX + 64,
    );
}

/// Bytes of a backing file in the page cache.
fn cached(path: &std::path::Path) -> u64 {
    let f = fs::File::open(path).unwrap();
    dhrd_pagecache::cachestat(f.as_fd(), 0, 0)
        .unwrap()
        .0
        .cached_bytes()
}

/// Every file of the tree is read into the page cache by the warm-up and pinned there
/// (evicting the cache does not touch it), and nothing is ever stale: the page cache is
/// the backing file's own, so a write through the mount, a change on the backing, an
/// unlink with its inode number reused, and a remount all read what the backing holds.
#[test]
fn every_file_is_warm_and_pinned_and_never_stale() {
    let s = Scratch::new("warm");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let mut want: Vec<Vec<u8>> = (0..FILES)
        .map(|i| format!("file {i} gen 0;").repeat(20 + i % 7).into_bytes())
        .collect();
    for (i, w) in want.iter().enumerate() {
        fs::write(backing.join(format!("f{i}")), w).unwrap();
    }
    // Out of the page cache, so the warm-up has to read them.
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let st = m.status();
    assert!(st.contains(&format!("{FILES} of {FILES} files")), "{st}");
    assert!(
        st.contains(&format!("in {FILES} files of a")),
        "not all pinned: {st}"
    );
    // Pinned: dropping the page cache leaves every byte of every file in RAM.
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    for (i, w) in want.iter().enumerate() {
        let c = cached(&backing.join(format!("f{i}")));
        assert!(c >= w.len() as u64, "f{i}: {c} bytes cached of {}", w.len());
    }
    let read_all = |want: &[Vec<u8>]| {
        for (i, w) in want.iter().enumerate() {
            let got = fs::read(mnt.join(format!("f{i}"))).unwrap();
            assert!(got == *w, "f{i}: {:?}", String::from_utf8_lossy(&got));
        }
    };
    read_all(&want);
    // Reads are the kernel's: none reached the daemon.
    assert_eq!(m.status_count("reads (daemon):"), 0, "{}", m.status());

    // Written through the mount with the same length and its old mtime put back (as
    // `cp -p` or rsync do).
    let old_mtime = fs::metadata(backing.join("f0"))
        .unwrap()
        .modified()
        .unwrap();
    want[0] = String::from_utf8_lossy(&want[0])
        .replace("gen 0", "GEN 1")
        .into_bytes();
    {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("f0"))
            .unwrap();
        std::io::Write::write_all(&mut &f, &want[0]).unwrap();
        f.set_modified(old_mtime).unwrap();
    }
    want[1] = b"shorter".to_vec();
    fs::write(mnt.join("f1"), &want[1]).unwrap();
    read_all(&want);
    // Changed on the backing while not open through the mount, same length.
    want[2] = want[2].iter().map(|b| b.to_ascii_uppercase()).collect();
    fs::write(backing.join("f2"), &want[2]).unwrap();
    // Unlinked, and a new file likely to reuse the inode number.
    fs::remove_file(mnt.join("f3")).unwrap();
    want[3] = b"a new file under the old name".to_vec();
    fs::write(mnt.join("f3"), &want[3]).unwrap();
    read_all(&want);
    drop(m);

    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    read_all(&want);
    drop(m);
}

/// The engine path keeps objects of closed files in a bounded cache; one whose file
/// changed while nobody had it open (size or mtime differ) is reloaded, never served
/// stale, also when a same-size write put the old mtime back through the mount.
#[test]
fn engine_objects_of_closed_files_never_go_stale() {
    let s = Scratch::new("enginestale");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    const N: usize = 50;
    let mut want: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("file {i} gen 0;").repeat(20 + i % 7).into_bytes())
        .collect();
    for (i, w) in want.iter().enumerate() {
        fs::write(backing.join(format!("f{i}")), w).unwrap();
    }
    let m = Mount::start(
        &backing,
        &mnt,
        &[
            "--quiet",
            "--read-path",
            "engine-direct",
            "--object-cache",
            "8",
        ],
    );
    m.wait_loaded();
    let read_all = |want: &[Vec<u8>]| {
        for (i, w) in want.iter().enumerate() {
            let got = fs::read(mnt.join(format!("f{i}"))).unwrap();
            assert!(got == *w, "f{i}: {:?}", String::from_utf8_lossy(&got));
        }
    };
    read_all(&want);
    want[2] = want[2].iter().map(|b| b.to_ascii_uppercase()).collect();
    fs::write(backing.join("f2"), &want[2]).unwrap();
    fs::remove_file(mnt.join("f3")).unwrap();
    want[3] = b"a new file under the old name".to_vec();
    fs::write(mnt.join("f3"), &want[3]).unwrap();
    read_all(&want);
    read_all(&want);
    drop(m);
}

/// A number in the status line starting with `prefix`, after `key`.
fn status_number(status: &str, prefix: &str, key: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split(key).nth(1))
        .and_then(|t| {
            t.split(|c: char| !c.is_ascii_digit())
                .find(|w| !w.is_empty())
        })
        .and_then(|w| w.parse().ok())
        .unwrap_or(u64::MAX)
}

/// What `ls -l` shows of a directory: name, type, size, permissions, links.
fn long_listing(dir: &std::path::Path) -> Vec<(String, String, u64, u32, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            let kind = format!("{:?}", e.file_type().unwrap());
            let size = if m.is_dir() { 0 } else { m.len() };
            (
                e.file_name().to_string_lossy().into_owned(),
                kind,
                size,
                m.mode(),
                m.nlink(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `ls -l` of a large directory gets the attributes with the names (READDIRPLUS) instead
/// of one LOOKUP round trip per entry, shows what the plain directory shows, and every
/// entry handed out that way stays usable, also after the kernel forgot them all.
#[test]
fn long_listings_come_with_attributes() {
    let s = Scratch::new("rdplus");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let dir = backing.join("big");
    fs::create_dir(&dir).unwrap();
    for i in 0..2000 {
        fs::write(dir.join(format!("file-{i}")), vec![b'a'; i % 50]).unwrap();
    }
    for i in 0..20 {
        fs::create_dir(dir.join(format!("sub-{i}"))).unwrap();
        std::os::unix::fs::symlink(format!("file-{i}"), dir.join(format!("link-{i}"))).unwrap();
        fs::hard_link(dir.join(format!("file-{i}")), dir.join(format!("hard-{i}"))).unwrap();
    }
    let m = Mount::start(&backing, &mnt, &["--quiet", "--no-preload"]);
    let want = long_listing(&dir);
    assert_eq!(long_listing(&mnt.join("big")), want);
    let st = m.status();
    let plus = status_number(&st, "lookups:", "readdirplus ");
    let lookups = status_number(&st, "lookups:", "lookups:");
    assert!(plus >= 2000, "{plus} entries came with attributes:\n{st}");
    assert!(
        lookups < 500,
        "{lookups} lookups for a listing of 2060 entries:\n{st}"
    );
    // Every entry is usable by the node the listing gave the kernel.
    for i in 0..2000 {
        assert_eq!(
            fs::read(mnt.join(format!("big/file-{i}"))).unwrap().len(),
            i % 50
        );
    }
    // The kernel forgets the inodes (FORGET with the counts it holds) and looks them up
    // again: the daemon's counts must have matched, or nodes would be missing or stale.
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    assert_eq!(long_listing(&mnt.join("big")), want);
    fs::write(mnt.join("big/file-7"), b"changed").unwrap();
    assert_eq!(fs::read(dir.join("file-7")).unwrap(), b"changed");
    assert_eq!(fs::read(mnt.join("big/hard-7")).unwrap(), b"changed");
    drop(m);

    // du and find read a whole directory before stat'ing (fts): the kernel's auto mode
    // then sends plain listings, `--readdirplus always` does not; `off` never uses it.
    let names_then_stats = |mnt: &std::path::Path| {
        let names: Vec<_> = fs::read_dir(mnt.join("big"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        for p in &names {
            fs::symlink_metadata(p).unwrap();
        }
        names.len()
    };
    for (mode, plus_wanted) in [("always", true), ("off", false)] {
        let m = Mount::start(
            &backing,
            &mnt,
            &["--quiet", "--no-preload", "--readdirplus", mode],
        );
        assert_eq!(names_then_stats(&mnt), 2060);
        let st = m.status();
        let plus = status_number(&st, "lookups:", "readdirplus ");
        let lookups = status_number(&st, "lookups:", "lookups:");
        if plus_wanted {
            assert!(plus >= 2060 && lookups < 100, "{mode}: {st}");
        } else {
            assert!(plus == 0 && lookups >= 2060, "{mode}: {st}");
        }
        drop(m);
    }
}

/// Listings may be kept by the kernel across opens (FOPEN_CACHE_DIR): listing again costs
/// no READDIR, and every change through the mount, by another process too, shows up in
/// the next listing.
#[test]
fn cached_listings_follow_every_change_through_the_mount() {
    let s = Scratch::new("dircache");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let dir = backing.join("d");
    fs::create_dir(&dir).unwrap();
    fs::create_dir(backing.join("other")).unwrap();
    for i in 0..300 {
        fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
    fs::write(backing.join("other/moved-in"), b"m").unwrap();
    let m = Mount::start(&backing, &mnt, &["--quiet", "--no-preload"]);
    let names = |p: &std::path::Path| {
        let mut v: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let d = mnt.join("d");
    assert_eq!(names(&d), names(&dir));
    let plus = |m: &Mount| status_number(&m.status(), "lookups:", "readdirplus ");
    let before = plus(&m);
    for _ in 0..3 {
        assert_eq!(names(&d), names(&dir));
    }
    assert_eq!(plus(&m), before, "listing again reached the daemon");
    // Each change, made by another process, must show in the next listing.
    let changes: &[&str] = &[
        "touch d/new",
        "rm d/f7",
        "mv d/f8 d/f8-renamed",
        "mkdir d/sub",
        "ln -s f9 d/link",
        "ln d/f10 d/hard",
        "mv other/moved-in d/",
        "mv d/f11 other/",
        "rmdir d/sub",
        "mknod d/fifo p",
    ];
    for c in changes {
        let (ok, out) = sh(&format!("cd {} && {c}", mnt.display()));
        assert!(ok, "{c}: {out}");
        assert_eq!(names(&d), names(&dir), "listing after `{c}`");
    }
    assert_eq!(names(&mnt.join("other")), names(&backing.join("other")));
    drop(m);
}
