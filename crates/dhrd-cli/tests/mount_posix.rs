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
