//! pjdfstest inside an attached directory gives ext4's own result: the kernel serves every
//! call on the directory, so attaching (flags on every inode in `sync` mode, the watch)
//! must change no outcome. The same suite runs in a plain directory of a fresh ext4 and in
//! an attached subdirectory of another.
//!
//! pjdfstest is the Rust form of the suite from crates.io (scripts/install-deps.sh installs
//! it); every case's outcome must be the same in both places.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;

#[test]
fn pjdfstest_in_an_attached_directory_matches_plain_ext4() {
    let s = Scratch::new("attach-pjd-plain");
    let plain_fs = LoopFs::new(&s);
    let plain = plain_fs.mnt.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let reference = pjdfstest::outcomes(&plain);
    assert!(
        reference.values().any(|o| o == "ok"),
        "nothing passed on plain ext4"
    );

    let s2 = Scratch::new("attach-pjd-attached");
    let disk = LoopFs::new(&s2);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let a = Attach::start(&dir, &["--durability", "sync"]);
    let attached = pjdfstest::outcomes(&dir);
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    let diff = pjdfstest::differences(&attached, &reference);
    assert!(
        diff.is_empty(),
        "pjdfstest differs inside the attached directory:\n{}",
        diff.join("\n")
    );
}
