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
        "auto" | "passthrough" => assert!(
            passthrough_opens(&st) >= 1,
            "{read_path}: expected passthrough opens: {st}"
        ),
        _ => assert_eq!(
            passthrough_opens(&st),
            0,
            "{read_path}: no passthrough expected: {st}"
        ),
    }
    // While a passthrough reader holds a file, a writer is refused: the kernel would send
    // its writes around the daemon (documented in docs/fuse.md).
    let held = fs::File::open(mnt.join("ro")).expect("hold ro");
    let (ok, out) = try_child_write(&mnt.join("ro"), 0, b'W');
    if matches!(read_path, "auto" | "passthrough") {
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
fn d3_auto() {
    d3_for("auto");
}

#[test]
fn d3_passthrough() {
    d3_for("passthrough");
}

#[test]
fn d3_direct() {
    d3_for("direct");
}

#[test]
fn d3_cached() {
    d3_for("cached");
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
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", "passthrough"]);
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
fn reader_after_growth_auto() {
    reader_after_growth("auto");
}

#[test]
fn reader_after_growth_passthrough() {
    reader_after_growth("passthrough");
}

/// Readers that open a read-only file at the same moment all get passthrough, from the
/// first round on (the file starts as a parked copy): concurrent first opens must not
/// build a second object that finds the parked copy gone and loads from the disk, and an
/// open that is counted but not yet decided must not push another to the direct path.
#[test]
fn concurrent_readers_all_get_passthrough() {
    const ROUNDS: usize = 100;
    const READERS: usize = 4;
    let s = Scratch::new("pt-concurrent");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let f = backing.join("ro");
    fs::write(&f, vec![b'R'; FILE_BYTES]).expect("seed");
    fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o444)).expect("chmod");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
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

/// Read-only opens of a file without an object are served from its parked copy; D3 still
/// holds: a write by another process, a truncate(2) by path, and an O_TRUNC open all show
/// through such an open at once. After the file is unlinked, it keeps its bytes. lseek,
/// fsync and copy_file_range work on it.
#[test]
fn parked_readers_see_writes_and_keep_bytes_after_unlink() {
    let s = Scratch::new("parked-readers");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    for name in ["w", "t", "o", "u", "c"] {
        fs::write(backing.join(name), vec![b'a'; 3000]).expect("seed");
    }
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let parked_opens = || {
        let st = m.status();
        st.lines()
            .find(|l| l.starts_with("opens:"))
            .and_then(|l| l.split("from parked copies ").nth(1))
            .and_then(|x| x.split(';').next())
            .and_then(|x| x.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no parked count: {st}"))
    };
    let open = |n: &str| fs::File::open(mnt.join(n)).expect("open");
    let mut buf = [0u8; 8];

    // Another process writes: the reader sees it.
    let w = open("w");
    assert_eq!(parked_opens(), 1, "{}", m.status());
    w.read_exact_at(&mut buf, 100).expect("read w");
    assert_eq!(&buf, b"aaaaaaaa");
    let (ok, out) = sh(&format!(
        "printf bbbbbbbbbbbb | dd of={} bs=1 seek=100 conv=notrunc status=none",
        mnt.join("w").display()
    ));
    assert!(ok, "{out}");
    w.read_exact_at(&mut buf, 100)
        .expect("read w after the write");
    assert_eq!(
        &buf, b"bbbbbbbb",
        "a parked reader must see another process's write"
    );

    // truncate(2) by path, then an O_TRUNC open with a new content.
    let t = open("t");
    let c = std::ffi::CString::new(mnt.join("t").as_os_str().as_encoded_bytes()).expect("c");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 10) }, 0);
    assert_eq!(t.read_at(&mut buf, 100).expect("read past the end"), 0);
    let o = open("o");
    fs::write(mnt.join("o"), b"new").expect("O_TRUNC write");
    let mut all = Vec::new();
    std::io::Read::read_to_end(&mut &o, &mut all).expect("read o");
    assert_eq!(all, b"new");

    // Unlinked while open: the reader keeps the old bytes, also after a new file appears.
    let u = open("u");
    fs::remove_file(mnt.join("u")).expect("unlink");
    fs::write(mnt.join("u2"), vec![b'z'; 3000]).expect("new file");
    u.read_exact_at(&mut buf, 2000).expect("read unlinked");
    assert_eq!(&buf, b"aaaaaaaa");

    // lseek, fsync, copy_file_range from a parked reader.
    let cf = open("c");
    let fd = cf.as_raw_fd();
    // SAFETY: our descriptor.
    let (data, hole) = unsafe {
        (
            libc::lseek(fd, 5, libc::SEEK_DATA),
            libc::lseek(fd, 5, libc::SEEK_HOLE),
        )
    };
    assert_eq!((data, hole), (5, 3000));
    cf.sync_all().expect("fsync of a read-only open");
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(mnt.join("c-copy"))
        .expect("dst");
    let (mut off_in, mut off_out) = (0i64, 0i64);
    // SAFETY: our descriptors and offsets.
    let n =
        unsafe { libc::copy_file_range(fd, &mut off_in, dst.as_raw_fd(), &mut off_out, 3000, 0) };
    assert_eq!(n, 3000, "{}", std::io::Error::last_os_error());
    drop(dst);
    assert_eq!(
        fs::read(mnt.join("c-copy")).expect("copy"),
        vec![b'a'; 3000]
    );
    assert_eq!(parked_opens(), 5, "{}", m.status());

    drop((w, t, o, u, cf));
    assert!(m.umount().success());
    let b = fs::read(backing.join("w")).expect("backing w");
    assert_eq!(&b[100..112], b"bbbbbbbbbbbb");
    assert_eq!(fs::metadata(backing.join("t")).expect("t").len(), 10);
}
