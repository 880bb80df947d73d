//! The background loader's promises beyond the request cases (I8): it reads a file backing
//! past the page cache (O_DIRECT, or drop-behind where O_DIRECT is off), it never has more
//! reads at the backing than its threads, and its progress reports a rate and an ETA that
//! a rate limit bounds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::SlowReads;
use dhrd_engine::{HybridObject, LoaderConfig, ObjectConfig};
use dhrd_io::{FileBacking, FileOptions, SimBacking};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const PAGE: usize = 4096;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Pages of `path` in the page cache (cachestat(2), or mincore before Linux 6.5).
fn cached_pages(path: &Path) -> usize {
    let f = File::open(path).expect("open");
    let (c, _) = dhrd_pagecache::cachestat(f.as_fd(), 0, 0).expect("cachestat");
    c.cached_pages as usize
}

/// Writes `len` bytes to `path`, syncs them and drops them from the page cache.
fn cold_file(path: &Path, len: usize) {
    std::fs::write(path, pattern(len, 3)).expect("write");
    let f = File::open(path).expect("open");
    f.sync_all().expect("fsync");
    // SAFETY: fadvise of a descriptor the test holds.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "fadvise");
}

/// Whether the directory's file system keeps file data only in the page cache (tmpfs,
/// ramfs), where nothing can bypass it.
fn data_lives_in_the_page_cache(dir: &Path) -> bool {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a plain C struct, for which all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs of a NUL-terminated path into a struct the call may fill.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statfs: {}", io::Error::last_os_error());
    // ramfs has no constant in libc.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    st.f_type == libc::TMPFS_MAGIC || st.f_type == RAMFS_MAGIC
}

/// I8: a load of a cold file leaves (almost) none of it in the page cache, both through
/// O_DIRECT and through buffered reads with drop-behind. The control reads the file plainly
/// and sees every page cached, so the count can see a cached file.
#[test]
fn the_loader_leaves_a_file_backing_out_of_the_page_cache() {
    const LEN: usize = 32 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    if data_lives_in_the_page_cache(dir.path()) {
        eprintln!("skipped: the temporary directory is on tmpfs, where data is page cache");
        return;
    }
    let path = dir.path().join("backing");
    let pages = LEN / PAGE;
    for (how, direct) in [("O_DIRECT", true), ("drop-behind", false)] {
        cold_file(&path, LEN);
        let before = cached_pages(&path);
        assert!(
            before <= pages / 100,
            "{how}: {before} pages cached before the load"
        );
        let opts = FileOptions {
            direct_reads: direct,
            drop_behind: true,
            ..FileOptions::default()
        };
        let f = FileBacking::open(&path, &opts).expect("backing");
        let o = HybridObject::open(f, ObjectConfig::default()).expect("open");
        assert!(o.wait_loaded(Some(WAIT)), "{how}: the load did not finish");
        assert_eq!(o.progress().chunks_loaded, o.progress().chunks_total);
        let after = cached_pages(&path);
        eprintln!("{how}: {after} of {pages} pages cached after the load");
        // Before the buffered descriptor was advised POSIX_FADV_RANDOM, readahead in flight
        // when a drop ran escaped it: 1-2 MiB runs of this file (up to 8%) in about one
        // run in four, so this check catches that only sometimes. Since, 0 in every run
        // but one of a 1 GiB load, which kept 2 pages.
        assert!(
            after <= pages / 256,
            "{how}: {after} of {pages} pages cached after the load"
        );
        let mut buf = vec![0u8; 1 << 20];
        o.read_at(&mut buf, 5 << 20).expect("read");
        assert_eq!(buf, pattern(LEN, 3)[5 << 20..6 << 20]);
        o.close().expect("close");
    }
    // The control: a plain read caches the file, and the count sees it.
    let _ = std::fs::read(&path).expect("read");
    let cached = cached_pages(&path);
    assert!(
        cached >= pages * 9 / 10,
        "{cached} of {pages} after a plain read"
    );
}

/// I8: the loader's concurrency is bounded by its threads, and it uses them.
#[test]
fn the_loader_never_has_more_reads_at_the_backing_than_threads() {
    const THREADS: usize = 3;
    const CB: u64 = 4096;
    let back = Arc::new(SlowReads::new(
        SimBacking::from_bytes(pattern(60 * CB as usize, 5), 9),
        Duration::from_millis(3),
    ));
    let cfg = ObjectConfig {
        chunk_bytes: CB,
        inline_load_bytes_max: 0,
        loader_config: LoaderConfig {
            threads: THREADS,
            ..Default::default()
        },
        ..Default::default()
    };
    let o = HybridObject::open(back.clone(), cfg).expect("open");
    assert!(o.wait_loaded(Some(WAIT)), "the load did not finish");
    let most = back.most_in_flight();
    assert!(
        most <= THREADS,
        "{most} reads at once with {THREADS} threads"
    );
    assert!(
        most >= 2,
        "the threads never read together ({most} at most)"
    );
    o.verify_mirror().expect("mirror");
}

/// I8: during a rate-limited load the progress reports the chunks, a rate within the
/// limit and an ETA no shorter than what the limit allows for the rest; at the end, all.
#[test]
fn progress_reports_a_rate_within_the_limit_and_an_eta() {
    const CB: u64 = 4096;
    const CHUNKS: u64 = 30;
    const LIMIT_BYTES_PER_S: u64 = 50 * CB;
    let sim = Arc::new(SimBacking::from_bytes(
        pattern((CHUNKS * CB) as usize, 7),
        11,
    ));
    let cfg = ObjectConfig {
        chunk_bytes: CB,
        inline_load_bytes_max: 0,
        loader_config: LoaderConfig {
            threads: 1,
            rate_bytes_per_s: Some(LIMIT_BYTES_PER_S),
            ..Default::default()
        },
        ..Default::default()
    };
    let o = HybridObject::open(sim, cfg).expect("open");
    std::thread::sleep(Duration::from_millis(150));
    let p = o.progress();
    assert_eq!(p.chunks_total, CHUNKS);
    assert!(
        p.chunks_loaded > 0 && p.chunks_loaded < CHUNKS,
        "150 ms into a 0.6 s load: {p:?}"
    );
    assert!(
        p.rate_bytes_per_s > 0.0 && p.rate_bytes_per_s <= 1.25 * LIMIT_BYTES_PER_S as f64,
        "{p:?}"
    );
    let rest_s = ((CHUNKS - p.chunks_loaded) * CB) as f64 / LIMIT_BYTES_PER_S as f64;
    let eta = p.eta.expect("an ETA while loading");
    assert!(
        eta.as_secs_f64() >= 0.8 * rest_s,
        "ETA {eta:?} shorter than the limit allows ({rest_s:.2} s): {p:?}"
    );
    assert!(o.wait_loaded(Some(WAIT)), "the load did not finish");
    let p = o.progress();
    assert_eq!(p.chunks_loaded, CHUNKS);
    assert_eq!(p.bytes_loaded, CHUNKS * CB);
}
