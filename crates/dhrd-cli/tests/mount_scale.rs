//! Many files: the daemon's memory and descriptors stay bounded while files churn through
//! the closed-object cache (the full 500k-file run is in bench/fuse/startup.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs;

const FILES: usize = 3000;
// The test must overflow the object cache to show it is bounded.
const _: () = assert!(FILES > dhrd_fuse::objects::CLOSED_OBJECTS_MAX);

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

#[test]
fn thousands_of_files_keep_memory_and_descriptors_bounded() {
    let s = Scratch::new("scale");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    for d in 0..(FILES / 500) {
        let dir = backing.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..500 {
            fs::write(dir.join(format!("f{i}")), format!("{d}/{i}").repeat(64)).unwrap();
        }
    }
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
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
    let nfd = fds(pid);
    eprintln!("daemon RSS {rss1} KiB -> {rss2} KiB, {nfd} descriptors for {FILES} files");
    assert!(
        rss2 < rss1 + 64 * 1024,
        "RSS grew from {rss1} KiB to {rss2} KiB while files churned"
    );
    assert!(
        nfd < 3 * dhrd_fuse::objects::CLOSED_OBJECTS_MAX + 64,
        "{nfd} descriptors: the object cache is not bounded"
    );
    drop(m);
}

/// Every file of a tree larger than the object cache stays in RAM: the walk parks small
/// files, objects pushed out of the cache leave their bytes parked, and a parked copy is
/// never served stale (written through the mount, changed on the backing while nobody had
/// it open, unlinked with its inode number reused, and after a remount).
#[test]
fn files_beyond_the_object_cache_stay_in_ram_and_never_go_stale() {
    let s = Scratch::new("parked");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let mut want: Vec<Vec<u8>> = (0..FILES)
        .map(|i| format!("file {i} gen 0;").repeat(20 + i % 7).into_bytes())
        .collect();
    for (i, w) in want.iter().enumerate() {
        fs::write(backing.join(format!("f{i}")), w).unwrap();
    }
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let st = m.status();
    assert!(st.contains(&format!("{FILES} parked files")), "{st}");
    let read_all = |want: &[Vec<u8>]| {
        for (i, w) in want.iter().enumerate() {
            let got = fs::read(mnt.join(format!("f{i}"))).unwrap();
            assert!(got == *w, "f{i}: {:?}", String::from_utf8_lossy(&got));
        }
    };
    read_all(&want);
    read_all(&want);
    let st = m.status();
    let ram = status_number(&st, "reads (daemon):", "RAM ");
    let from_backing = status_number(&st, "reads (daemon):", "backing ");
    assert_eq!(
        from_backing, 0,
        "a parked or cached file was read from the backing"
    );
    assert!(ram >= 2 * FILES as u64, "{ram} reads from RAM");

    // Written through the mount with the same length and its old mtime put back (as
    // `cp -p` or rsync do), so size and mtime match the parked copy taken before: only
    // the rule that an object's creation removes the parked copy keeps it from coming back.
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
    assert_eq!(
        fs::metadata(backing.join("f0"))
            .unwrap()
            .modified()
            .unwrap(),
        old_mtime
    );
    want[1] = b"shorter".to_vec();
    fs::write(mnt.join("f1"), &want[1]).unwrap();
    read_all(&want);
    read_all(&want);

    // Changed on the backing while not open through the mount (the documented rule:
    // size or mtime differ, so the next open reloads it).
    // Same length, so only the mtime tells.
    want[2] = want[2].iter().map(|b| b.to_ascii_uppercase()).collect();
    fs::write(backing.join("f2"), &want[2]).unwrap();
    // Unlinked, and a new file likely to reuse the inode number.
    fs::remove_file(mnt.join("f3")).unwrap();
    want[3] = b"a new file under the old name".to_vec();
    fs::write(mnt.join("f3"), &want[3]).unwrap();
    read_all(&want);
    read_all(&want);
    drop(m);

    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    read_all(&want);
    drop(m);
}

#[test]
fn mid_sized_files_beyond_the_object_cache_are_preloaded() {
    // Larger than what the walk parks right away, smaller than PARK_BYTES_MAX: the first
    // `--object-cache` of them become objects, the walk parks the rest itself.
    const MID: usize = 24;
    const CACHE: usize = 4;
    let s = Scratch::new("midfiles");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let base = dhrd_fuse::objects::PRELOAD_PARK_BYTES_MAX as usize + 4096;
    let want: Vec<Vec<u8>> = (0..MID)
        .map(|i| (0..base + i * 513).map(|j| (j % 251 + i) as u8).collect())
        .collect();
    for (i, w) in want.iter().enumerate() {
        fs::write(backing.join(format!("m{i}")), w).unwrap();
    }
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--object-cache", &CACHE.to_string()],
    );
    m.wait_loaded();
    let st = m.status();
    assert_eq!(
        status_number(&st, "tree walk:", "found, "),
        MID as u64,
        "files preloaded by the walk: {st}"
    );
    assert!(
        st.contains(&format!("{CACHE} objects, {} parked files", MID - CACHE)),
        "{st}"
    );
    for (i, w) in want.iter().enumerate() {
        assert!(fs::read(mnt.join(format!("m{i}"))).unwrap() == *w, "m{i}");
    }
    let st = m.status();
    assert_eq!(
        status_number(&st, "reads (daemon):", "backing "),
        0,
        "a preloaded file was read from the backing: {st}"
    );
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

/// An object larger than `PARK_BYTES_MAX` is not parked when it leaves the object cache
/// (parking copies it, briefly doubling its RAM): it is dropped, and reads correctly
/// afterwards from a new object.
#[test]
fn large_objects_are_not_parked() {
    let s = Scratch::new("noparkbig");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let big_len = dhrd_fuse::objects::PARK_BYTES_MAX as usize + 4096;
    let big: Vec<u8> = (0..big_len).map(|i| (i % 241) as u8).collect();
    fs::write(backing.join("big"), &big).unwrap();
    const CACHE: usize = 8;
    let small = CACHE + 10;
    for i in 0..small {
        fs::write(backing.join(format!("s{i}")), format!("small {i}")).unwrap();
    }
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--object-cache", &CACHE.to_string()],
    );
    m.wait_loaded();
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    m.wait_loaded();
    // Opening every small file for writing (a read-only open of a parked file makes no
    // object) pushes the big object out of the cache.
    for i in 0..small {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mnt.join(format!("s{i}")))
            .unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut f, &mut got).unwrap();
        assert_eq!(got, format!("small {i}"));
    }
    // The eviction runs in the daemon's handling of a close, which the kernel sends in the
    // background: watch the status for a while rather than once.
    for _ in 0..20 {
        let st = m.status();
        let load_line = st
            .lines()
            .find(|l| l.starts_with("load:"))
            .unwrap_or_default()
            .to_string();
        // The number just before `key` in "..., N objects, M parked files)".
        let count = |key: &str| -> u64 {
            load_line
                .split(key)
                .next()
                .and_then(|t| {
                    t.rsplit(|c: char| !c.is_ascii_digit())
                        .find(|w| !w.is_empty())
                })
                .and_then(|w| w.parse().ok())
                .unwrap_or(u64::MAX)
        };
        let (objs, parked) = (count(" objects"), count(" parked files"));
        assert_eq!(objs + parked, small as u64, "the big file was kept: {st}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    drop(m);
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
