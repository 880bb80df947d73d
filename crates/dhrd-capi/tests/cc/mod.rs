//! The C examples, compiled with `cc` against the static library and the committed header
//! (shared by the test binaries that run them).
#![allow(dead_code, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn crate_dir() -> PathBuf {
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

/// The static library of this profile, built first if the test build did not make it.
pub fn static_lib() -> PathBuf {
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
pub fn compile(name: &str, dir: &Path) -> PathBuf {
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

/// Runs `exe` with `args` and asserts that it printed "ok" last: the program's output.
pub fn run_ok(exe: &Path, args: &[&std::ffi::OsStr]) -> String {
    let o: Output = Command::new(exe).args(args).output().expect("run");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.lines().last() == Some("ok"),
        "{} {args:?}: {out}{}",
        exe.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The bytes `examples/c/stacks.c` writes: (offset, bytes) of each piece.
pub fn stacks_pieces() -> Vec<(u64, Vec<u8>)> {
    [4096 + 123u64, (1 << 20) + 5, (3 << 20) + 77]
        .into_iter()
        .map(|at| {
            let piece = (at..at + 5000).map(|b| (b * 31 % 251 + 1) as u8).collect();
            (at, piece)
        })
        .collect()
}
