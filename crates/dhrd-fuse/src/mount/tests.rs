//! The mount's core driven without a kernel mount: requests in (the calls a transport
//! makes), replies out (the `Durable` outcomes and return values), on a real backing
//! directory. The node table and the data path must stay consistent with the backing
//! whatever step of a request fails, and both data paths must answer requests alike.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use super::{Durable, Mount};
use crate::config::{FsConfig, ReadPath, ReaddirPlus};
use crate::data::Tier;
use crate::durable::commit::FAIL_DUPS;
use crate::error::Result;
use crate::kernel::{BackingId, Fh, FileKind, Ino, Negotiated, OpenReply, SetAttr};
use crate::killpriv::Caller;
use crate::sys::{BackingDir, FUSE_ROOT_INO};
use dhrd_engine::Durability;
use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

const ROOT: Ino = Ino(FUSE_ROOT_INO);

/// Root, as the kernel sends it for a root caller.
const CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn config(durability: Durability, read_path: ReadPath) -> FsConfig {
    FsConfig {
        durability,
        read_path,
        mem_bytes: 1 << 30,
        chunk_bytes: None,
        loader_threads: 1,
        load_rate: None,
        preload: false,
        pin: false,
        readdirplus: ReaddirPlus::Off,
        object_cache: 16,
        dir_fds_max: 16,
        linger_max: 16,
        kept_fds_max: 16,
    }
}

/// A mount of `dir` after INIT, which offered passthrough.
fn mount_with(dir: &Path, durability: Durability, read_path: ReadPath) -> Arc<Mount> {
    let m = Mount::new(
        BackingDir::open(dir).expect("backing"),
        config(durability, read_path),
    )
    .expect("mount");
    let n = Negotiated {
        passthrough: true,
        ..Negotiated::default()
    };
    m.init(n).expect("init");
    m
}

fn mount(dir: &Path) -> Arc<Mount> {
    mount_with(dir, Durability::Sync, ReadPath::Auto)
}

/// What a transport would register with the kernel: a token of its own.
fn register(_: BorrowedFd<'_>) -> std::io::Result<BackingId> {
    Ok(BackingId::new(7u32))
}

/// The reply of a changing request, once it is sent.
fn reply<T: Send + 'static>(d: Durable<T>) -> Result<T> {
    let (tx, rx) = mpsc::channel();
    d.reply(move |r| tx.send(r).unwrap());
    rx.recv_timeout(Duration::from_secs(10)).expect("reply")
}

/// Looks `name` up in the root as the kernel would (one lookup counted); its node.
fn look_up(m: &Mount, name: &str) -> Ino {
    Ino(m.lookup(ROOT, OsStr::new(name)).expect("lookup").attr.ino)
}

/// Whether the node table still resolves `ino` to a path.
fn resolves(m: &Mount, ino: Ino) -> bool {
    m.ns.nodes().path(ino).is_ok()
}

/// A request that fails after its change reached the backing (here the descriptor for
/// its sync: EMFILE) must leave the node table as the backing is: the change undone, or
/// recorded. Before, unlink and rename returned the error with the backing changed and
/// the node table not: the unlinked file's node still named the old path.
#[test]
fn an_unlink_or_rename_failing_at_its_sync_leaves_the_node_table_as_the_backing() {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::write(d.path().join("gone"), b"x").expect("file");
    std::fs::write(d.path().join("moved"), b"y").expect("file");
    let m = mount(d.path());
    let gone = look_up(&m, "gone");
    let moved = look_up(&m, "moved");
    FAIL_DUPS.with(|f| f.set(true));
    let unlink = reply(m.unlink(ROOT, OsStr::new("gone"), false));
    let renamed = OsStr::new("renamed");
    let rename = reply(m.rename(ROOT, OsStr::new("moved"), ROOT, renamed, 0));
    FAIL_DUPS.with(|f| f.set(false));
    assert!(unlink.is_err() && rename.is_err(), "{unlink:?} {rename:?}");
    let exists = |n: &str| d.path().join(n).exists();
    assert_eq!(
        exists("gone"),
        resolves(&m, gone),
        "unlink: the backing and the node table disagree"
    );
    let path = m.ns.nodes().path(moved).ok();
    let want = if exists("moved") { "moved" } else { "renamed" };
    assert_eq!(
        path.as_deref(),
        Some(Path::new(want)),
        "rename: the node names what the backing does not"
    );
    assert_eq!(m.stats().errors.load(Ordering::Relaxed), 2);
}

/// A request that makes an entry counts the kernel's lookup when it looks the entry up;
/// if its sync then fails, the kernel never gets the entry, and the lookup must go with
/// it. Before, it stayed: the node could never be forgotten.
#[test]
fn a_new_entry_whose_sync_fails_takes_its_lookup_back() {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::write(d.path().join("a"), b"x").expect("file");
    let m = mount(d.path());
    let a = look_up(&m, "a");
    assert_eq!(m.ns.nodes().lookups(a), 1);
    // Every sync of the backing fails from now on (failures.rs).
    m.committer()
        .failures()
        .fs_failed(m.dir().dev(), "test: the disk failed".into());
    let r = reply(m.link(a, ROOT, OsStr::new("b")));
    assert!(r.is_err(), "the link's failed sync was acknowledged");
    assert_eq!(
        m.ns.nodes().lookups(a),
        1,
        "the entry the kernel never got is still counted"
    );
}

/// Names of the root's listing, through READDIR.
fn listing(m: &Mount) -> Vec<OsString> {
    let fh = m.opendir(ROOT).expect("opendir");
    let mut names = Vec::new();
    m.readdir(ROOT, fh, 0, |_, _, _, name| {
        names.push(name.to_owned());
        false
    })
    .expect("readdir");
    m.releasedir(fh);
    names.sort();
    names
}

/// The life of a file through the core's requests alone, on each data path: create,
/// write, read back, fsync, truncate, rename, list, unlink. Every reply must say what
/// the backing directory then holds.
#[test]
fn a_file_lives_through_requests_alone_on_either_data_path() {
    for (durability, read_path, page) in [
        (Durability::Sync, ReadPath::PageCache, true),
        (Durability::Fsync, ReadPath::PageCache, true),
        (Durability::Sync, ReadPath::EngineDirect, false),
        (Durability::Fsync, ReadPath::EngineCached, false),
    ] {
        let what = format!("{durability} {read_path}");
        let d = tempfile::tempdir().expect("tempdir");
        let m = mount_with(d.path(), durability, read_path);
        assert_eq!(
            matches!(m.tier_if_set(), Some(Tier::Page(_))),
            page,
            "{what}"
        );
        // O_DIRECT: on the page cache path the daemon serves the writes (a passthrough
        // open's writes would go to the kernel, which is not there).
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_DIRECT;
        let name = OsStr::new("f");
        let (e, fh, open) = reply(m.create(&CALLER, ROOT, name, 0o644, 0o022, flags, &register))
            .unwrap_or_else(|e| panic!("{what}: create: {e}"));
        assert_eq!(e.attr.kind, FileKind::RegularFile, "{what}");
        assert_eq!(e.attr.perm, 0o644, "{what}");
        if page {
            assert!(matches!(open, OpenReply::Passthrough(..)), "{what}");
        }
        let data = vec![0x5au8; 8192];
        let n = m.write(&CALLER, fh, 0, &data, false, flags).expect("write");
        assert_eq!(n, 8192, "{what}");
        assert_eq!(
            m.read(fh, 4096, 8192).expect("read"),
            &data[4096..],
            "{what}"
        );
        reply(m.fsync(fh, false)).unwrap_or_else(|e| panic!("{what}: fsync: {e}"));
        assert_eq!(
            std::fs::read(d.path().join("f")).expect("backing"),
            data,
            "{what}"
        );
        let cut = SetAttr {
            size: Some(100),
            fh: Some(fh),
            ..SetAttr::default()
        };
        let ino = Ino(e.attr.ino);
        let attr = reply(m.setattr(&CALLER, ino, &cut)).expect("truncate");
        assert_eq!(attr.size, 100, "{what}");
        assert_eq!(
            m.getattr(ino, Some(fh)).expect("getattr").size,
            100,
            "{what}"
        );
        m.release(fh);
        reply(m.rename(ROOT, name, ROOT, OsStr::new("g"), 0)).expect("rename");
        assert_eq!(listing(&m), [".", "..", "g"], "{what}");
        assert_eq!(std::fs::metadata(d.path().join("g")).expect("g").len(), 100);
        reply(m.unlink(ROOT, OsStr::new("g"), false)).expect("unlink");
        assert_eq!(listing(&m), [".", ".."], "{what}");
        assert_eq!(m.stats().errors.load(Ordering::Relaxed), 0, "{what}");
    }
}

/// open(O_TRUNC) through the core: the file is empty when the open's reply comes, the
/// handle works, and the truncate is counted as the open's own.
#[test]
fn an_open_with_o_trunc_truncates_before_it_replies() {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::write(d.path().join("f"), b"old contents").expect("file");
    let m = mount(d.path());
    let ino = look_up(&m, "f");
    let flags = libc::O_WRONLY | libc::O_TRUNC | libc::O_DIRECT;
    let (fh, _) = reply(m.open(&CALLER, ino, flags, &register)).expect("open");
    assert_eq!(std::fs::read(d.path().join("f")).expect("f"), b"");
    assert_eq!(
        m.write(&CALLER, fh, 0, b"new", false, flags)
            .expect("write"),
        3
    );
    m.release(fh);
    assert_eq!(std::fs::read(d.path().join("f")).expect("f"), b"new");
    assert_eq!(m.stats().open_truncates.load(Ordering::Relaxed), 1);
}

/// A missing name is a negative entry (node 0) the kernel may keep, not an error; an
/// unknown handle is EBADF, counted.
#[test]
fn a_missing_name_is_a_negative_entry_and_an_unknown_handle_ebadf() {
    let d = tempfile::tempdir().expect("tempdir");
    let m = mount(d.path());
    let e = m.lookup(ROOT, OsStr::new("nothing")).expect("lookup");
    assert_eq!((e.attr.ino, e.generation), (0, 0));
    let r = m.read(Fh(12345), 0, 10);
    assert_eq!(r.map_err(|e| e.errno()), Err(libc::EBADF));
    assert_eq!(m.stats().errors.load(Ordering::Relaxed), 1);
}

/// READDIRPLUS counts the kernel's lookup of an entry only once the entry is in the
/// reply: an entry that did not fit is not counted, and comes at the next offset.
#[test]
fn readdirplus_counts_only_the_entries_the_reply_took() {
    let d = tempfile::tempdir().expect("tempdir");
    for n in ["a", "b", "c"] {
        std::fs::write(d.path().join(n), n).expect("file");
    }
    let m = mount(d.path());
    let fh = m.opendir(ROOT).expect("opendir");
    let mut took = Vec::new();
    let mut next_offset = 0;
    // A reply with room for ".", ".." and one entry.
    m.readdirplus(ROOT, fh, 0, |next, name, e| {
        if took.len() == 3 {
            return true;
        }
        took.push((name.to_owned(), Ino(e.attr.ino)));
        next_offset = next;
        false
    })
    .expect("readdirplus");
    let counted = |ino: Ino| m.ns.nodes().lookups(ino);
    let (first, ino) = took[2].clone();
    assert_eq!(counted(ino), 1, "{first:?} is in the reply");
    let mut rest = Vec::new();
    m.readdirplus(ROOT, fh, next_offset, |_, name, e| {
        rest.push((name.to_owned(), Ino(e.attr.ino)));
        false
    })
    .expect("readdirplus");
    assert_eq!(rest.len(), 2, "{rest:?}");
    for (name, ino) in &rest {
        assert_eq!(counted(*ino), 1, "{name:?}");
    }
    m.releasedir(fh);
}

/// In `fsync` mode an fsync makes durable the directory entries that name its file, and
/// those naming the directories above it, and leaves every other change recorded for its
/// own fsync (instead of a syncfs of the whole backing).
#[test]
fn an_fsync_syncs_the_names_of_its_file_and_leaves_the_others() {
    let d = tempfile::tempdir().expect("tempdir");
    let m = mount_with(d.path(), Durability::Fsync, ReadPath::PageCache);
    // The first sync of names after a mount is a syncfs (what a previous daemon changed
    // is in no record): made here, before the changes under test.
    reply(m.fsyncdir(ROOT)).expect("fsyncdir");
    let a = reply(m.mkdir(&CALLER, ROOT, OsStr::new("a"), 0o755, 0)).expect("mkdir a");
    let b = reply(m.mkdir(&CALLER, ROOT, OsStr::new("b"), 0o755, 0)).expect("mkdir b");
    let flags = libc::O_RDWR | libc::O_CREAT;
    let create = |dir: Ino, name: &str| {
        let r = m.create(&CALLER, dir, OsStr::new(name), 0o644, 0, flags, &register);
        reply(r).expect("create").1
    };
    let f = create(Ino(a.attr.ino), "f");
    let g = create(Ino(b.attr.ino), "g");
    assert_eq!(
        m.unsynced(),
        (3, 4),
        "the root, a and b, naming a, b, f and g"
    );
    reply(m.fsync(f, false)).expect("fsync f");
    assert_eq!(m.unsynced(), (1, 1), "b and its entry g are left");
    reply(m.fsync(g, true)).expect("fdatasync g");
    assert_eq!(m.unsynced(), (0, 0));
    for fh in [f, g] {
        m.release(fh);
    }
    reply(m.unlink(Ino(b.attr.ino), OsStr::new("g"), false)).expect("unlink");
    assert_eq!(m.unsynced(), (1, 0), "b lost an entry");
    reply(m.fsyncdir(Ino(b.attr.ino))).expect("fsyncdir");
    assert_eq!(m.unsynced(), (0, 0));
}
