//! Support shared by the tests of every crate (a dev-dependency only).
//!
//! Invariant: a check that cannot run where the suite runs never passes in silence. It
//! either requires what it needs (and fails without it), or calls [`skip`], which prints a
//! loud `DHRD-SKIP: <test>: <reason>` line and appends that line to the file named by
//! [`SKIP_LOG_ENV`]; `scripts/test-all.sh` sets it and prints the count and the list at the
//! end of the run, so a skipped check is counted and shown.
//!
//! Crash semantics: none.

pub mod layers;

use std::io::Write;

/// Environment variable naming the file every skipped check is appended to.
pub const SKIP_LOG_ENV: &str = "DHRD_SKIP_LOG";

/// Reports that the calling test (or a part of it, named in `reason`) did not run. The
/// test is named from the test harness's thread name and the test binary.
///
/// Panics if the skip log is set but cannot be written: the suite asked for the list, and
/// a skip it cannot count would be a silent one.
pub fn skip(reason: impl std::fmt::Display) {
    let line = format!("DHRD-SKIP: {}: {reason}", test_name());
    eprintln!("{line}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    // One write of one line with O_APPEND: lines of concurrent tests and test binaries
    // never interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {path:?} (${SKIP_LOG_ENV}): {e}");
    }
}

/// `binary::test` for the running test: libtest names each test's thread after the test;
/// the binary's file name carries the test target (its hash suffix dropped).
fn test_name() -> String {
    let binary = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .map(|n| match n.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => n,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    match thread.name() {
        Some(t) if t != "main" => format!("{binary}::{t}"),
        _ => binary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_appended_to_the_log_with_the_test_named() {
        let dir = std::env::temp_dir().join(format!("dhrd-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let log = dir.join("skips");
        // Only this test touches the variable in this binary; the suite's value comes back.
        let suite = std::env::var_os(SKIP_LOG_ENV);
        std::env::set_var(SKIP_LOG_ENV, &log);
        skip("nothing to probe");
        skip("twice");
        match suite {
            Some(v) => std::env::set_var(SKIP_LOG_ENV, v),
            None => std::env::remove_var(SKIP_LOG_ENV),
        }
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{e}"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("DHRD-SKIP: dhrd_testkit::tests::a_skip_is_appended")
                && lines[0].ends_with(": nothing to probe"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
