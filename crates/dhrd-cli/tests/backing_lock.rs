//! One `dhrd nbd` per backing file: a second one on the same file, which would serve a RAM
//! copy of its own (stale reads, lost writes), is refused at start, naming the holder; the
//! first one keeps serving, and its clean stop frees the file at once.

mod nbd_common;

use dhrd_nbd::client::Client;
use nbd_common::*;
use std::process::Command;

#[test]
fn a_second_dhrd_on_the_same_backing_file_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("backing.img");
    blocks_file(&backing, 16, 1);
    let mut first = Dhrd::start(dir.path(), &backing, &[]);
    for extra in [&[][..], &["--read-only"][..]] {
        let sock = dir.path().join("second.sock");
        let mut second = Command::new(env!("CARGO_BIN_EXE_dhrd"))
            .arg("nbd")
            .arg("--socket")
            .arg(&sock)
            .arg("--backing")
            .arg(&backing)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        // Refused: it exits. Serving: its socket appears (then it is stopped, and fails).
        let served = loop {
            if second.try_wait().ok().flatten().is_some() {
                break false;
            }
            if sock.exists() {
                let _ = second.kill();
                break true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let out = second.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !served && !out.status.success(),
            "a second dhrd {extra:?} served a backing file the first one serves"
        );
        let pid = first.child.id();
        assert!(
            err.contains("in use by") && err.contains(&format!("pid {pid}")),
            "the refusal does not name the holder (pid {pid}): {err}"
        );
        assert_eq!(
            err.matches("in use by").count(),
            1,
            "the refusal says it more than once: {err}"
        );
    }
    let mut cl = Client::connect(&first.sock).unwrap_or_else(|e| panic!("{e}"));
    cl.write(0, &block(0, 2), false)
        .unwrap_or_else(|e| panic!("the first dhrd after the refusal: {e}"));
    drop(cl);
    assert_eq!(first.term(), Some(0), "{}", first.stderr_text());
    let mut next = Dhrd::start(dir.path(), &backing, &[]);
    assert_eq!(next.term(), Some(0), "{}", next.stderr_text());
}
