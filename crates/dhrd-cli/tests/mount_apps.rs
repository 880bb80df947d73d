//! Unmodified applications on a dhrd mount: SQLite transactions surviving a SIGKILL of the
//! daemon, fio with crc32c verification, and ext4 on a loop device backed by a file in the
//! mount (the paper's file system on the DHRD block device).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SQLITE_TXNS: u64 = 100_000;
/// The daemon is killed once this many transactions were acknowledged.
const SQLITE_KILL_AFTER_COMMITS: usize = 1000;
/// ... or after this long, whichever comes first.
const SQLITE_KILL_AFTER: Duration = Duration::from_secs(40);

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn sqlite_case(journal: &str) {
    assert!(have("sqlite3"), "sqlite3 is required");
    let s = Scratch::new(&format!("sqlite-{journal}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let db = mnt.join("t.db");
    let mut child = Command::new("sqlite3")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sqlite3");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let journal_mode = journal.to_string();
    let journal = journal.to_string();
    // Feed transactions; after each COMMIT sqlite prints the id, which therefore committed.
    let feeder = std::thread::spawn(move || {
        let _ = writeln!(stdin, "PRAGMA journal_mode={journal};\nPRAGMA synchronous=FULL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);");
        for i in 0..SQLITE_TXNS {
            let r = writeln!(
                stdin,
                "BEGIN; INSERT INTO t VALUES({i}, printf('%.200c', 'x')); UPDATE t SET v = v || 'y' WHERE id = {i} / 2; COMMIT; SELECT 'ok', {i};"
            );
            if r.is_err() {
                return;
            }
        }
    });
    let mut committed = Vec::new();
    let t = Instant::now();
    let mut lines = BufReader::new(stdout).lines();
    let mut killed = false;
    let mut m = Some(m);
    let mut dead = None;
    while let Some(Ok(l)) = lines.next() {
        if let Some(id) = l.strip_prefix("ok|") {
            committed.push(id.parse::<u64>().expect("id"));
        }
        if !killed
            && (committed.len() >= SQLITE_KILL_AFTER_COMMITS || t.elapsed() > SQLITE_KILL_AFTER)
        {
            if let Some(m) = m.take() {
                dead = Some(m.kill9_keep_mount());
            }
            killed = true;
        }
    }
    if let Some(m) = m.take() {
        dead = Some(m.kill9_keep_mount());
    }
    // sqlite3 ends on the dead mount (ENOTCONN) before it is removed, so it cannot create
    // a journal in the bare mountpoint directory.
    let _ = child.kill();
    let _ = child.wait();
    let _ = feeder.join();
    if let Some(d) = dead {
        force_unmount(&d);
    }
    assert!(
        committed.len() > 10,
        "too few transactions before the kill: {}",
        committed.len()
    );
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA integrity_check; SELECT count(*) FROM t; SELECT group_concat(id) FROM t;")
        .output()
        .expect("sqlite3 check");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = text.lines();
    assert_eq!(
        it.next(),
        Some("ok"),
        "integrity_check: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let count: usize = it.next().and_then(|c| c.parse().ok()).expect("count");
    let ids: std::collections::HashSet<u64> = it
        .next()
        .unwrap_or("")
        .split(',')
        .filter_map(|x| x.parse().ok())
        .collect();
    for id in &committed {
        assert!(
            ids.contains(id),
            "committed row {id} missing after the crash"
        );
    }
    assert!(count >= committed.len());
    eprintln!(
        "sqlite {journal_mode}: {} commits acknowledged before SIGKILL, {count} rows after",
        committed.len()
    );
    drop(m);
}

#[test]
fn sqlite_rollback_journal_survives_sigkill() {
    sqlite_case("delete");
}

#[test]
fn sqlite_wal_survives_sigkill() {
    sqlite_case("wal");
}

#[test]
fn fio_verify_crc32c() {
    assert!(have("fio"), "fio is required");
    let s = Scratch::new("fio");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    // fio leaves verify-state files in its working directory: run it in the scratch dir.
    let (ok, out) = sh(&format!(
        "cd {} && fio --name=verify --directory={} --size=32M --bs=4k --rw=randwrite \
         --ioengine=psync --numjobs=2 --verify=crc32c --verify_fatal=1 --do_verify=1 \
         --fsync=64 2>&1",
        s.sub("fio-cwd").display(),
        mnt.display()
    ));
    assert!(
        ok && !out.contains("verify: bad"),
        "fio verify failed: {out}\n{}",
        m.log_text()
    );
    drop(m);
}

#[test]
fn ext4_on_a_loop_device_backed_by_a_file_in_the_mount() {
    let s = Scratch::new("loop");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let inner = s.sub("inner");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let img = mnt.join("disk.img");
    let (ok, out) = sh(&format!("truncate -s 128M {}", img.display()));
    assert!(ok, "{out}");
    let (ok, dev) = sh(&format!("losetup -f --show {}", img.display()));
    assert!(ok, "losetup: {dev}");
    let dev = dev.trim().to_string();
    struct Loop(String);
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        }
    }
    let lo = Loop(dev.clone());
    let script = format!(
        "set -e; mkfs.ext4 -q -F {dev}; mount {dev} {inner}; \
         dd if=/dev/urandom of={inner}/data bs=1M count=16 status=none; \
         sha256sum {inner}/data > {outer}/sum; sync; umount {inner}; \
         e2fsck -fn {dev}; mount {dev} {inner}; \
         (cd {inner} && sed 's#{inner}/##' {outer}/sum | sha256sum -c); umount {inner}",
        inner = inner.display(),
        outer = s.0.display()
    );
    let (ok, out) = sh(&script);
    if !ok {
        let _ = Command::new("umount").arg(&inner).status();
    }
    assert!(ok, "ext4 on loop failed: {out}\n{}", m.log_text());
    drop(lo);
    drop(m);
}
