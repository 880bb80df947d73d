//! Behaviours of a dhrd mount beyond the POSIX transcript of `mount_posix.rs`, each against
//! what a local file system does (real FUSE mount; needs root and /dev/fuse): SIGTERM and
//! `periodic:N`, negative lookups and symlink caching, O_TRUNC in the open (and of a
//! running program), long paths in the backing, a create that fails, a second umount after
//! a busy one, and attributes of an open file whose name is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

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
