//! An application's fsync on a mount in `fsync` mode makes durable what it names (the
//! file, and the directory entries that name it), not everything else on the backing's
//! file system: a backing shared with other programs must not make each fsync wait for
//! their dirty data.
//!
//! How it is seen: a file outside the backing directory, on the same file system, is
//! written and left dirty in the page cache; cachestat(2) counts its dirty pages before
//! and after an fsync (and an fsyncdir) through the mount. A `syncfs` of the backing would
//! write them all; an fsync of the file and its directories writes none of them.
//! No time is measured: the kernel's own writeback would take 30 s (dirty_expire) to
//! write pages this young, and the file is far below the background threshold; should
//! the machine's other dirty data push writeback past that threshold meanwhile, some of
//! the pages may be written by the kernel, so the test asks that at least half stay
//! dirty (a syncfs leaves none).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use dhrd_pagecache::{self as pagecache, CacheStatSource};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;

/// The other program's dirty data: well below the background writeback threshold, and
/// below the test disk's size.
const OTHER_BYTES: usize = 16 << 20;

/// Dirty (or under writeback) pages of `path`. cachestat(2) (Linux 6.5) is required:
/// without it nothing here could tell a syncfs from an fsync.
fn dirty_pages(path: &Path) -> u64 {
    let f = File::open(path).expect("open");
    let (c, src) = pagecache::cachestat(f.as_fd(), 0, 0).expect("cachestat");
    assert_eq!(
        src,
        CacheStatSource::Cachestat,
        "cachestat(2) is needed to see which pages were written (Linux 6.5 or later)"
    );
    c.dirty_pages + c.writeback_pages
}

/// Writes the other program's file, leaving its pages dirty; their number.
fn dirty_other_file(path: &Path) -> u64 {
    let mut f = File::create(path).expect("other file");
    f.write_all(&vec![0x6bu8; OTHER_BYTES]).expect("write");
    drop(f);
    let n = dirty_pages(path);
    assert!(
        n * 4096 >= OTHER_BYTES as u64 / 2,
        "the other file's pages are not dirty to begin with ({n} pages): no test"
    );
    n
}

/// On a fresh ext4 (with a journal or without), a mount in `fsync` mode on `read_path`:
/// an fsync of a new file in a new directory, and an fsyncdir, each leave the other
/// file's pages dirty.
fn fsync_leaves_other_data_alone(journal: bool, read_path: &str) {
    let s = Scratch::new(&format!(
        "fsync-other-{}-{read_path}",
        if journal { "j" } else { "nj" }
    ));
    let disk = if journal {
        LoopFs::new(&s)
    } else {
        LoopFs::journal_less(&s)
    };
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    let other = disk.mnt.join("other-program-data");
    let mnt = s.sub("mnt");
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--durability", "fsync", "--read-path", read_path],
    );
    // The first sync of names after a mount is a syncfs, once (changes a previous daemon
    // made are in no record; docs/crash-model.md): made before the other file is dirty.
    File::open(&mnt)
        .expect("open root")
        .sync_all()
        .expect("first fsyncdir");
    let before = dirty_other_file(&other);
    fs::create_dir(m.path("dir")).expect("mkdir");
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("dir/new"))
        .expect("create");
    f.write_all(b"record").expect("write");
    f.sync_all().expect("fsync");
    let after_fsync = dirty_pages(&other);
    File::open(m.path("dir"))
        .expect("open dir")
        .sync_all()
        .expect("fsyncdir");
    File::open(&mnt)
        .expect("open root")
        .sync_all()
        .expect("fsyncdir");
    let after_fsyncdir = dirty_pages(&other);
    drop(m);
    let what = format!(
        "{read_path}, {}: the other file's dirty pages: {before} before, {after_fsync} after \
         an fsync through the mount, {after_fsyncdir} after fsyncdir",
        if journal {
            "journalled"
        } else {
            "journal-less"
        }
    );
    eprintln!("{what}");
    assert!(
        after_fsync * 2 >= before,
        "an fsync wrote another file's data: {what}"
    );
    assert!(
        after_fsyncdir * 2 >= before,
        "an fsyncdir wrote another file's data: {what}"
    );
}

#[test]
fn an_fsync_on_the_page_cache_path_writes_no_other_files_data() {
    fsync_leaves_other_data_alone(true, "pagecache");
    fsync_leaves_other_data_alone(false, "pagecache");
}

#[test]
fn an_fsync_on_the_engine_writes_no_other_files_data() {
    fsync_leaves_other_data_alone(true, "engine-direct");
    fsync_leaves_other_data_alone(false, "engine-direct");
}
