//! D3 across processes for every read path: a read that starts after a write returned
//! sees it, whether the write came from another process, another descriptor, or a shared
//! mapping; the reader may be a passthrough open, a direct open, a cached open or a mapping.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

const FILE_BYTES: usize = 1 << 20;
const PAGE: usize = 4096;

fn child_read(file: &Path, offset_pages: usize) -> Vec<u8> {
    let o = std::process::Command::new("dd")
        .arg(format!("if={}", file.display()))
        .arg(format!("bs={PAGE}"))
        .arg(format!("skip={offset_pages}"))
        .arg("count=1")
        .arg("status=none")
        .output()
        .expect("dd read");
    o.stdout
}

struct Map {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Map {
    fn new(fd: i32, len: usize, writable: bool) -> Option<Map> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping a file descriptor we own; the result is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            None
        } else {
            Some(Map { ptr, len })
        }
    }
    fn byte(&self, off: usize) -> u8 {
        assert!(off < self.len);
        // SAFETY: in bounds of a live mapping; volatile so each check re-reads memory.
        unsafe { std::ptr::read_volatile((self.ptr as *const u8).add(off)) }
    }
    fn set(&self, off: usize, v: u8) {
        assert!(off < self.len);
        // SAFETY: in bounds of a live writable mapping.
        unsafe { std::ptr::write_volatile((self.ptr as *mut u8).add(off), v) }
    }
    fn sync(&self) {
        // SAFETY: the live mapping.
        unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) };
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn try_child_write(file: &Path, offset_pages: usize, byte: u8) -> (bool, String) {
    let src = file
        .parent()
        .and_then(|p| p.parent())
        .unwrap_or(Path::new("/tmp"))
        .join(format!("src{byte}"));
    fs::write(&src, vec![byte; PAGE]).expect("src");
    let r = sh(&format!(
        "dd if={} of={} bs={PAGE} seek={offset_pages} count=1 conv=notrunc status=none",
        src.display(),
        file.display()
    ));
    let _ = fs::remove_file(&src);
    r
}

fn open_rw(p: &Path) -> fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .expect("rw open")
}

fn passthrough_opens(status: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with("opens:"))
        .and_then(|l| l.split("passthrough ").nth(1))
        .and_then(|x| x.split(',').next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or(0)
}

fn d3_for(read_path: &str) {
    let s = Scratch::new(&format!("d3-{read_path}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("f"), vec![b'A'; FILE_BYTES]).expect("seed");
    fs::write(backing.join("ro"), vec![b'R'; FILE_BYTES]).expect("seed ro");
    fs::set_permissions(
        backing.join("ro"),
        std::os::unix::fs::PermissionsExt::from_mode(0o444),
    )
    .expect("chmod");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    m.wait_loaded();
    let f = mnt.join("f");

    // A writer descriptor, then a read-only descriptor and a read-only shared mapping.
    let rw = open_rw(&f);
    let ro = OpenOptions::new().read(true).open(&f).expect("ro open");
    let ro_map = Map::new(ro.as_raw_fd(), FILE_BYTES, false).expect("read-only mmap");
    assert_eq!(ro_map.byte(2 * PAGE), b'A');

    // 1. write() here; another process and the other descriptor and the mapping read it.
    rw.write_all_at(&vec![b'C'; PAGE], 0).expect("pwrite");
    assert!(
        child_read(&f, 0).iter().all(|b| *b == b'C'),
        "{read_path}: other process reads our write"
    );
    let mut buf = vec![0u8; PAGE];
    ro.read_exact_at(&mut buf, 0).expect("pread");
    assert!(
        buf.iter().all(|b| *b == b'C'),
        "{read_path}: other descriptor reads our write"
    );
    assert_eq!(
        ro_map.byte(5),
        b'C',
        "{read_path}: mapping sees a write() through another fd"
    );

    // 2. A writable shared mapping: stores reach other processes after msync. (The
    //    read-only open above could not be a passthrough one: the writer was open first.)
    let rw_map = Map::new(rw.as_raw_fd(), FILE_BYTES, true).expect("writable mmap");
    rw_map.set(5 * PAGE, b'D');
    rw_map.sync();
    assert_eq!(
        child_read(&f, 5).first().copied(),
        Some(b'D'),
        "{read_path}: msync'ed store seen by another process"
    );
    assert_eq!(
        ro_map.byte(5 * PAGE),
        b'D',
        "{read_path}: msync'ed store seen by the read-only mapping"
    );
    drop(rw_map);

    // 3. Another process writes; this process reads through its read-only descriptor.
    let (ok, out) = try_child_write(&f, 2, b'B');
    assert!(ok, "{read_path}: dd write failed: {out}");
    ro.read_exact_at(&mut buf, (2 * PAGE) as u64)
        .expect("pread");
    assert!(
        buf.iter().all(|b| *b == b'B'),
        "{read_path}: pread after another process's write"
    );
    assert_eq!(
        ro_map.byte(2 * PAGE + 7),
        b'B',
        "{read_path}: read-only mapping after another process's write"
    );
    drop(ro_map);
    drop(ro);

    // 4. A fresh open by another process after all of it sees everything.
    let all = fs::read(&f).expect("read all");
    assert_eq!(
        (all[0], all[2 * PAGE], all[5 * PAGE], all[FILE_BYTES - 1]),
        (b'C', b'B', b'D', b'A')
    );
    // A read-only file: passthrough in auto and passthrough modes.
    assert_eq!(
        fs::read(mnt.join("ro")).expect("ro file"),
        vec![b'R'; FILE_BYTES]
    );

    let st = m.status();
    match read_path {
        "pagecache" | "engine-auto" | "engine-passthrough" => assert!(
            passthrough_opens(&st) >= 1,
            "{read_path}: expected passthrough opens: {st}"
        ),
        _ => assert_eq!(
            passthrough_opens(&st),
            0,
            "{read_path}: no passthrough expected: {st}"
        ),
    }
    // On the engine's passthrough paths, while a passthrough reader holds a file, a
    // writer is refused: the kernel would send its writes around the daemon (documented
    // in docs/fuse.md). On the page cache path every open is passed through, writers too.
    let held = fs::File::open(mnt.join("ro")).expect("hold ro");
    let (ok, out) = try_child_write(&mnt.join("ro"), 0, b'W');
    if matches!(read_path, "engine-auto" | "engine-passthrough") {
        assert_eq!(passthrough_opens(&m.status()), passthrough_opens(&st) + 1);
        assert!(
            !ok && out.contains("Text file busy"),
            "{read_path}: writer beside a passthrough reader: {out}"
        );
    } else {
        assert!(ok, "{read_path}: writer of a read-only file as root: {out}");
    }
    drop(held);
    drop(rw);
    let code = m.umount();
    assert!(code.success());
    // The durable copy has every write.
    let b = fs::read(backing.join("f")).expect("backing");
    assert_eq!((b[0], b[2 * PAGE], b[5 * PAGE]), (b'C', b'B', b'D'));
}

#[test]
fn d3_pagecache() {
    d3_for("pagecache");
}

#[test]
fn d3_engine_auto() {
    d3_for("engine-auto");
}

#[test]
fn d3_engine_passthrough() {
    d3_for("engine-passthrough");
}

#[test]
fn d3_engine_direct() {
    d3_for("engine-direct");
}

#[test]
fn d3_engine_cached() {
    d3_for("engine-cached");
}

/// The kernel fails an open with EIO when the server's reply does not fit the inode's I/O
/// mode (fs/fuse/iomode.c): a passthrough open while another open of the inode has it
/// mapped through the page cache, or a non-passthrough open while passthrough opens exist.
/// Both orders must give the opener a working descriptor instead.
#[test]
fn passthrough_reader_after_a_mapping_writer() {
    let s = Scratch::new("pt-after-map");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("f"), vec![b'A'; FILE_BYTES]).expect("seed");
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--read-path", "engine-passthrough"],
    );
    m.wait_loaded();
    let mut buf = vec![0u8; PAGE];
    let f = mnt.join("f");
    let rw = open_rw(&f);
    let rw_map = Map::new(rw.as_raw_fd(), FILE_BYTES, true).expect("writable mmap");
    rw_map.set(3 * PAGE, b'M');
    rw_map.sync();
    let ro = OpenOptions::new()
        .read(true)
        .open(&f)
        .expect("read-only open while a writer maps the file");
    ro.read_exact_at(&mut buf, (3 * PAGE) as u64)
        .expect("pread");
    assert_eq!(buf[0], b'M');
    assert_eq!(child_read(&f, 3).first().copied(), Some(b'M'));
    drop(ro);
    drop(rw_map);
    drop(rw);
    // With the writer gone, readers get passthrough again.
    let before = passthrough_opens(&m.status());
    assert_eq!(fs::read(&f).expect("read")[3 * PAGE], b'M');
    assert_eq!(passthrough_opens(&m.status()), before + 1, "{}", m.status());
    assert!(m.umount().success());
}

/// A passthrough reader holds a read-only file; the file grows by truncate(2) (its new
/// tail is not loaded at once) and another reader opens: it must get a descriptor that
/// reads the old bytes and the new zeros, through read and through mmap.
fn reader_after_growth(read_path: &str) {
    let s = Scratch::new(&format!("pt-grow-{read_path}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let g = backing.join("g");
    fs::write(&g, vec![b'G'; FILE_BYTES]).expect("seed g");
    fs::set_permissions(&g, std::os::unix::fs::PermissionsExt::from_mode(0o444)).expect("chmod");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    m.wait_loaded();
    let mut buf = vec![0u8; PAGE];
    let g = mnt.join("g");
    let ro1 = OpenOptions::new().read(true).open(&g).expect("ro1");
    assert!(passthrough_opens(&m.status()) >= 1, "{}", m.status());
    // truncate(2) by path: no open, so no ETXTBSY (truncate(1) would open for writing).
    let cpath = std::ffi::CString::new(g.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string.
    let rc = unsafe { libc::truncate(cpath.as_ptr(), (64 * FILE_BYTES) as libc::off_t) };
    assert_eq!(rc, 0, "truncate: {}", std::io::Error::last_os_error());
    let ro2 = OpenOptions::new()
        .read(true)
        .open(&g)
        .expect("read-only open after the file grew");
    ro2.read_exact_at(&mut buf, (40 * FILE_BYTES + PAGE) as u64)
        .expect("pread of the new tail");
    assert!(buf.iter().all(|b| *b == 0));
    ro1.read_exact_at(&mut buf, 0).expect("pread ro1");
    assert!(buf.iter().all(|b| *b == b'G'));
    let map = Map::new(ro2.as_raw_fd(), 2 * FILE_BYTES, false).expect("read-only mmap");
    assert_eq!((map.byte(7), map.byte(FILE_BYTES + 9)), (b'G', 0));
    drop(map);
    drop((ro1, ro2));
    assert!(m.umount().success());
}

#[test]
fn reader_after_growth_pagecache() {
    reader_after_growth("pagecache");
}

#[test]
fn reader_after_growth_engine_auto() {
    reader_after_growth("engine-auto");
}

#[test]
fn reader_after_growth_engine_passthrough() {
    reader_after_growth("engine-passthrough");
}

/// Readers that open a read-only file at the same moment all get passthrough, on both
/// paths that pass files through: on the engine, an open that is counted but not yet
/// decided must not push another to the direct path; on the page cache, concurrent first
/// opens share one registration.
fn concurrent_readers_all_get_passthrough(read_path: &str) {
    const ROUNDS: usize = 100;
    const READERS: usize = 4;
    let s = Scratch::new("pt-concurrent");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let f = backing.join("ro");
    fs::write(&f, vec![b'R'; FILE_BYTES]).expect("seed");
    fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o444)).expect("chmod");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    m.wait_loaded();
    let f = mnt.join("ro");
    for _ in 0..ROUNDS {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(READERS));
        let threads: Vec<_> = (0..READERS)
            .map(|_| {
                let (f, b) = (f.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    let file = fs::File::open(&f).expect("open");
                    let mut buf = [0u8; 16];
                    file.read_exact_at(&mut buf, 4096).expect("read");
                    assert_eq!(buf, [b'R'; 16]);
                    // Hold the open until every reader has one.
                    b.wait();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("reader");
        }
    }
    let st = m.status();
    assert_eq!(passthrough_opens(&st), (ROUNDS * READERS) as u64, "{st}");
    assert!(m.umount().success());
}

#[test]
fn concurrent_readers_all_get_passthrough_pagecache() {
    concurrent_readers_all_get_passthrough("pagecache");
}

#[test]
fn concurrent_readers_all_get_passthrough_engine() {
    concurrent_readers_all_get_passthrough("engine-auto");
}
