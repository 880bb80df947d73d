//! Tests of the page cache path's registrations, sync flags and daemon-served I/O, on
//! real files without a kernel mount.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
use super::*;
use crate::durable::failures::SyncOf;
use dhrd_engine::RamBudget;
use dhrd_pagecache::resident::{FileRef, Opener, ResidentConfig};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A writer with every capability (root, no /proc to read).
const ROOT: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

struct NoOpener;
impl Opener for NoOpener {
    fn open(&self, _: &FileRef) -> io::Result<File> {
        Err(io::Error::from_raw_os_error(libc::ENOENT))
    }
}

fn tier(sync: bool) -> PageTier<u32> {
    let r = Resident::new(
        ResidentConfig::default(),
        RamBudget::new(1 << 30),
        Arc::new(NoOpener),
    )
    .expect("resident");
    PageTier::new(
        sync,
        r,
        LINGER_MAX,
        Reaper::new(1, "test-reap").expect("reaper"),
        Backing {
            failures: Arc::default(),
            dev: 1,
        },
    )
}

fn rw(p: &Path) -> Result<Opened> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(p)?;
    let meta = file.metadata()?;
    let (mode, file_size) = (meta.permissions().mode(), meta.len());
    Ok(Opened {
        file,
        mode,
        fresh: false,
        size: file_size,
    })
}

#[test]
fn one_registration_per_inode_shared_by_its_opens_kept_after_the_last_close_until_unlinked() {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("f");
    std::fs::write(&p, b"data").expect("write");
    let t = tier(false);
    let mut made = 0u32;
    let (a, ra) = t
        .open(
            7,
            libc::O_RDONLY,
            None,
            || rw(&p),
            |_| {
                made += 1;
                Ok(made)
            },
        )
        .expect("open a");
    let (b, rb) = t
        .open(
            7,
            libc::O_RDWR,
            Some(ROOT),
            || panic!("opened twice"),
            |_| Ok(99),
        )
        .expect("open b");
    assert_eq!(made, 1);
    let ids = |r: &OpenReply<u32>| match r {
        OpenReply::Passthrough(f, id) => (f.bits(), **id),
        OpenReply::Plain(_) => panic!("not passed through"),
    };
    assert_eq!(ids(&ra), (0, 1));
    assert_eq!(ids(&rb), (0, 1), "every open carries the inode's one id");
    assert_eq!(
        (a.service, b.service),
        (Service::Passthrough, Service::Passthrough)
    );
    // O_DIRECT: served by the daemon, still with the id (mmap shares the page cache).
    let (c, rc) = t
        .open(
            7,
            libc::O_RDONLY | libc::O_DIRECT,
            None,
            || panic!(),
            |_| Ok(5),
        )
        .expect("open c");
    assert_eq!(c.service, Service::Daemon);
    match rc {
        OpenReply::Passthrough(f, id) => {
            assert!(f.contains(ReplyFlags::DIRECT_IO));
            assert_eq!(*id, 1);
        }
        OpenReply::Plain(_) => panic!("O_DIRECT open lost the backing id"),
    }
    assert_eq!(t.read(&c, 1, 100).expect("read"), b"ata");
    for (o, _) in [(a, 0), (b, 0), (c, 0)] {
        assert_eq!(t.open_inodes(), 1);
        t.release(7, o);
    }
    assert_eq!(t.open_inodes(), 0);
    assert!(t.held_file(7).is_some(), "kept after the last close");
    let (o, r) = t
        .open(7, 0, None, || panic!("opened again"), |_| Ok(2))
        .expect("reopen");
    assert_eq!(ids(&r).1, 1, "the kept registration is reused");
    // Losing its last name while open: dropped at the last close, not kept.
    std::fs::remove_file(&p).expect("unlink");
    t.unlinked(7);
    assert!(t.held_file(7).is_some());
    t.release(7, o);
    assert!(t.held_file(7).is_none());
    std::fs::write(&p, b"data").expect("write");
    let (o, r) = t.open(7, 0, None, || rw(&p), |_| Ok(3)).expect("reopen");
    assert_eq!(ids(&r).1, 3, "a new registration once the old one went");
    t.release(7, o);
    std::fs::remove_file(&p).expect("unlink");
    t.unlinked(7);
    assert!(t.held_file(7).is_none(), "an idle one goes at once");
}

/// The unlink of a file lands while its first open is opening it (outside the table's
/// lock): the other thread's unlink is run from inside the open, at that point. Before,
/// the registration was inserted afterwards marked "not unlinked" and lingered after
/// the last close, and the warm-up, told to forget the file before it was demanded,
/// warmed and pinned the deleted inode until unmount: its space and its budget leaked.
#[test]
fn an_open_racing_the_unlink_of_its_file_keeps_neither_registration_nor_pin() {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("f");
    std::fs::write(&p, vec![7u8; 1 << 20]).expect("write");
    let t = tier(false);
    t.resident.walk_done();
    let (o, _) = t
        .open(
            9,
            libc::O_RDWR,
            Some(ROOT),
            || {
                let opened = rw(&p);
                std::fs::remove_file(&p).expect("unlink");
                t.unlinked(9);
                opened
            },
            |_| Ok(1),
        )
        .expect("open");
    assert!(
        t.resident.wait_complete(std::time::Duration::from_secs(30)),
        "warm-up stuck"
    );
    t.release(9, o);
    assert!(
        t.held_file(9).is_none(),
        "the deleted file's registration lingers"
    );
    let st = t.resident.stats();
    assert_eq!(
        (t.resident.budget().used_bytes(), st.files_pinned),
        (0, 0),
        "the deleted file holds budget or a pin: {st:?}"
    );
}

#[test]
fn idle_registrations_are_bounded_oldest_first() {
    let d = tempfile::tempdir().expect("tempdir");
    let t = tier(false);
    let open_close = |k: u64| {
        let p = d.path().join(format!("f{k}"));
        if !p.exists() {
            std::fs::write(&p, b"x").expect("write");
        }
        let (o, _) = t.open(k, 0, None, || rw(&p), |_| Ok(1)).expect("open");
        t.release(k, o);
    };
    let n = LINGER_MAX as u64;
    for k in 0..n {
        open_close(k);
    }
    assert!((0..n).all(|k| t.held_file(k).is_some()));
    // Used again: the youngest now, so the next ones push out 1, 2, ... instead.
    open_close(0);
    for k in n..n + 10 {
        open_close(k);
    }
    let held = (0..n + 10).filter(|k| t.held_file(*k).is_some()).count();
    assert_eq!(held, LINGER_MAX);
    assert!(
        t.held_file(0).is_some(),
        "a reused registration is young again"
    );
    assert!(
        (1..=10).all(|k| t.held_file(k).is_none()),
        "the oldest go first"
    );
    assert!(t.held_file(n + 9).is_some());
}

#[test]
fn sync_mode_sets_and_marks_the_flag_and_fsync_mode_clears_only_its_own() {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = File::open(d.path()).expect("dir");
    if let Err(e) = pagecache::probe_sync_flag(dir.as_fd()) {
        dhrd_testkit::skip(format!("{} refuses FS_SYNC_FL: {e}", d.path().display()));
        return;
    }
    let (p, q) = (d.path().join("ours"), d.path().join("admins"));
    std::fs::write(&p, b"x").expect("write");
    std::fs::write(&q, b"y").expect("write");
    let sync = tier(true);
    for (k, path) in [(1, &p), (2, &q)] {
        if k == 2 {
            // An administrator's flag, set without dhrd.
            pagecache::set_sync_flag(rw(path).expect("open").file.as_fd(), true).expect("set");
        }
        let (o, _) = sync
            .open(k, libc::O_RDWR, Some(ROOT), || rw(path), |_| Ok(1))
            .expect("open");
        assert_eq!(o.service, Service::Passthrough);
        assert!(pagecache::sync_flag(o.file.as_fd()).expect("flag"));
        sync.release(k, o);
    }
    let marked = |path: &Path| {
        let mut v = [0u8; 4];
        rustix::fs::getxattr(path, SYNC_MARK_XATTR, &mut v).is_ok()
    };
    assert!(marked(&p) && !marked(&q));
    let lazy = tier(false);
    for (k, path) in [(1, &p), (2, &q)] {
        let (o, _) = lazy
            .open(k, libc::O_RDWR, Some(ROOT), || rw(path), |_| Ok(1))
            .expect("open");
        lazy.release(k, o);
    }
    let flag =
        |path: &Path| pagecache::sync_flag(rw(path).expect("open").file.as_fd()).expect("flag");
    assert!(!flag(&p) && !marked(&p), "dhrd's own flag is cleared");
    assert!(flag(&q), "the administrator's flag stays");
}

#[test]
fn daemon_writes_reach_the_page_cache_every_open_reads() {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("f");
    std::fs::write(&p, vec![0u8; 8192]).expect("write");
    let t = tier(true);
    let (w, _) = t
        .open(
            3,
            libc::O_RDWR | libc::O_DIRECT,
            Some(ROOT),
            || rw(&p),
            |_| Ok(1),
        )
        .expect("open");
    assert_eq!(w.service, Service::Daemon);
    assert_eq!(
        t.write(&w, 4096, b"hello", WriteSync::Mode).expect("write"),
        5
    );
    let mut buf = [0u8; 5];
    File::open(&p)
        .expect("open")
        .read_exact_at(&mut buf, 4096)
        .expect("read");
    assert_eq!(&buf, b"hello");
    let (st, src) = pagecache::cachestat(w.file.as_fd(), 0, 0).expect("cachestat");
    if src == pagecache::CacheStatSource::Cachestat {
        assert_eq!(
            st.dirty_pages + st.writeback_pages,
            0,
            "durable on return: {st:?}"
        );
    } else {
        dhrd_testkit::skip("no cachestat(2) (Linux 6.5): dirty pages after a write");
    }
    let (r, _) = t
        .open(3, libc::O_RDWR, Some(ROOT), || panic!(), |_| Ok(1))
        .expect("open");
    assert_eq!(
        t.copy(&w, 4096, &r, 0, 5, WriteSync::Mode).expect("copy"),
        5
    );
    assert_eq!(t.read(&r, 0, 5).expect("read"), b"hello");
    t.release(3, w);
    t.release(3, r);
}

/// A registration opened for writing keeps its descriptor after it is dropped (past the
/// idle ones kept), until a sync of its inode asks it, or its inode loses its last name;
/// a read-only one is closed (failures.rs, kept.rs).
#[test]
fn a_dropped_written_registration_keeps_its_descriptor_until_asked() {
    let d = tempfile::tempdir().expect("tempdir");
    let t = tier(false);
    let open_close = |k: u64, writer: Option<Caller>| {
        let p = d.path().join(format!("f{k}"));
        if !p.exists() {
            std::fs::write(&p, b"x").expect("write");
        }
        let (o, _) = t.open(k, 0, writer, || rw(&p), |_| Ok(1)).expect("open");
        t.release(k, o);
    };
    let n = LINGER_MAX as u64;
    open_close(0, Some(ROOT));
    open_close(1, None);
    open_close(2, Some(ROOT));
    for k in 10..10 + n {
        open_close(k, None);
    }
    assert!((0..3).all(|k| t.held_file(k).is_none()), "dropped");
    assert_eq!(
        t.kept_files(),
        2,
        "the written ones are kept, the read-only one not"
    );
    // A sync of inode 0 asks its kept descriptor and lets it go.
    t.failures
        .sync(SyncOf::inode((1, 0)), "fsync", || Ok(()))
        .expect("sync");
    assert_eq!(t.kept_files(), 1);
    // Inode 2 loses its last name: nothing can ask any more.
    std::fs::remove_file(d.path().join("f2")).expect("unlink");
    t.unlinked(2);
    assert_eq!(t.kept_files(), 0);
}

/// The unlink of what its caller took for a file's last name (a link count read before
/// it) races a link made meanwhile: the file still has a name, and the descriptors that
/// would report its writeback error stay, the registration's and a kept one alike.
/// Before, both were dropped unchecked.
#[test]
fn a_name_added_while_the_last_one_went_keeps_the_descriptors_that_can_report_errors() {
    let d = tempfile::tempdir().expect("tempdir");
    let t = tier(false);
    let path = |k: u64| d.path().join(format!("f{k}"));
    let open_close = |k: u64, writer: Option<Caller>| {
        if !path(k).exists() {
            std::fs::write(path(k), b"x").expect("write");
        }
        let (o, _) = t
            .open(k, 0, writer, || rw(&path(k)), |_| Ok(1))
            .expect("open");
        t.release(k, o);
    };
    // Inode 0: an idle registration of a written file. Inode 1: past the idle ones kept,
    // its descriptor waits in the table of kept ones.
    open_close(0, Some(ROOT));
    open_close(1, Some(ROOT));
    for k in 10..10 + LINGER_MAX as u64 {
        open_close(k, None);
    }
    assert!(t.held_file(0).is_none() && t.held_file(1).is_none());
    assert_eq!(t.kept_files(), 2);
    open_close(0, Some(ROOT));
    assert!(t.held_file(0).is_some());
    for k in [0, 1] {
        std::fs::hard_link(path(k), d.path().join(format!("again{k}"))).expect("link");
        std::fs::remove_file(path(k)).expect("unlink");
        t.unlinked(k);
    }
    assert!(
        t.held_file(0).is_some(),
        "the registration of a named file went"
    );
    assert_eq!(
        t.kept_files(),
        2,
        "a named file's kept descriptor went unasked"
    );
    // Its last name goes for real: now they go.
    for k in [0, 1] {
        std::fs::remove_file(d.path().join(format!("again{k}"))).expect("unlink");
        t.unlinked(k);
    }
    assert!(t.held_file(0).is_none());
    assert_eq!(t.kept_files(), 0);
}
