//! SPEC D3 across processes for every read path: a read that starts after a write returned
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
    let pt = read_path == "passthrough";

    // A writer descriptor, then a read-only descriptor and a read-only shared mapping.
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f)
        .expect("rw open");
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

    // 2. A writable shared mapping: stores reach other processes after msync. (With
    // passthrough opens on the inode the kernel refuses a caching mmap: documented.)
    match Map::new(rw.as_raw_fd(), FILE_BYTES, true) {
        Some(rw_map) => {
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
        }
        None => {
            assert!(
                pt,
                "{read_path}: writable mmap failed: {}",
                std::io::Error::last_os_error()
            );
            rw.write_all_at(b"D", (5 * PAGE) as u64).expect("pwrite D");
        }
    }

    // 3. Another process writes; this process reads through its read-only descriptor.
    let (ok, out) = try_child_write(&f, 2, b'B');
    if pt {
        // Kernel rule: no non-passthrough open while passthrough opens exist.
        assert!(
            !ok && out.contains("Text file busy"),
            "passthrough: writer must get ETXTBSY: {out}"
        );
        drop(ro_map);
        drop(ro);
        let (ok, out) = try_child_write(&f, 2, b'B');
        assert!(ok, "writer after the passthrough readers closed: {out}");
        let ro = OpenOptions::new().read(true).open(&f).expect("ro open");
        ro.read_exact_at(&mut buf, (2 * PAGE) as u64)
            .expect("pread");
        assert!(buf.iter().all(|b| *b == b'B'));
    } else {
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
    }

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
