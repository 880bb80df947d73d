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

/// The static library of this profile, built first if the test build did not make it.
fn static_lib() -> PathBuf {
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
    lib
}

/// Compiles `examples/c/<name>.c` against the library and the committed header.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let exe = dir.join(name);
    let o = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join(format!("examples/c/{name}.c")))
        .arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc {name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
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
