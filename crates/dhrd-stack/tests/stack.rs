//! The stack builder's own promises, on files: a backing marked as lacking a cache's data
//! is refused before anything above it opens (or its mark dropped when asked); a fast
//! layer never sits under a read-only object and a refused one creates nothing; an empty
//! backing of a fixed-size object is refused; a close drains the fast layer into the
//! backing; the layers are released only after the object closed. (Every frontend's own
//! tests run through it as well: dhrd-cli's nbd tests, dhrd-capi's.)
#![allow(clippy::expect_used)] // tests fail loudly by design

use dhrd_engine::ObjectConfig;
use dhrd_stack::{BackingConfig, Error, FastLayer, Notice, Stack, StackConfig};
use std::path::Path;
use std::time::Duration;

const CHUNK_BYTES: u64 = 64 << 10;

fn config(backing: &Path, fast: Option<FastLayer>) -> StackConfig {
    StackConfig {
        backing: BackingConfig {
            create: true,
            min_len: Some(1 << 20),
            ..BackingConfig::new(backing)
        },
        fast,
        adopt_cache: false,
        drop_cache_mark: false,
        chunk_bytes: Some(CHUNK_BYTES),
        object: ObjectConfig::default(),
    }
}

fn nvm(file: &Path) -> Option<FastLayer> {
    Some(FastLayer::Nvm {
        file: file.to_path_buf(),
        timing: None,
    })
}

/// A directory on a disk (NVM write-back refuses tmpfs).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").expect("a directory on a disk")
}

fn mark(backing: &Path, text: &str) {
    let f = std::fs::File::open(backing).expect("backing");
    dhrd_io::xattr::set(&f, dhrd_tier::pairing::MARK_XATTR, text.as_bytes()).expect("mark");
}

fn marked(backing: &Path) -> bool {
    let f = std::fs::File::open(backing).expect("backing");
    dhrd_io::xattr::get(&f, dhrd_tier::pairing::MARK_XATTR)
        .expect("read the mark")
        .is_some()
}

#[test]
fn a_marked_backing_is_refused_without_its_cache_unless_the_mark_is_dropped() {
    let dir = disk_dir();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, vec![7u8; 1 << 20]).expect("backing");
    mark(&backing, "cache 1234 on an SSD elsewhere");
    let e = Stack::open(config(&backing, None))
        .err()
        .expect("a marked backing opened");
    assert!(matches!(e, Error::Marked(_)), "{e}");
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("lacks data"), "{e}");

    // Read-only: served as it is, the mark kept and reported.
    let mut ro = config(&backing, None);
    ro.drop_cache_mark = true;
    ro.object.read_only = true;
    let stack = Stack::open(ro).expect("a read-only open dropping the mark");
    assert!(matches!(
        stack.notices(),
        [Notice::ServedDespiteMark { .. }]
    ));
    stack.close(Duration::ZERO).0.expect("close");
    assert!(marked(&backing), "a read-only open removed the mark");

    let mut rw = config(&backing, None);
    rw.drop_cache_mark = true;
    let stack = Stack::open(rw).expect("an open dropping the mark");
    assert!(matches!(stack.notices(), [Notice::MarkDropped { .. }]));
    assert!(!marked(&backing), "the mark is still there");
    stack.close(Duration::ZERO).0.expect("close");
}

#[test]
fn a_fast_layer_under_a_read_only_object_is_refused_before_it_is_created() {
    let dir = disk_dir();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, vec![1u8; 1 << 20]).expect("backing");
    let fast_file = dir.path().join("nvm");
    let mut cfg = config(&backing, nvm(&fast_file));
    cfg.object.read_only = true;
    let e = Stack::open(cfg)
        .err()
        .expect("a read-only object over NVM write-back");
    assert!(matches!(e, Error::ReadOnlyCache { .. }), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(!fast_file.exists(), "the refused layer's file was created");
}

#[test]
fn an_empty_backing_of_a_fixed_size_object_is_refused() {
    let dir = disk_dir();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, b"").expect("backing");
    let mut cfg = config(&backing, None);
    cfg.backing.min_len = None;
    cfg.object.fixed_len = true;
    let e = Stack::open(cfg).err().expect("an empty fixed-size object");
    assert!(matches!(e, Error::Empty { .. }), "{e}");
}

#[test]
fn a_close_writes_the_nvm_layer_back_and_clears_the_mark() {
    let dir = disk_dir();
    let backing = dir.path().join("backing");
    let stack = Stack::open(config(&backing, nvm(&dir.path().join("nvm")))).expect("open");
    assert!(
        marked(&backing),
        "the backing is not marked while NVM holds its data"
    );
    stack
        .object()
        .write_at(&[9u8; 5000], 70_000)
        .expect("write");
    let status = stack.status();
    assert!(status.contains_key("writeback") && !status.contains_key("tier"));
    let (flushed, released) = stack.close(Duration::from_secs(60));
    flushed.expect("flush");
    let drained = released.writeback.expect("the NVM layer's drain");
    assert!(drained.done && drained.failure.is_none(), "{drained:?}");
    assert_eq!(drained.stats.chunks_dirty, 0);
    let bytes = std::fs::read(&backing).expect("backing");
    assert!(
        bytes[70_000..75_000].iter().all(|b| *b == 9),
        "not written back"
    );
    assert!(!marked(&backing), "a clean close left the mark");
}

#[test]
fn a_file_larger_than_asked_is_served_at_its_size_and_said() {
    let dir = disk_dir();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, vec![0u8; 2 << 20]).expect("backing");
    let stack = Stack::open(config(&backing, None)).expect("open");
    assert_eq!(stack.object().len(), 2 << 20);
    let said = stack
        .notices()
        .iter()
        .any(|n| matches!(n, Notice::LargerThanAsked { len, asked, .. } if *len == 2 << 20 && *asked == 1 << 20));
    assert!(said, "{:?}", stack.notices());
    stack.close(Duration::ZERO).0.expect("close");
}

#[test]
#[should_panic(expected = "only after the object closed")]
fn the_layers_are_released_only_after_the_object_closed() {
    let dir = disk_dir();
    let stack = Stack::open(config(&dir.path().join("backing"), None)).expect("open");
    stack.release(Duration::ZERO);
}
