//! `--ram-file PATH --ram-kind nvm` (SPEC M4) on the real `dhrd nbd` process: writes are
//! acknowledged once in the file (a stand-in for non-volatile memory) while the backing
//! is slow; after a SIGKILL under load a restart serves every acknowledged block (the
//! dirty ones from the file) and writes them back; a clean stop leaves the backing
//! complete; and a file on tmpfs is refused, since DRAM is never treated as non-volatile.

use dhrd_nbd::client::Client;
use std::process::Command;

mod nbd_common;
use nbd_common::*;

const EXPORT_BLOCKS: u64 = 64; // 4 MiB of 64 KiB blocks

#[test]
fn acknowledged_writes_survive_sigkill_and_are_written_back() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let nvm = dir.path().join("nvm.img");
    require_user_xattrs(dir.path());
    blocks_file(&backing, EXPORT_BLOCKS, 1);
    let nvm_s = nvm.to_string_lossy().to_string();
    // A slow backing (20 ms per request), so the write-back is far behind the writes
    // when the process is killed.
    let args = [
        "--ram-file",
        nvm_s.as_str(),
        "--ram-kind",
        "nvm",
        "--backing-timing",
        "20000,20000,20000,0",
        "--chunk",
        "64K",
    ];
    let mut d = Dhrd::start(dir.path(), &backing, &args);
    assert!(
        d.ready_line.contains("writes acknowledged on NVM"),
        "{}",
        d.ready_line
    );
    let order: Vec<u64> = (0..EXPORT_BLOCKS).rev().collect();
    let (acked, unacked) = write_until_killed(&mut d, &order, 2, false, 4, 40);
    // The backing lacks the dirty chunks: it is marked (in a user extended attribute, which
    // the suite's file system must keep), and a start without the --ram-file is refused.
    assert!(
        mark_of(&backing).is_some(),
        "no cache mark on a backing that lacks dirty chunks"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--backing"])
        .arg(&backing)
        .arg("--socket")
        .arg(dir.path().join("plain.sock"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("lacks data"),
        "{said}"
    );
    // Restart: the dirty chunks are served from the file.
    let mut d = Dhrd::start(dir.path(), &backing, &args);
    let said = d.stderr_text();
    assert!(
        said.contains("chunks were dirty in the --ram-file"),
        "{said}"
    );
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    check_after_kill(&mut c, EXPORT_BLOCKS, &acked, &unacked, 1, 2);
    drop(c);
    // A clean stop waits for the write-back: the backing alone then holds everything.
    let code = d.term();
    assert_eq!(code, Some(0), "{}", d.stderr_text());
    assert!(
        d.stderr_text().contains("write-back complete"),
        "{}",
        d.stderr_text()
    );
    check_file_blocks(&backing, &acked, 2);
    // Written back completely: the mark is gone.
    assert_eq!(mark_of(&backing), None);
}

/// The backing's cache mark, if it has one.
fn mark_of(path: &std::path::Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{e}"));
    dhrd_io::xattr::get(&f, dhrd_tier::pairing::MARK_XATTR).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_ram_file_on_tmpfs_is_refused() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap_or_else(|e| panic!("{e}"));
    // /dev/shm is a tmpfs on every Linux system this suite supports; without one the
    // refusal cannot be checked, which is a failure, not a pass.
    let shm = std::path::Path::new("/dev/shm");
    assert!(
        shm.is_dir() && is_tmpfs(shm),
        "/dev/shm is not a tmpfs here: the refusal of a --ram-file on tmpfs cannot be checked"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--backing"])
        .arg(&backing)
        .args(["--socket"])
        .arg(dir.path().join("s.sock"))
        .args([
            "--ram-file",
            "/dev/shm/dhrd-test-nvm.img",
            "--ram-kind",
            "nvm",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tmpfs"), "{err}");
    assert!(!std::path::Path::new("/dev/shm/dhrd-test-nvm.img").exists());
}

fn is_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed struct we own, with a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
}
