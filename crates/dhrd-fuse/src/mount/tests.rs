//! Tests of the request handlers' bookkeeping on a real backing directory, without a kernel
//! mount: the node table and the data path must stay consistent with the backing whatever
//! step of a request fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::config::{FsConfig, ReadPath, ReaddirPlus};
use crate::durable::commit::{SyncSet, FAIL_DUPS};
use crate::kernel::Ino;
use crate::mount::Shared;
use crate::sys::{BackingDir, FUSE_ROOT_INO};
use dhrd_engine::Durability;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

const ROOT: Ino = Ino(FUSE_ROOT_INO);

fn shared(dir: &Path) -> Arc<Shared> {
    let cfg = FsConfig {
        durability: Durability::Sync,
        read_path: ReadPath::Auto,
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
    };
    Shared::new(BackingDir::open(dir).expect("backing"), cfg).expect("shared")
}

/// Looks `name` up in the root as the kernel would (one lookup counted); its node.
fn look_up(sh: &Shared, name: &str) -> Ino {
    let pfd = sh.dir_fd(ROOT).expect("root");
    Ino(sh
        .lookup_in(ROOT, &pfd, OsStr::new(name))
        .expect("lookup")
        .ino)
}

/// Whether the node table still resolves `ino` to a path.
fn resolves(sh: &Shared, ino: Ino) -> bool {
    sh.nodes.lock().path(ino).is_ok()
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
    let sh = shared(d.path());
    let gone = look_up(&sh, "gone");
    let moved = look_up(&sh, "moved");
    let mut set = SyncSet::default();
    FAIL_DUPS.with(|f| f.set(true));
    let unlink = sh.do_unlink(&mut set, ROOT, OsStr::new("gone"), false);
    let rename = sh.do_rename(
        &mut set,
        ROOT,
        OsStr::new("moved"),
        ROOT,
        OsStr::new("renamed"),
        0,
    );
    FAIL_DUPS.with(|f| f.set(false));
    assert!(unlink.is_err() && rename.is_err(), "{unlink:?} {rename:?}");
    let exists = |n: &str| d.path().join(n).exists();
    assert_eq!(
        exists("gone"),
        resolves(&sh, gone),
        "unlink: the backing and the node table disagree"
    );
    let path = sh.nodes.lock().path(moved).ok();
    let want = if exists("moved") { "moved" } else { "renamed" };
    assert_eq!(
        path.as_deref(),
        Some(Path::new(want)),
        "rename: the node names what the backing does not"
    );
}

/// A request that makes an entry counts the kernel's lookup when it looks the entry up;
/// if its sync then fails, the kernel never gets the entry, and the lookup must go with
/// it. Before, it stayed: the node could never be forgotten.
#[test]
fn a_new_entry_whose_sync_fails_takes_its_lookup_back() {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::write(d.path().join("a"), b"x").expect("file");
    let sh = shared(d.path());
    let a = look_up(&sh, "a");
    assert_eq!(sh.nodes.lock().lookups(a), 1);
    // Every sync of the backing fails from now on (failures.rs).
    sh.committer
        .failures
        .fs_failed(sh.dir.dev(), "test: the disk failed".into());
    let mut set = SyncSet::default();
    let r = sh.do_link(&mut set, a, ROOT, OsStr::new("b"));
    assert!(r.is_ok(), "{r:?}");
    let (tx, rx) = mpsc::channel();
    sh.reply_entry_when_durable(set, r, move |_, r| tx.send(r.is_ok()).unwrap());
    let sent = rx.recv_timeout(Duration::from_secs(10)).expect("reply");
    assert!(!sent, "the link's failed sync was acknowledged");
    assert_eq!(
        sh.nodes.lock().lookups(a),
        1,
        "the entry the kernel never got is still counted"
    );
}
