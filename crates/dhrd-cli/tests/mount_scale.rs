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
