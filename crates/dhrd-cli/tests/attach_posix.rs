//! pjdfstest inside an attached directory gives ext4's own result: the kernel serves every
//! call on the directory, so attaching (flags on every inode in `sync` mode, the watch)
//! must change no outcome. The same suite runs in a plain directory of a fresh ext4 and in
//! an attached subdirectory of another; the summaries (failed test files and their failed
//! assertions) must be equal.
//!
//! pjdfstest has no Debian package: set DHRD_PJDFSTEST to a built tree (its `pjdfstest`
//! binary and `tests/`); without it the test says loudly that it did not run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::path::Path;
use std::process::Command;

/// The summary of `prove -r TESTS` run in `dir`: the lines naming failed files and
/// assertions, and the verdict.
fn pjdfstest(tree: &Path, dir: &Path) -> Vec<String> {
    let o = Command::new("prove")
        .arg("-r")
        .arg(tree.join("tests"))
        .current_dir(dir)
        .output()
        .expect("prove");
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let summary: Vec<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("Test Summary Report") && !l.starts_with("All tests"))
        .filter(|l| {
            l.contains("Failed")
                || l.starts_with("Result:")
                || l.trim_start().starts_with("Failed tests")
        })
        .map(|l| {
            l.replace(&tree.display().to_string(), "")
                .trim()
                .to_string()
        })
        .collect();
    assert!(
        summary.iter().any(|l| l.starts_with("Result:")),
        "prove gave no result: {text}"
    );
    summary
}

#[test]
fn pjdfstest_in_an_attached_directory_matches_plain_ext4() {
    let Some(tree) = std::env::var_os("DHRD_PJDFSTEST") else {
        dhrd_testkit::skip(
            "pjdfstest: set DHRD_PJDFSTEST to a built pjdfstest tree (no Debian package); NOT RUN",
        );
        return;
    };
    let tree = Path::new(&tree).to_path_buf();
    assert!(
        tree.join("pjdfstest").exists(),
        "{}: no pjdfstest binary",
        tree.display()
    );
    let s = Scratch::new("attach-pjd-plain");
    let plain_fs = LoopFs::new(&s);
    let plain = plain_fs.mnt.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let reference = pjdfstest(&tree, &plain);
    eprintln!("plain ext4: {reference:?}");

    let s2 = Scratch::new("attach-pjd-attached");
    let disk = LoopFs::new(&s2);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let a = Attach::start(&dir, &["--durability", "sync"]);
    let attached = pjdfstest(&tree, &dir);
    eprintln!("attached (sync, inode flags): {attached:?}");
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
    assert_eq!(
        attached, reference,
        "pjdfstest differs inside the attached directory"
    );
}
