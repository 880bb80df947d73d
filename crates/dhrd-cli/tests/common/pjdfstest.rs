//! pjdfstest, the POSIX file system conformance suite (its Rust form from crates.io,
//! installed by scripts/install-deps.sh), run in a directory: the outcome of every test
//! case, so that a dhrd mount or an attached directory can be compared with plain ext4.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The runner's configuration: every Linux feature ext4 has, and two unprivileged users
/// that exist on a Debian system for the cases that switch users.
const CONFIG: &str = r#"
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}
[settings]
naptime = 0.02
allow_remount = false
expected_failures = []
[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

/// Runs the suite in `dir` (as root) and returns each case's outcome (`ok`, `FAILED`,
/// `skipped`). Panics if the runner is missing or reports no case.
pub fn outcomes(dir: &Path) -> BTreeMap<String, String> {
    let cfg = dir.with_extension("pjdfstest.toml");
    std::fs::write(&cfg, CONFIG).expect("pjdfstest configuration");
    // The suite binds Unix sockets at its paths (two temporary directories and a 32-byte
    // name below the path it is given), and a socket's path has at most 107 bytes
    // (sun_path): below a scratch directory every socket case fails with ENAMETOOLONG,
    // in both places alike, and compares nothing. So the suite is given a short symlink
    // to `dir`, which its temporary directories keep as their prefix.
    static N: AtomicU64 = AtomicU64::new(0);
    let short = PathBuf::from(format!(
        "/tmp/pjd{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&short);
    std::os::unix::fs::symlink(dir, &short).expect("short symlink to the test directory");
    let o = Command::new("pjdfstest")
        .arg("-c")
        .arg(&cfg)
        .arg("-p")
        .arg(&short)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("pjdfstest: {e} (scripts/install-deps.sh installs it with cargo install)")
        });
    let _ = std::fs::remove_file(&cfg);
    let _ = std::fs::remove_file(&short);
    let text = String::from_utf8_lossy(&o.stdout);
    let cases: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, outcome) = (w.next()?, w.next()?);
            (w.next().is_none()
                && name.contains("::")
                && matches!(outcome, "ok" | "FAILED" | "skipped"))
            .then(|| (name.to_owned(), outcome.to_owned()))
        })
        .collect();
    assert!(
        cases.len() > 300,
        "pjdfstest reported {} cases: {text}{}",
        cases.len(),
        String::from_utf8_lossy(&o.stderr)
    );
    cases
}

/// The cases whose outcome differs between two runs, with both outcomes.
pub fn differences(
    got: &BTreeMap<String, String>,
    reference: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut names: Vec<&String> = got.keys().chain(reference.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| got.get(*n) != reference.get(*n))
        .map(|n| format!("{n}: {:?} here, {:?} on ext4", got.get(n), reference.get(n)))
        .collect()
}
