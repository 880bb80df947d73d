//! The C example, compiled with `cc` against the static library and the committed header,
//! run on a file: the API as a C program sees it. Also: the committed header is the one
//! cbindgen generates from the current source.
#![allow(clippy::expect_used)] // tests fail loudly by design

mod cc;

use cc::{compile, crate_dir};
use std::process::Command;

#[test]
fn committed_header_matches_the_source() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/dhrd.h"));
    let committed =
        std::fs::read_to_string(crate_dir().join("include/dhrd.h")).expect("include/dhrd.h");
    assert!(
        generated == committed,
        "include/dhrd.h is stale: copy the generated header from {}/dhrd.h",
        env!("OUT_DIR")
    );
}

#[test]
fn c_example_builds_and_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = compile("example", dir.path());
    let backing = dir.path().join("backing");
    let o = Command::new(&exe).arg(&backing).output().expect("example");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().last() == Some("ok"),
        "example: {}{}",
        out,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("len 4096"), "{out}");
    // The write reached the file itself, and the truncation too.
    assert_eq!(std::fs::metadata(&backing).expect("backing").len(), 4096);
}

/// The write benchmark (bench/nbd/writes.sh) builds and runs in both of its modes, and the
/// bytes it wrote through the C API are in the file.
#[test]
fn c_write_bench_builds_and_runs() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on a disk file system");
    let exe = compile("write_bench", dir.path());
    let file = dir.path().join("data");
    std::fs::write(&file, vec![0u8; 1 << 20]).expect("file");
    for mode in ["raw", "dhrd"] {
        let o = Command::new(&exe)
            .args([mode, file.to_str().expect("utf-8"), "2", "0.2"])
            .output()
            .expect("write_bench");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains(&format!("\"mode\": \"{mode}\"")),
            "{mode}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let data = std::fs::read(&file).expect("read back");
    assert_eq!(data.len(), 1 << 20);
    assert!(data.iter().any(|b| *b != 0), "no write reached the file");
}
