//! POSIX operations on a dhrd mount compared with the same operations on a plain directory
//! (real FUSE mount; needs root and /dev/fuse).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path")
}

fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn meta_line(p: &Path) -> String {
    match fs::symlink_metadata(p) {
        Ok(m) => format!(
            "type={:o} mode={:o} size={} nlink={} uid={} gid={}",
            m.mode() & libc::S_IFMT,
            m.mode() & 0o7777,
            if m.is_dir() { 0 } else { m.size() },
            if m.is_dir() { 0 } else { m.nlink() },
            m.uid(),
            m.gid()
        ),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn listing(p: &Path) -> String {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| format!("{:?}", e.file_name()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(",")
}

fn rename2(a: &Path, b: &Path, flags: u32) -> String {
    let (ca, cb) = (cpath(a), cpath(b));
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        "ok".into()
    } else {
        format!(
            "errno {}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        )
    }
}

/// Runs the same sequence of operations below `root` and returns a log of every result.
fn exercise(root: &Path) -> Vec<String> {
    let mut log = Vec::new();
    let p = |s: &str| root.join(s);
    macro_rules! rec {
        ($($a:tt)*) => { log.push(format!($($a)*)) };
    }
    // Regular files: create, write, read back.
    fs::write(p("a"), b"hello world").expect("write a");
    rec!("read a: {:?}", fs::read(p("a")).ok());
    rec!("meta a: {}", meta_line(&p("a")));
    // O_EXCL on an existing file.
    rec!(
        "excl: {}",
        errno_of(OpenOptions::new().write(true).create_new(true).open(p("a")))
    );
    // O_APPEND.
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(p("a"))
            .expect("append");
        f.write_all(b"+tail").expect("append write");
    }
    rec!("after append: {:?}", fs::read(p("a")).ok());
    // O_TRUNC.
    {
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(p("a"))
            .expect("trunc");
        f.write_all(b"xy").expect("w");
    }
    rec!("after trunc: {:?}", fs::read(p("a")).ok());
    // Unaligned pwrite / pread, overwrite in the middle.
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p("b"))
            .expect("b");
        f.write_all_at(&[7u8; 10_000], 3).expect("pw");
        f.write_all_at(b"MID", 5000).expect("pw2");
        let mut buf = vec![0u8; 20];
        let n = f.read_at(&mut buf, 4995).expect("pr");
        rec!("b pread: {:?}", &buf[..n]);
    }
    rec!("meta b: {}", meta_line(&p("b")));
    // truncate extend and shrink.
    {
        let f = OpenOptions::new().write(true).open(p("b")).expect("b");
        f.set_len(20_000).expect("extend");
        f.set_len(4_000).expect("shrink");
        f.set_len(6_000).expect("re-extend");
    }
    let b = fs::read(p("b")).expect("read b");
    rec!(
        "b len {} tail zero {}",
        b.len(),
        b[4000..].iter().all(|x| *x == 0)
    );
    // Sparse file: a write far past the end reads back zeros in between.
    {
        let f = File::create(p("sparse")).expect("sparse");
        f.write_all_at(b"end", 10 << 20).expect("sparse write");
        let mut buf = vec![1u8; 4096];
        f.read_at(&mut buf, 5 << 20).ok();
        rec!("sparse hole zero: {}", buf.iter().all(|x| *x == 0));
    }
    rec!("meta sparse: {}", meta_line(&p("sparse")));
    // SEEK_DATA / SEEK_HOLE see the same extents as on the plain directory (same file
    // system type), so sparse-aware copies stay sparse.
    {
        use std::os::fd::AsRawFd;
        let f = File::open(p("sparse")).expect("sparse");
        let seek = |off: i64, whence: i32| {
            // SAFETY: lseek on a descriptor we own; no memory is passed.
            let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
            if r < 0 {
                format!("err {}", std::io::Error::last_os_error())
            } else {
                r.to_string()
            }
        };
        rec!(
            "sparse seek: data@0 {} hole@0 {} data@5M {} hole@10M {} data@20M {}",
            seek(0, libc::SEEK_DATA),
            seek(0, libc::SEEK_HOLE),
            seek(5 << 20, libc::SEEK_DATA),
            seek(10 << 20, libc::SEEK_HOLE),
            seek(20 << 20, libc::SEEK_DATA)
        );
    }
    // A file over 4 GiB (sparse).
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p("big"))
            .expect("big");
        f.write_all_at(b"past4g", (5u64 << 30) + 123)
            .expect("big write");
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, (5u64 << 30) + 123)
            .expect("big read");
        rec!(
            "big: {:?} len {}",
            buf,
            f.metadata().map(|m| m.len()).unwrap_or(0)
        );
    }
    fs::remove_file(p("big")).expect("rm big");
    // copy_file_range: done by the daemon on dhrd (status counts it, see the test below),
    // by the kernel's splice copy on the plain directory; the results must agree.
    {
        use std::os::fd::AsRawFd;
        let pattern: Vec<u8> = (0..(3u32 << 20) + 17)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect();
        fs::write(p("cfr_src"), &pattern).expect("cfr_src");
        let cfr = |src: &File,
                   off_in: Option<i64>,
                   dst: &File,
                   off_out: Option<i64>,
                   len: usize,
                   flags: u32| {
            let (mut a, mut b) = (off_in.unwrap_or(0), off_out.unwrap_or(0));
            let pa = if off_in.is_some() {
                &mut a as *mut i64
            } else {
                std::ptr::null_mut()
            };
            let pb = if off_out.is_some() {
                &mut b as *mut i64
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: two descriptors we own and offsets that live across the call.
            let r = unsafe {
                libc::copy_file_range(src.as_raw_fd(), pa, dst.as_raw_fd(), pb, len, flags)
            };
            if r < 0 {
                format!("err {}", std::io::Error::last_os_error())
            } else {
                r.to_string()
            }
        };
        let rw = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p(name))
                .expect("cfr open")
        };
        let src = File::open(p("cfr_src")).expect("cfr_src open");
        // Whole file with the descriptors' offsets, looping on short copies as cp does.
        let dst = rw("cfr_whole");
        let mut total = 0u64;
        loop {
            match cfr(&src, None, &dst, None, 1 << 30, 0).parse::<u64>() {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        rec!(
            "cfr whole: {total} same {}",
            fs::read(p("cfr_whole")).ok().as_deref() == Some(&pattern[..])
        );
        // A range with explicit offsets into a short file: it grows, the gap reads zero.
        fs::write(p("cfr_part"), [5u8; 100]).expect("cfr_part");
        let part = rw("cfr_part");
        rec!(
            "cfr range: {}",
            cfr(&src, Some(1000), &part, Some(5000), 70_000, 0)
        );
        let got = fs::read(p("cfr_part")).unwrap_or_default();
        rec!(
            "cfr range result: len {} head {:?} gap zero {} body {}",
            got.len(),
            &got[..4],
            got[100..5000].iter().all(|x| *x == 0),
            got.get(5000..)
                .map(|b| b == &pattern[1000..71_000])
                .unwrap_or(false)
        );
        // Past the source's end, short at the end, inside one file, and refused cases.
        rec!(
            "cfr past eof: {}",
            cfr(&src, Some(4 << 20), &part, Some(0), 10, 0)
        );
        rec!(
            "cfr short: {}",
            cfr(&src, Some((3 << 20) + 7), &part, Some(0), 1000, 0)
        );
        let same = rw("cfr_src");
        rec!(
            "cfr same file: {}",
            cfr(&same, Some(0), &same, Some(4 << 20), 4096, 0)
        );
        rec!(
            "cfr overlap: {}",
            cfr(&same, Some(0), &same, Some(100), 4096, 0)
        );
        rec!("cfr flags: {}", cfr(&src, Some(0), &part, Some(0), 10, 1));
        let wo = OpenOptions::new()
            .write(true)
            .open(p("cfr_whole"))
            .expect("cfr wo");
        rec!(
            "cfr from write-only: {}",
            cfr(&wo, Some(0), &part, Some(0), 10, 0)
        );
        rec!(
            "cfr to read-only: {}",
            cfr(&src, Some(0), &src, Some(8 << 20), 10, 0)
        );
        let grown = fs::read(p("cfr_src")).unwrap_or_default();
        rec!(
            "cfr same file result: len {} copy {}",
            grown.len(),
            grown
                .get(4 << 20..)
                .map(|b| b == &pattern[..4096])
                .unwrap_or(false)
        );
        rec!("meta cfr_part: {}", meta_line(&p("cfr_part")));
        for n in ["cfr_src", "cfr_whole", "cfr_part"] {
            fs::remove_file(p(n)).expect("rm cfr");
        }
    }
    // fallocate mode 0 and punch hole.
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p("fa"))
            .expect("fa");
        f.write_all_at(&[9u8; 8192], 0).expect("fa w");
        // SAFETY: plain syscalls on an open descriptor.
        let r0 = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 16384) };
        // SAFETY: as above.
        let r1 = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                1000,
                3000,
            )
        };
        let mut buf = vec![0u8; 16384];
        let n = f.read_at(&mut buf, 0).unwrap_or(0);
        rec!(
            "fallocate {r0} {r1} len {n} hole {} edges {} {}",
            buf[1000..4000].iter().all(|x| *x == 0),
            buf[999],
            buf[4000]
        );
    }
    // Directories.
    fs::create_dir(p("d")).expect("mkdir");
    fs::create_dir(p("d/e")).expect("mkdir e");
    fs::write(p("d/e/f"), b"f").expect("f");
    rec!("rmdir nonempty: {}", errno_of(fs::remove_dir(p("d/e"))));
    rec!("mkdir exists: {}", errno_of(fs::create_dir(p("d"))));
    rec!("listing d: {}", listing(&p("d")));
    rec!("meta d: {}", meta_line(&p("d")));
    // Symlinks and hard links.
    std::os::unix::fs::symlink("d/e/f", p("sl")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent/target", p("dangling")).expect("symlink2");
    rec!("readlink: {:?}", fs::read_link(p("sl")).ok());
    rec!("through link: {:?}", fs::read(p("sl")).ok());
    rec!(
        "meta sl: {}",
        meta_line(&p("sl")).split(" uid").next().unwrap_or("")
    );
    rec!("dangling: {}", errno_of(fs::read(p("dangling"))));
    fs::hard_link(p("d/e/f"), p("hl")).expect("link");
    rec!("meta hl: {}", meta_line(&p("hl")));
    rec!(
        "same ino: {}",
        fs::metadata(p("hl")).map(|m| m.ino()).ok()
            == fs::metadata(p("d/e/f")).map(|m| m.ino()).ok()
    );
    fs::write(p("hl"), b"via link").expect("write via link");
    rec!("other name sees it: {:?}", fs::read(p("d/e/f")).ok());
    // Hard links of a symlink (no data object to fall back on): unlinking the name seen
    // last leaves the other name working.
    std::os::unix::fs::symlink("target", p("s1")).expect("s1");
    fs::hard_link(p("s1"), p("s2")).expect("link s2");
    rec!(
        "s2: {}",
        meta_line(&p("s2")).split(" uid").next().unwrap_or("")
    );
    rec!(
        "s1: {}",
        meta_line(&p("s1")).split(" uid").next().unwrap_or("")
    );
    fs::remove_file(p("s1")).expect("rm s1");
    rec!(
        "s2 after rm s1: {} -> {:?}",
        meta_line(&p("s2")).split(" uid").next().unwrap_or(""),
        fs::read_link(p("s2")).ok()
    );
    // Renames.
    fs::write(p("r1"), b"one").expect("r1");
    fs::write(p("r2"), b"two").expect("r2");
    rec!(
        "noreplace: {}",
        rename2(&p("r1"), &p("r2"), libc::RENAME_NOREPLACE)
    );
    rec!(
        "exchange: {}",
        rename2(&p("r1"), &p("r2"), libc::RENAME_EXCHANGE)
    );
    rec!(
        "after exchange: {:?} {:?}",
        fs::read(p("r1")).ok(),
        fs::read(p("r2")).ok()
    );
    rec!("overwrite: {}", errno_of(fs::rename(p("r1"), p("r2"))));
    rec!(
        "after overwrite: {:?} {:?}",
        fs::read(p("r1")).ok(),
        fs::read(p("r2")).ok()
    );
    rec!("dir rename: {}", errno_of(fs::rename(p("d"), p("d2"))));
    rec!("moved child: {:?}", fs::read(p("d2/e/f")).ok());
    rec!("cross dir: {}", errno_of(fs::rename(p("r2"), p("d2/e/r2"))));
    rec!("listing d2/e: {}", listing(&p("d2/e")));
    // Unlink of an open file: the holder keeps reading and writing.
    {
        fs::write(p("open"), b"still here").expect("open file");
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p("open"))
            .expect("open");
        fs::remove_file(p("open")).expect("unlink open");
        rec!("unlinked stat: {}", errno_of(fs::metadata(p("open"))));
        let mut s = String::new();
        f.read_to_string(&mut s).ok();
        f.write_all(b"!").ok();
        f.seek(SeekFrom::Start(0)).ok();
        let mut s2 = String::new();
        f.read_to_string(&mut s2).ok();
        rec!(
            "open after unlink: {s:?} {s2:?} nlink {}",
            f.metadata().map(|m| m.nlink()).unwrap_or(99)
        );
    }
    // chmod, chown, utimens.
    fs::set_permissions(p("a"), fs::Permissions::from_mode(0o640)).expect("chmod");
    std::os::unix::fs::chown(p("a"), Some(1234), Some(5678)).expect("chown");
    std::os::unix::fs::lchown(p("sl"), Some(4321), Some(8765)).expect("lchown");
    {
        let f = File::options().write(true).open(p("a")).expect("a");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
            .expect("utimens");
    }
    let m = fs::metadata(p("a")).expect("meta");
    rec!(
        "after chmod/chown/utime: {} mtime {}",
        meta_line(&p("a")),
        m.mtime()
    );
    rec!("lchown: {}", meta_line(&p("sl")));
    // xattrs.
    {
        let (ca, n1, n2) = (
            cpath(&p("a")),
            CString::new("user.k1").unwrap(),
            CString::new("user.k2").unwrap(),
        );
        // SAFETY: valid paths, names and buffers.
        unsafe {
            let r1 = libc::setxattr(ca.as_ptr(), n1.as_ptr(), b"v1".as_ptr().cast(), 2, 0);
            let r2 = libc::setxattr(ca.as_ptr(), n2.as_ptr(), b"value2".as_ptr().cast(), 6, 0);
            let r3 = libc::setxattr(
                ca.as_ptr(),
                n1.as_ptr(),
                b"x".as_ptr().cast(),
                1,
                libc::XATTR_CREATE,
            );
            let mut buf = [0u8; 64];
            let g = libc::getxattr(ca.as_ptr(), n2.as_ptr(), buf.as_mut_ptr().cast(), 64);
            let sz = libc::getxattr(ca.as_ptr(), n2.as_ptr(), std::ptr::null_mut(), 0);
            let mut lb = [0u8; 256];
            let l = libc::listxattr(ca.as_ptr(), lb.as_mut_ptr().cast(), 256);
            let mut names: Vec<&[u8]> = lb[..l.max(0) as usize]
                .split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .collect();
            names.sort();
            let rm = libc::removexattr(ca.as_ptr(), n1.as_ptr());
            let g2 = libc::getxattr(ca.as_ptr(), n1.as_ptr(), buf.as_mut_ptr().cast(), 64);
            rec!(
                "xattr: {r1} {r2} {r3} get {:?} size {sz} list {:?} rm {rm} after {g2}",
                &buf[..g.max(0) as usize],
                names
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).to_string())
                    .collect::<Vec<_>>()
            );
        }
    }
    // Names with any bytes but '/' and NUL.
    let odd = OsStr::from_bytes(b"sp ace\x01\xff\xfe\tname\\*?");
    fs::write(root.join(odd), b"odd").expect("odd name");
    rec!("odd: {:?}", fs::read(root.join(odd)).ok());
    // statfs works.
    {
        let c = cpath(root);
        // SAFETY: zeroed statvfs is a valid out-buffer.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and buffer.
        let r = unsafe { libc::statvfs(c.as_ptr(), &mut sv) };
        rec!("statfs: {r} blocks>0 {}", sv.f_blocks > 0);
    }
    // FIFO.
    {
        let c = cpath(&p("fifo"));
        // SAFETY: valid path.
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        rec!("mkfifo {r}: {}", meta_line(&p("fifo")));
    }
    // chmod of a FIFO and of a socket: acts on the node, opens nothing.
    rec!(
        "chmod fifo: {} {}",
        errno_of(fs::set_permissions(
            p("fifo"),
            fs::Permissions::from_mode(0o640)
        )),
        meta_line(&p("fifo"))
    );
    {
        let l = std::os::unix::net::UnixListener::bind(p("sock"));
        rec!("bind sock: {}", errno_of(l));
        rec!(
            "chmod sock: {} {}",
            errno_of(fs::set_permissions(
                p("sock"),
                fs::Permissions::from_mode(0o604)
            )),
            meta_line(&p("sock"))
        );
        fs::remove_file(p("sock")).expect("rm sock");
    }
    // Device nodes (the suite runs as root; the mount is nodev, so they open nothing).
    for (name, kind, major, minor) in [
        ("chr", libc::S_IFCHR, 1, 3),
        ("blk", libc::S_IFBLK, 259, 70_000),
    ] {
        let c = cpath(&p(name));
        // SAFETY: valid path; mknod has no memory arguments.
        let r = unsafe { libc::mknod(c.as_ptr(), kind | 0o640, libc::makedev(major, minor)) };
        let rdev = fs::symlink_metadata(p(name)).map(|m| m.rdev()).unwrap_or(0);
        rec!(
            "mknod {name} {r}: {} rdev {}:{}",
            meta_line(&p(name)),
            libc::major(rdev),
            libc::minor(rdev)
        );
        let _ = fs::remove_file(p(name));
    }
    // The caller's umask alone decides the mode (umask 0: 0777 stays 0777), and set-id
    // bits asked for at creation stay. In a child process: the umask is per process.
    {
        let script = "import os; os.umask(0); \
            os.close(os.open('um_f', os.O_CREAT | os.O_WRONLY, 0o777)); \
            os.mkdir('um_d', 0o777); \
            os.close(os.open('um_s', os.O_CREAT | os.O_WRONLY, 0o6777)); \
            os.mknod('um_p', 0o777 | 0o010000)";
        let st = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .status();
        rec!("umask 0 creates: {:?}", st.map(|s| s.success()).ok());
        for n in ["um_f", "um_d", "um_s", "um_p"] {
            rec!("umask 0 {n}: {}", meta_line(&p(n)));
        }
        fs::remove_dir(p("um_d")).expect("rm um_d");
        for n in ["um_f", "um_s", "um_p"] {
            fs::remove_file(p(n)).expect("rm umask file");
        }
    }
    // Long names: a path of more than 300 bytes (longer than a memfd name may be), created,
    // written, appended to and read back.
    {
        let dir = p(&"d".repeat(200));
        fs::create_dir(&dir).expect("long dir");
        let f = dir.join("f".repeat(150));
        let data = vec![7u8; 3 << 20];
        rec!("long write: {}", errno_of(fs::write(&f, &data)));
        let app = OpenOptions::new()
            .append(true)
            .open(&f)
            .map(|mut h| h.write_all(b"end"));
        rec!("long append: {}", errno_of(app.and_then(|r| r)));
        let back = fs::read(&f).unwrap_or_default();
        rec!(
            "long read: {} {:?}",
            back.len(),
            back.get(back.len().saturating_sub(4)..)
        );
        fs::remove_dir_all(&dir).expect("rm long dir");
    }
    // Removal.
    rec!("rm file: {}", errno_of(fs::remove_file(p("d2/e/f"))));
    rec!("meta hl after rm: {}", meta_line(&p("hl")));
    rec!("rm dir: {}", errno_of(fs::remove_dir_all(p("d2"))));
    rec!("final listing: {}", listing(root));
    log
}

#[test]
fn posix_ops_match_a_plain_directory() {
    let s = Scratch::new("posix");
    let plain = s.sub("plain");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let want = exercise(&plain);
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let got = exercise(&mnt);
    for (i, (w, g)) in want.iter().zip(got.iter()).enumerate() {
        assert_eq!(
            w,
            g,
            "step {i} differs (plain vs dhrd); daemon log: {}",
            m.log_text()
        );
    }
    assert_eq!(want.len(), got.len());
    // copy_file_range reached the daemon (without it, the kernel copies through reads and
    // writes, and the transcript alone could not tell).
    let copies = m.status_count("copies:");
    assert!(copies >= 3, "{copies} copies in status");
    // The backing directory holds the same tree as plain files.
    assert_eq!(listing(&backing), listing(&plain));
    assert_eq!(
        fs::read(backing.join("a")).ok(),
        fs::read(plain.join("a")).ok()
    );
    let st = m.umount();
    assert!(st.success(), "daemon exit {st}");
    // Remount: the data and metadata are still there.
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    assert_eq!(fs::read(mnt.join("a")).ok(), fs::read(plain.join("a")).ok());
    assert_eq!(meta_line(&mnt.join("a")), meta_line(&plain.join("a")));
    assert_eq!(listing(&mnt), listing(&plain));
    drop(m);
}

#[test]
fn sigterm_flushes_and_exits_zero_in_fsync_mode() {
    let s = Scratch::new("sigterm");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let mut m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "fsync"]);
    fs::write(mnt.join("x"), vec![5u8; 100_000]).expect("write");
    let st = m.status();
    assert!(st.contains("durability:      fsync"), "{st}");
    let mut c = m.take_child().expect("child");
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let code = c.wait().expect("wait");
    assert!(code.success(), "exit {code}: {}", m.log_text());
    assert!(!is_mounted(&mnt));
    assert_eq!(
        fs::read(backing.join("x")).expect("backing"),
        vec![5u8; 100_000]
    );
}

#[test]
fn periodic_mode_makes_writes_durable_within_the_period() {
    let s = Scratch::new("periodic");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--durability", "periodic:1"]);
    fs::create_dir(mnt.join("d")).expect("mkdir");
    fs::write(mnt.join("d/x"), vec![3u8; 50_000]).expect("write");
    // Readers see the write at once (RAM), durability follows within the period.
    assert_eq!(fs::read(mnt.join("d/x")).expect("read"), vec![3u8; 50_000]);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    m.kill9();
    assert_eq!(
        fs::read(backing.join("d/x")).expect("backing"),
        vec![3u8; 50_000]
    );
}

/// LOOKUP of a missing name is answered with a negative entry the kernel keeps: probing it
/// again costs no round trip, and every way of creating the name through the mount makes
/// it appear at once.
#[test]
fn missing_names_are_cached_negatively_and_appear_when_created() {
    let s = Scratch::new("negative");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("src"), b"source").expect("src");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let lookups = || m.status_count("lookups:");
    let p = |n: &str| mnt.join(n);
    let missing = |n: &str| {
        let e = fs::symlink_metadata(p(n)).expect_err("should be missing");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{n}");
    };
    missing("probe");
    let before = lookups();
    for _ in 0..5 {
        missing("probe");
    }
    assert_eq!(
        lookups(),
        before,
        "repeated probes of a missing name reached the daemon"
    );
    // Each kind of creation replaces the negative entry.
    missing("file");
    fs::write(p("file"), b"new").expect("create");
    assert_eq!(fs::read(p("file")).expect("read file"), b"new");
    missing("excl");
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p("excl"))
        .expect("O_EXCL create");
    assert!(p("excl").exists());
    missing("dir");
    fs::create_dir(p("dir")).expect("mkdir");
    assert!(p("dir").is_dir());
    missing("sym");
    std::os::unix::fs::symlink("src", p("sym")).expect("symlink");
    assert_eq!(fs::read(p("sym")).expect("through symlink"), b"source");
    missing("hard");
    fs::hard_link(p("src"), p("hard")).expect("link");
    assert_eq!(fs::read(p("hard")).expect("hard"), b"source");
    missing("renamed");
    fs::rename(p("file"), p("renamed")).expect("rename");
    assert_eq!(fs::read(p("renamed")).expect("renamed"), b"new");
    missing("file");
    // Removal makes the name missing again; re-creating it works.
    fs::remove_file(p("renamed")).expect("unlink");
    missing("renamed");
    fs::write(p("renamed"), b"again").expect("re-create");
    assert_eq!(fs::read(p("renamed")).expect("again"), b"again");
    drop(m);
    // All of it is on the backing.
    for n in ["excl", "dir", "sym", "hard", "renamed"] {
        assert!(
            fs::symlink_metadata(backing.join(n)).is_ok(),
            "{n} not on the backing"
        );
    }
}

/// The kernel keeps a symlink's target once read (FUSE_CACHE_SYMLINKS): following it again
/// sends no READLINK, and a symlink replaced through the mount shows its new target.
#[test]
fn symlink_targets_are_read_once() {
    let s = Scratch::new("symcache");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("a"), b"A").expect("a");
    fs::write(backing.join("b"), b"B").expect("b");
    std::os::unix::fs::symlink("a", backing.join("l")).expect("symlink");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let readlinks = || m.status_count("readlinks:");
    assert_eq!(fs::read(mnt.join("l")).expect("via l"), b"A");
    let after_first = readlinks();
    assert!(after_first >= 1, "the first follow reads the target");
    for _ in 0..5 {
        assert_eq!(fs::read(mnt.join("l")).expect("via l"), b"A");
        assert_eq!(
            fs::read_link(mnt.join("l")).expect("readlink"),
            Path::new("a")
        );
    }
    assert_eq!(readlinks(), after_first, "following again sent READLINK");
    // Replaced through the mount (by another process): the new target is seen.
    let (ok, out) = sh(&format!("ln -sfn b {}", mnt.join("l").display()));
    assert!(ok, "{out}");
    assert_eq!(fs::read(mnt.join("l")).expect("via new l"), b"B");
    assert_eq!(
        fs::read_link(mnt.join("l")).expect("readlink"),
        Path::new("b")
    );
    drop(m);
}

/// open(O_TRUNC) truncates in the OPEN request itself (FUSE_ATOMIC_O_TRUNC): the size is 0
/// and durable before open returns, mtime moves even for an empty file, O_RDONLY|O_TRUNC
/// truncates as on a local file system; on the engine's passthrough path an open refused
/// with ETXTBSY truncates nothing, on the page cache path a writer beside a reader is
/// allowed and the reader sees the truncation.
#[test]
fn open_with_o_trunc_truncates_in_the_open() {
    o_trunc("pagecache");
}

#[test]
fn open_with_o_trunc_truncates_in_the_open_on_the_engine() {
    o_trunc("engine-auto");
}

fn o_trunc(read_path: &str) {
    let s = Scratch::new(&format!("otrunc-{read_path}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("a"), vec![b'a'; 100_000]).expect("seed a");
    fs::write(backing.join("empty"), b"").expect("seed empty");
    fs::write(backing.join("r"), b"read-only open").expect("seed r");
    fs::write(backing.join("held"), vec![b'h'; 8192]).expect("seed held");
    fs::set_permissions(backing.join("held"), fs::Permissions::from_mode(0o444)).expect("chmod");
    let old = filetime(&backing.join("empty"));
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    assert!(m.status().contains("atomic O_TRUNC: yes"), "{}", m.status());
    let base = m.status_count("setattrs:");

    // Shell redirection: open(O_WRONLY|O_CREAT|O_TRUNC) of an existing file.
    fs::write(mnt.join("a"), b"new").expect("rewrite a");
    let a = fs::read(mnt.join("a")).expect("read a");
    assert!(a == b"new", "a has {} bytes", a.len());
    std::thread::sleep(std::time::Duration::from_millis(20));
    drop(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(mnt.join("empty"))
            .expect("trunc empty"),
    );
    assert!(
        filetime(&mnt.join("empty")) > old,
        "O_TRUNC of an empty file must update mtime"
    );
    // O_RDONLY|O_TRUNC truncates on Linux local file systems too.
    let c = cpath(&mnt.join("r"));
    // SAFETY: a valid C string; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_TRUNC) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    assert_eq!(fs::metadata(mnt.join("r")).expect("stat r").len(), 0);
    // A passthrough reader holds "held". Engine: the writer is refused and nothing is
    // truncated. Page cache: the writer truncates, and the reader sees it at once.
    let reader = fs::File::open(mnt.join("held")).expect("reader");
    let writer = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(mnt.join("held"));
    let held_len = if read_path == "engine-auto" {
        assert_eq!(
            writer.err().and_then(|e| e.raw_os_error()),
            Some(libc::ETXTBSY)
        );
        8192
    } else {
        let w = writer.expect("writer beside a reader");
        let mut buf = [0u8; 16];
        assert_eq!(reader.read_at(&mut buf, 0).expect("read"), 0);
        drop(w);
        0
    };
    drop(reader);
    assert_eq!(fs::read(mnt.join("held")).expect("held").len(), held_len);

    // Each truncation was done by its OPEN: no SETATTR was sent for them.
    assert_eq!(m.status_count("setattrs:"), base, "{}", m.status());
    let truncs = if held_len == 0 { 4 } else { 3 };
    assert!(
        m.status().contains(&format!("with O_TRUNC {truncs}")),
        "{}",
        m.status()
    );
    // Durable before open returned (sync mode): the backing has it after a SIGKILL.
    m.kill9();
    let a = fs::read(backing.join("a")).expect("backing a");
    assert!(a == b"new", "backing a has {} bytes", a.len());
    assert_eq!(fs::metadata(backing.join("r")).expect("backing r").len(), 0);
    assert_eq!(
        fs::metadata(backing.join("held")).expect("held").len(),
        held_len as u64
    );
}

/// An open with O_TRUNC of a program that is running fails with ETXTBSY and leaves the
/// program whole, in every access mode, as on a local file system. For O_RDONLY|O_TRUNC
/// the kernel looks for a running program only after the OPEN, which truncates by itself
/// (FUSE_ATOMIC_O_TRUNC): the program used to be cut to 0 bytes and die of SIGBUS, and
/// the open then succeeded.
#[test]
fn o_trunc_of_a_running_program_is_refused() {
    for read_path in ["pagecache", "engine-auto"] {
        let s = Scratch::new(&format!("otrunc-exec-{read_path}"));
        let backing = s.sub("backing");
        let mnt = s.sub("mnt");
        let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
        let prog = mnt.join("prog");
        let len = fs::copy("/bin/sleep", &prog).expect("copy sleep");
        fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = std::process::Command::new(&prog)
            .arg("60")
            .spawn()
            .expect("run the program");
        let c = cpath(&prog);
        for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY] {
            // SAFETY: a valid C string; a descriptor that is opened is closed at once.
            let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_TRUNC) };
            let e = std::io::Error::last_os_error();
            if fd >= 0 {
                // SAFETY: our descriptor.
                unsafe { libc::close(fd) };
            }
            let size = fs::metadata(&prog).map(|m| m.len()).unwrap_or(0);
            let running = matches!(child.try_wait(), Ok(None));
            assert!(
                fd < 0 && e.raw_os_error() == Some(libc::ETXTBSY) && size == len && running,
                "{read_path}: open({flags:#o}|O_TRUNC) of a running program: fd {fd} ({e}), \
                 {size} of {len} bytes left, still running {running}"
            );
        }
        child.kill().expect("kill");
        child.wait().expect("wait");
        drop(m);
    }
}

fn filetime(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).expect("stat");
    (m.mtime(), m.mtime_nsec())
}

/// Files that were put in the backing at paths longer than a memfd name may be (249 bytes)
/// are loaded, read and appended to through the mount like any other: the RAM tier's
/// label is cut, the file is not refused.
#[test]
fn files_at_long_paths_in_the_backing_are_read_and_appended() {
    let s = Scratch::new("longpath");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let rel = format!("{}/{}", "d".repeat(200), "f".repeat(150));
    fs::create_dir(backing.join("d".repeat(200))).expect("long dir");
    // Over the 1 MiB the tree walk parks without an object: this one gets a memfd.
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(backing.join(&rel), &data).expect("seed long file");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    m.wait_loaded();
    let back = fs::read(mnt.join(&rel));
    assert!(
        back.as_ref().is_ok_and(|b| *b == data),
        "read: {:?}; daemon log: {}",
        back.map(|b| b.len()),
        m.log_text()
    );
    let app = OpenOptions::new()
        .append(true)
        .open(mnt.join(&rel))
        .and_then(|mut h| h.write_all(b"end"));
    assert!(app.is_ok(), "append: {app:?}; daemon log: {}", m.log_text());
    let mut want = data;
    want.extend_from_slice(b"end");
    assert!(fs::read(mnt.join(&rel)).is_ok_and(|b| b == want));
    drop(m);
    assert!(fs::read(backing.join(&rel)).is_ok_and(|b| b == want));
}

/// A create that fails after the daemon made the backing file must leave nothing behind:
/// the caller was told it failed, so neither the backing nor the mount may show the name.
/// The failure is provoked by lowering the daemon's descriptor limit step by step from
/// what it holds, so that each step fails the create at a later descriptor (the parent
/// directory, the new file, the RAM tier's memfd) until one succeeds.
#[test]
fn a_create_that_fails_leaves_no_file() {
    /// Steps above the daemon's open descriptors tried; a create needs far fewer.
    const EXTRA_FDS_MAX: u64 = 32;
    let s = Scratch::new("failcreate");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let pid = m.pid() as libc::pid_t;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on our child with a valid out-pointer and no new limit.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    let set_limit = |soft: u64| {
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        // SAFETY: prlimit on our child with a valid limit and no out-pointer.
        let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
        assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    };
    let mut failures = Vec::new();
    let mut created = None;
    for extra in 0..EXTRA_FDS_MAX {
        let open_fds = fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("fds")
            .count() as u64;
        let name = format!("c{extra}");
        set_limit(open_fds + extra);
        let r = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(mnt.join(&name));
        set_limit(old.rlim_cur);
        match r {
            Ok(_) => {
                created = Some(name);
                break;
            }
            Err(e) => {
                // Whatever step failed, the name must not exist anywhere.
                let on_backing = fs::symlink_metadata(backing.join(&name)).is_ok();
                let in_mount = fs::symlink_metadata(mnt.join(&name)).is_ok();
                failures.push(format!(
                    "{name}: {e}, backing {on_backing}, mount {in_mount}"
                ));
                assert!(!on_backing && !in_mount, "{failures:#?}");
            }
        }
    }
    let created = created.unwrap_or_else(|| panic!("no create succeeded: {failures:#?}"));
    assert!(!failures.is_empty(), "no create failed");
    // Only the one that succeeded is there, on both sides.
    assert_eq!(listing(&mnt), format!("{created:?}"));
    assert_eq!(listing(&backing), format!("{created:?}"));
    drop(m);
}

/// `dhrd umount` of a busy mount fails and the daemon keeps serving; once the mount is no
/// longer busy, a second `dhrd umount` really unmounts and the daemon exits 0. (The FUSE
/// library gives its mount record to the first attempt and drops it when that fails, so
/// the second attempt used to report success and leave the mount and the daemon running.)
#[test]
fn umount_after_a_busy_umount_unmounts() {
    let s = Scratch::new("busyumount");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let mut m = Mount::start(&backing, &mnt, &["--quiet"]);
    fs::write(mnt.join("x"), b"held").expect("write");
    let held = File::open(mnt.join("x")).expect("open");
    let umount = || {
        std::process::Command::new(dhrd())
            .arg("umount")
            .arg(&mnt)
            .output()
            .expect("dhrd umount")
    };
    let busy = umount();
    assert!(!busy.status.success(), "umount of a busy mount succeeded");
    assert!(is_mounted(&mnt));
    assert_eq!(fs::read(mnt.join("x")).expect("still served"), b"held");
    drop(held);
    let out = umount();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !is_mounted(&mnt),
        "dhrd umount said ok, the mount is still there"
    );
    let mut c = m.take_child().expect("child");
    let st = c.wait().expect("wait");
    assert!(st.success(), "daemon exit {st}: {}", m.log_text());
    assert_eq!(fs::read(backing.join("x")).expect("backing"), b"held");
}

#[test]
fn attributes_of_an_open_file_without_a_name_change_as_on_a_local_fs() {
    unlinked_open_attrs("pagecache");
}

#[test]
fn attributes_of_an_open_file_without_a_name_change_on_the_engine() {
    unlinked_open_attrs("engine-auto");
}

/// fchmod, fchown and futimens of a file that is open but whose last name is gone: a
/// local file system changes the inode (the kernel sends SETATTR without a handle for
/// fchmod and futimens, so the daemon must find the inode by what it holds, not by name).
/// The same calls on a plain directory are the reference.
fn unlinked_open_attrs(read_path: &str) {
    let s = Scratch::new(&format!("unlinked-attrs-{read_path}"));
    let (plain, backing, mnt) = (s.sub("plain"), s.sub("backing"), s.sub("mnt"));
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    let run = |root: &Path| -> Vec<String> {
        let p = root.join("gone");
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .expect("create");
        f.write_all(b"data").expect("write");
        fs::remove_file(&p).expect("unlink");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let mut out = Vec::new();
        // SAFETY: plain system calls on a descriptor this closure holds open.
        let r = unsafe { libc::fchmod(fd, 0o600) };
        out.push(format!("fchmod {}", errno_of(rc(r))));
        // SAFETY: as above.
        let r = unsafe { libc::fchown(fd, 1, 1) };
        out.push(format!("fchown {}", errno_of(rc(r))));
        let ts = [
            libc::timespec {
                tv_sec: 1_000_000,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 2_000_000,
                tv_nsec: 0,
            },
        ];
        // SAFETY: `ts` outlives the call.
        let r = unsafe { libc::futimens(fd, ts.as_ptr()) };
        out.push(format!("futimens {}", errno_of(rc(r))));
        let md = f.metadata().expect("fstat");
        out.push(format!(
            "mode {:o} uid {} gid {} mtime {} nlink {}",
            md.mode(),
            md.uid(),
            md.gid(),
            md.mtime(),
            md.nlink()
        ));
        out
    };
    let want = run(&plain);
    let got = run(&mnt);
    assert_eq!(got, want, "the mount against a plain directory");
    drop(m);
}

fn rc(r: libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
