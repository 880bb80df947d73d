//! `dhrd_io::FileBacking` against the page cache it leaves behind: what a previous process
//! left dirty is made durable by a new backing's first sync (seen through cachestat, which
//! lives here, above `dhrd-io`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use dhrd_io::{Durable, FileBacking, FileOptions};
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// A scratch file on a disk file system (the cache of a tmpfs file is never dirty).
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::var_os("DHRD_TEST_DISK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    dir.join(format!("dhrd-pagecache-test-{tag}-{}", std::process::id()))
}

/// An fsync through a new backing must make durable what a previous process left dirty
/// in the page cache (a daemon killed before its flush): the first `sync` always syncs.
#[test]
fn the_first_sync_covers_dirty_pages_a_previous_process_left() {
    let path = scratch("restart");
    let old = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("scratch");
    old.write_all_at(&[7u8; 8192], 0).expect("write");
    let dirty = |f: &File| {
        let (st, src) = dhrd_pagecache::cachestat(f.as_fd(), 0, 0).expect("cachestat");
        (src == dhrd_pagecache::CacheStatSource::Cachestat)
            .then_some(st.dirty_pages + st.writeback_pages)
    };
    if dirty(&old).is_none() {
        dhrd_testkit::skip("no cachestat(2) (Linux 6.5) to see dirty pages");
        return;
    }
    if dirty(&old) == Some(0) {
        // Only if the kernel's writeback ran in the moment since the write.
        dhrd_testkit::skip("the pages were written back before the test looked");
        return;
    }
    drop(old);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("reopen");
    let fb = FileBacking::from_file(f, "restart".into(), &FileOptions::default()).expect("fb");
    fb.sync().expect("sync");
    if let Some(n) = dirty(fb.file()) {
        assert_eq!(n, 0, "dirty pages left after the first sync");
    }
    let _ = std::fs::remove_file(&path);
}
