//! Reads racing size changes through a real mount, on every read path and in `fsync` mode.
//!
//! One process reads 1 MiB at random offsets of an 8 MiB file while another (a shell loop)
//! truncates it to a page and back to 8 MiB, and a writer puts the pattern back here and
//! there. A daemon that copies from its RAM tier past a size a concurrent truncate has just
//! shrunk dies of SIGBUS, and every process using the mount then gets ENOTCONN: that is
//! what these tests catch. Besides survival: every byte read is the pattern's or zero, the
//! daemon still answers afterwards, and it unmounts cleanly.
//!
//! Each path runs `RACE_SECS` (120 with `DHRD_SOAK=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const FILE_BYTES: u64 = 8 << 20;
const READ_BYTES: usize = 1 << 20;
const SHORT_BYTES: u64 = 4096;
const RACE_SECS: u64 = 20;
const RACE_SECS_SOAK: u64 = 120;
/// Truncate cycles the shell loop must at least manage, so a loop that silently failed
/// to start cannot pass; far below what any machine does in `RACE_SECS`.
const CYCLES_MIN: u64 = 20;
const READERS: usize = 2;

fn pattern_byte(pos: u64) -> u8 {
    ((pos.wrapping_mul(0x9E37_79B9) >> 13) as u8) | 1
}

fn pattern(offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len).map(pattern_byte).collect()
}

fn race_secs() -> u64 {
    if std::env::var_os("DHRD_SOAK").is_some() {
        RACE_SECS_SOAK
    } else {
        RACE_SECS
    }
}

fn reader(file: &Path, seed: u64, stop: &AtomicBool, reads: &AtomicU64) {
    let f = OpenOptions::new()
        .read(true)
        .open(file)
        .expect("open reader");
    let mut r = Rng(seed);
    let mut buf = vec![0u8; READ_BYTES];
    while !stop.load(Ordering::Acquire) {
        let offset = r.below(FILE_BYTES);
        let n = match f.read_at(&mut buf, offset) {
            Ok(n) => n,
            Err(e) => panic!("read at {offset}: {e} (did the daemon die?)"),
        };
        for (i, &b) in buf[..n].iter().enumerate() {
            let pos = offset + i as u64;
            assert!(
                b == 0 || b == pattern_byte(pos),
                "byte {pos} read as {b:#x}: neither the pattern's {:#x} nor zero",
                pattern_byte(pos)
            );
        }
        reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Puts pattern bytes back at random places, so reads see more than zeros.
fn writer(f: std::fs::File, seed: u64, stop: &AtomicBool) {
    let mut r = Rng(seed);
    while !stop.load(Ordering::Acquire) {
        let offset = r.below(FILE_BYTES - 1);
        let len = (1 + r.below(256 << 10)).min(FILE_BYTES - offset);
        if let Err(e) = f.write_all_at(&pattern(offset, len), offset) {
            panic!("write at {offset}: {e} (did the daemon die?)");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

fn race(tag: &str, extra: &[&str]) {
    let s = Scratch::new(tag);
    let mut m = Mount::start(&s.sub("b"), &s.sub("m"), extra);
    let file = m.path("f");
    std::fs::write(&file, pattern(0, FILE_BYTES)).unwrap();

    // The writer opens first: with `--read-path passthrough` a writable open is refused
    // (ETXTBSY) while passthrough readers exist, whereas readers that open while a writer
    // holds the file are served by the daemon, which is the path under test.
    let wf = OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open writer");
    let secs = race_secs();
    // The truncating process: a shell loop of truncate(1), each a separate opener.
    let script = format!(
        "n=0; end=$(( $(date +%s) + {secs} )); \
         while [ $(date +%s) -lt $end ]; do \
           truncate -s {SHORT_BYTES} '{f}' || exit 1; truncate -s {FILE_BYTES} '{f}' || exit 1; \
           n=$((n+1)); \
         done; echo $n",
        f = file.display()
    );
    let truncator = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn truncate loop");

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for i in 0..READERS {
        let (file, stop, reads) = (file.clone(), stop.clone(), reads.clone());
        threads.push(thread::spawn(move || {
            reader(&file, 7 + i as u64, &stop, &reads)
        }));
    }
    {
        let stop = stop.clone();
        threads.push(thread::spawn(move || writer(wf, 99, &stop)));
    }
    let started = Instant::now();
    let out = truncator.wait_with_output().expect("truncate loop");
    stop.store(true, Ordering::Release);
    let mut panics = Vec::new();
    for t in threads {
        if let Err(p) = t.join() {
            panics.push(p);
        }
    }
    let daemon_running = matches!(m.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)));
    let alive = daemon_running && std::fs::metadata(m.path("f")).is_ok();
    assert!(
        alive && panics.is_empty() && out.status.success(),
        "{tag}: the mount did not survive {:.0} s of reads racing truncates \
         (truncate loop: {}, {}); daemon log:\n{}",
        started.elapsed().as_secs_f64(),
        out.status,
        String::from_utf8_lossy(&out.stderr),
        m.log_text()
    );
    if let Some(p) = panics.pop() {
        std::panic::resume_unwind(p);
    }
    let cycles: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("cycle count");
    assert!(
        cycles >= CYCLES_MIN,
        "{tag}: only {cycles} truncate cycles ran"
    );
    assert!(
        reads.load(Ordering::Relaxed) > 0,
        "{tag}: no read completed"
    );
    eprintln!(
        "{tag}: {cycles} truncate cycles, {} reads of up to 1 MiB",
        reads.load(Ordering::Relaxed)
    );

    // Still a working file system: the file reads back whole, as the pattern or zeros.
    let back = std::fs::read(&file).expect("read after the race");
    assert_eq!(back.len() as u64, FILE_BYTES);
    for (i, &b) in back.iter().enumerate() {
        assert!(b == 0 || b == pattern_byte(i as u64), "byte {i} is {b:#x}");
    }
    let st = m.umount();
    assert!(st.success(), "{tag}: unmount after the race: {st}");
}

#[test]
fn read_racing_truncate_auto() {
    race("race-auto", &[]);
}

#[test]
fn read_racing_truncate_direct() {
    race("race-direct", &["--read-path", "direct"]);
}

#[test]
fn read_racing_truncate_cached() {
    race("race-cached", &["--read-path", "cached"]);
}

#[test]
fn read_racing_truncate_passthrough() {
    race("race-pt", &["--read-path", "passthrough"]);
}

#[test]
fn read_racing_truncate_fsync_mode() {
    race("race-fsync", &["--durability", "fsync"]);
}

/// A directory deleted while a process has it as its working directory, and a new one that
/// gets its inode number on the backing: the kernel must keep them apart. Node ids are
/// backing inode numbers, and the kernel tells two inodes of one node id apart by
/// generation only; before, every generation was 0, so the new directory merged with the
/// deleted one the kernel still held (the process's working directory turned into the new
/// directory).
#[test]
fn a_new_directory_reusing_a_held_deleted_ones_inode_number_stays_apart() {
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let s = Scratch::new("reuse-ino");
    // A fresh journalled ext4 of its own: ext4 gives a new directory the lowest free
    // inode of its parent's group, so the deleted one's number comes back at the first
    // mkdir. On a shared file system other inodes may be free below it, and one without a
    // journal (these machines' root) skips inodes deleted in the last minute.
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir(&backing).expect("backing");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    fs::create_dir(m.path("d")).expect("mkdir d");
    let old_ino = fs::metadata(backing.join("d")).expect("d").ino();
    let mut held = std::process::Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && echo in && read x")
        .arg("sh")
        .arg(m.path("d"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("holder");
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(held.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("holder");
    assert_eq!(line.trim(), "in");
    fs::remove_dir(m.path("d")).expect("rmdir d");
    let mut reused = None;
    for i in 0..200 {
        let name = format!("e{i}");
        fs::create_dir(m.path(&name)).expect("mkdir");
        if fs::metadata(backing.join(&name)).expect("e").ino() == old_ino {
            reused = Some(name);
            break;
        }
    }
    let cwd = fs::read_link(format!("/proc/{}/cwd", held.id())).expect("cwd");
    held.stdin.take().expect("stdin").write_all(b"\n").ok();
    let _ = held.wait();
    let Some(name) = reused else {
        dhrd_testkit::skip(format!(
            "the backing file system gave no new directory inode {old_ino} in 200 tries"
        ));
        return;
    };
    // The holder's directory is the deleted one, not the new directory.
    assert!(
        cwd.to_string_lossy().ends_with("(deleted)"),
        "the deleted directory merged with {name}: the holder's cwd is {}",
        cwd.display()
    );
    fs::write(m.path(&name).join("x"), b"x").expect("a file in the new directory");
    let names: Vec<_> = fs::read_dir(m.path(&name))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("x")]);
    drop(m);
}
