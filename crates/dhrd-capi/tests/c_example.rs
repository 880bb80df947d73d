//! The C example, compiled with `cc` against the static library and the committed header,
//! run on a file: the API as a C program sees it. Also: the committed header is the one
//! cbindgen generates from the current source.
#![allow(clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The profile directory this test was built into (target/<profile>), where cargo puts
/// the library's staticlib next to the rlib the test links.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("target/<profile>")
}

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
    let lib = profile_dir().join("libdhrd_capi.a");
    if !lib.exists() {
        // cargo builds only the rlib for tests; the staticlib comes from a build of the
        // library target in the same profile and target directory.
        let release = profile_dir().file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "dhrd-capi", "--lib"]);
        if release {
            cmd.arg("--release");
        }
        let o = cmd.output().expect("cargo build");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(lib.exists(), "{} was not built", lib.display());
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("example");
    let o = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("examples/c/example.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
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
