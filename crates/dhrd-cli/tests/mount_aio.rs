//! Asynchronous direct I/O through the mount (io_uring; libaio takes the same kernel path),
//! as databases and VMs (`aio=native`) submit it: one process, many I/Os in flight. The
//! kernel sends an asynchronous O_DIRECT request to the daemon without waiting for the
//! previous one only if the daemon negotiated `FUSE_ASYNC_DIO` at INIT; otherwise it serves
//! each one synchronously in the submitter, so a queue depth of 24 reaches the daemon one
//! request at a time. Such requests are background requests, so the kernel also holds back
//! all beyond `max_background` (16 unless the daemon raises it).
//!
//! As in mount_writers.rs, the backing ext4 is frozen (`fsfreeze`) so that the writes pile
//! up in the daemon, and `dhrd status` counts how many got there at once, without timing.
//! Both data paths are counted: on the page cache path the daemon serves O_DIRECT opens.
//! Reads are checked for their data only: on the engine they come from RAM, and a frozen
//! file system holds writes, not reads, so nothing keeps them in the daemon to be counted
//! (and the daemon counts only writes).
//!
//! Crash and failure semantics (docs/crash-model.md): a large asynchronous write is split
//! into `max_write` pieces sent in parallel; once it completes with O_DSYNC every piece is
//! durable; a failing piece fails the whole I/O and leaves the mount's sticky failure (C4).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::freeze::{wait_for_writes_at_once, writes_at_once, Frozen};
use common::*;
use io_uring::{opcode, types, IoUring};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;

/// I/Os in flight at once: more than the kernel's default `max_background` (16), fewer
/// than the daemon's 32 workers.
const DEPTH: usize = 24;
const BLOCK_BYTES: usize = 4096;
/// The mount's `max_write` (dhrd-fuse `MAX_WRITE_BYTES`): the size of one WRITE request.
const PIECE_BYTES: usize = 1 << 20;
/// One large write: `LARGE_BYTES / PIECE_BYTES` pieces.
const LARGE_BYTES: usize = 4 << 20;
/// Where the large write goes in its file (past the first block, which opens the object).
const LARGE_AT: u64 = 1 << 20;
const FILE_BYTES: usize = 8 << 20;

/// A buffer aligned for O_DIRECT.
struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn filled(len: usize, byte: impl Fn(usize) -> u8) -> Self {
        let v = vec![0u8; len + BLOCK_BYTES];
        let off = v.as_ptr().align_offset(BLOCK_BYTES);
        let mut a = Self { v, off, len };
        for (i, b) in a.v[off..off + len].iter_mut().enumerate() {
            *b = byte(i);
        }
        a
    }

    fn bytes(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

#[derive(Clone, Copy)]
enum Op {
    Write,
    Read,
}

/// Submits every I/O of `ios` (file offset, buffer) on one ring in one call, then waits
/// for all of them; each one's result (bytes, or minus the errno), in submission order.
fn submit_all(f: &fs::File, op: Op, ios: &mut [(u64, Aligned)]) -> Vec<i32> {
    let n = ios.len();
    let mut ring = IoUring::new(n.next_power_of_two() as u32).expect("io_uring_setup");
    for (i, (at, buf)) in ios.iter_mut().enumerate() {
        let fd = types::Fd(f.as_raw_fd());
        let len = buf.len as u32;
        let ptr = buf.v[buf.off..].as_mut_ptr();
        let e = match op {
            Op::Write => opcode::Write::new(fd, ptr, len).offset(*at).build(),
            Op::Read => opcode::Read::new(fd, ptr, len).offset(*at).build(),
        };
        // SAFETY: the buffers and the file outlive the ring's use of them: this function
        // waits for every completion before it returns.
        unsafe { ring.submission().push(&e.user_data(i as u64)) }.expect("ring full");
    }
    let mut res = vec![None; n];
    let mut done = 0;
    ring.submit().expect("io_uring_enter");
    while done < n {
        ring.submit_and_wait(1).expect("io_uring_enter");
        for c in ring.completion() {
            res[c.user_data() as usize] = Some(c.result());
            done += 1;
        }
    }
    res.into_iter().map(|r| r.expect("a completion")).collect()
}

fn open_direct(path: &std::path::Path, extra_flags: i32) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | extra_flags)
        .open(path)
        .expect("open O_DIRECT")
}

fn block_pattern(i: usize) -> u8 {
    b'a' + (i % 26) as u8
}

/// The large write's byte `i`: differs per piece and within one.
fn large_pattern(i: usize) -> u8 {
    ((i / PIECE_BYTES) * 31 + i % 251) as u8
}

/// A backing ext4 on a loop device with file `f` of `FILE_BYTES` zeros, durable before
/// the mount, and a mount on `read_path` in `sync` durability over it.
fn mount_on(s: &Scratch, read_path: &str) -> (LoopFs, std::path::PathBuf, Mount) {
    let disk = LoopFs::new(s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    fs::write(backing.join("f"), vec![0u8; FILE_BYTES]).expect("f");
    let (ok, out) = sh(&format!("sync -f {}", backing.display()));
    assert!(ok, "sync: {out}");
    let mnt = s.sub("mnt");
    let args = ["--quiet", "--read-path", read_path, "--durability", "sync"];
    let m = Mount::start(&backing, &mnt, &args);
    m.wait_loaded();
    (disk, backing, m)
}

/// Opens `f` on the mount with O_DIRECT and `extra_flags`, and writes its first block
/// synchronously (this opens the object's backing descriptor): only the writes under test
/// are to wait on a frozen backing.
fn open_and_touch(m: &Mount, extra_flags: i32) -> fs::File {
    let f = open_direct(&m.path("f"), extra_flags);
    let first = Aligned::filled(BLOCK_BYTES, |_| 1);
    f.write_all_at(first.bytes(), 0).expect("first write");
    assert_eq!(writes_at_once(m), 1, "one write so far");
    f
}

#[test]
fn async_direct_writes_of_one_process_are_in_the_daemon_at_once_on_the_engine() {
    depth("engine-direct");
}

/// On the page cache path the daemon serves O_DIRECT opens itself (docs/fuse.md).
#[test]
fn async_direct_writes_of_one_process_are_in_the_daemon_at_once_on_the_page_cache_path() {
    depth("pagecache");
}

fn depth(read_path: &str) {
    let s = Scratch::new(&format!("aio-depth-{read_path}"));
    let (disk, backing, m) = mount_on(&s, read_path);
    let f = open_and_touch(&m, 0);

    let frozen = Frozen::new(&disk.mnt);
    // Disjoint 4 KiB blocks of one chunk: the engine's range locks let them all through.
    let mut ios: Vec<(u64, Aligned)> = (0..DEPTH)
        .map(|i| {
            let at = ((i + 1) * BLOCK_BYTES) as u64;
            (at, Aligned::filled(BLOCK_BYTES, |_| block_pattern(i)))
        })
        .collect();
    let submitter = std::thread::spawn(move || {
        let res = submit_all(&f, Op::Write, &mut ios);
        (f, res)
    });
    let seen = wait_for_writes_at_once(&m, DEPTH as u64);
    drop(frozen);
    let (f, res) = submitter.join().expect("submitter");
    assert!(
        res.iter().all(|&r| r == BLOCK_BYTES as i32),
        "async writes: {res:?}"
    );
    assert_eq!(
        seen, DEPTH as u64,
        "{seen} of {DEPTH} asynchronous direct writes of one process reached the daemon at \
         once; the kernel held the rest (no FUSE_ASYNC_DIO, or max_background below the depth)"
    );

    // Read back at the same depth, asynchronously and O_DIRECT, then on the backing.
    let mut reads: Vec<(u64, Aligned)> = (0..DEPTH)
        .map(|i| {
            (
                ((i + 1) * BLOCK_BYTES) as u64,
                Aligned::filled(BLOCK_BYTES, |_| 0),
            )
        })
        .collect();
    let res = submit_all(&f, Op::Read, &mut reads);
    assert!(
        res.iter().all(|&r| r == BLOCK_BYTES as i32),
        "async reads: {res:?}"
    );
    let on_backing = fs::read(backing.join("f")).expect("read the backing");
    for (i, (at, buf)) in reads.iter().enumerate() {
        let want = vec![block_pattern(i); BLOCK_BYTES];
        assert_eq!(buf.bytes(), &want[..], "block {i} via the mount");
        let at = *at as usize;
        assert_eq!(
            &on_backing[at..at + BLOCK_BYTES],
            &want[..],
            "block {i} on the backing"
        );
    }
    drop(f);
    assert!(m.umount().success(), "daemon exit");
}

#[test]
fn a_large_async_dsync_write_goes_in_parallel_pieces_and_is_durable_when_it_completes() {
    let s = Scratch::new("aio-large");
    let (disk, backing, m) = mount_on(&s, "engine-direct");
    let f = open_and_touch(&m, libc::O_DSYNC);
    let pieces = (LARGE_BYTES / PIECE_BYTES) as u64;

    let frozen = Frozen::new(&disk.mnt);
    let mut ios = vec![(LARGE_AT, Aligned::filled(LARGE_BYTES, large_pattern))];
    let submitter = std::thread::spawn(move || {
        let res = submit_all(&f, Op::Write, &mut ios);
        (f, ios, res)
    });
    let seen = wait_for_writes_at_once(&m, pieces);
    drop(frozen);
    let (f, ios, res) = submitter.join().expect("submitter");
    assert_eq!(res, [LARGE_BYTES as i32], "the large write");
    assert_eq!(
        seen, pieces,
        "{seen} of the {pieces} pieces of one asynchronous write were in the daemon at once"
    );
    let want = ios[0].1.bytes().to_vec();
    let at = LARGE_AT as usize;
    let on_backing = fs::read(backing.join("f")).expect("read the backing");
    assert!(
        on_backing[at..at + LARGE_BYTES] == want[..],
        "the completed write is not all on the backing"
    );
    drop(f);

    // Completed with O_DSYNC: all of it survives a power cut right after.
    disk.cut();
    // The daemon's unmount-time sync fails on the dead disk: its exit status says so.
    let _ = Command::new(dhrd()).arg("umount").arg(&m.mnt).output();
    drop(m);
    disk.remount();
    let after = fs::read(backing.join("f")).expect("read after the cut");
    assert!(
        after[at..at + LARGE_BYTES] == want[..],
        "a completed O_DSYNC write did not survive the power cut"
    );
}

#[test]
fn a_failing_large_async_write_fails_whole_and_the_mount_stays_failed() {
    let s = Scratch::new("aio-eio");
    let (disk, _backing, m) = mount_on(&s, "engine-direct");
    let f = open_and_touch(&m, libc::O_DSYNC);

    disk.shut_down();
    let mut ios = vec![(LARGE_AT, Aligned::filled(LARGE_BYTES, large_pattern))];
    let res = submit_all(&f, Op::Write, &mut ios);
    assert_eq!(
        res,
        [-libc::EIO],
        "a large write on a dead disk must fail as a whole"
    );
    // Sticky (C4): later writes fail too, asynchronous or not.
    let res = submit_all(
        &f,
        Op::Write,
        &mut [(0, Aligned::filled(BLOCK_BYTES, |_| 2))],
    );
    assert!(
        res == [-libc::EIO] || res == [-libc::EROFS],
        "a later async write: {res:?}"
    );
    let err = f
        .write_all_at(Aligned::filled(BLOCK_BYTES, |_| 3).bytes(), 0)
        .expect_err("writes stay refused");
    assert!(
        matches!(err.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)),
        "{err}"
    );
    // RAM holds nothing of the failed write: reads (from RAM) show what was there.
    let mut got = vec![
        (0, Aligned::filled(BLOCK_BYTES, |_| 9)),
        (LARGE_AT, Aligned::filled(LARGE_BYTES, |_| 9)),
    ];
    let res = submit_all(&f, Op::Read, &mut got);
    assert_eq!(res, [BLOCK_BYTES as i32, LARGE_BYTES as i32], "reads");
    assert!(got[0].1.bytes().iter().all(|&b| b == 1), "first block");
    assert!(
        got[1].1.bytes().iter().all(|&b| b == 0),
        "the failed write reached RAM"
    );
    drop(f);
    let st = m.status();
    assert!(
        st.contains("read-only:") && !st.contains("read-only:       no"),
        "status must report the failure: {st}"
    );
    let _ = Command::new(dhrd()).arg("umount").arg(&m.mnt).output();
    drop(m);
}
