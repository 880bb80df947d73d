//! Symlink confinement and bad input: a symlink planted in the backing directory never makes
//! the daemon read or write outside it; every bad command line fails with a clear message
//! and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::symlink;
use std::process::Command;

#[test]
fn planted_symlinks_never_lead_the_daemon_outside() {
    let s = Scratch::new("escape");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let outside = s.sub("outside");
    fs::write(outside.join("secret"), b"secret").expect("secret");
    fs::create_dir(backing.join("d")).expect("d");
    fs::write(backing.join("d/inner"), b"inner").expect("inner");
    // Planted before the mount: shown as a symlink, never followed by the daemon.
    symlink(&outside, backing.join("link")).expect("link");
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let md = fs::symlink_metadata(mnt.join("link")).expect("lstat link");
    assert!(
        md.file_type().is_symlink(),
        "a symlink is shown as a symlink"
    );
    assert_eq!(fs::read_link(mnt.join("link")).expect("readlink"), outside);
    // Cache the directory `d` in the kernel, then swap it for a symlink to the outside
    // behind the daemon's back. The kernel's node `d` is the directory's inode, which the
    // daemon holds open: requests on it reach that directory where it now is (inside the
    // backing, as `d.moved`), or fail; never the symlink's target.
    assert_eq!(fs::read(mnt.join("d/inner")).expect("inner"), b"inner");
    fs::rename(backing.join("d"), backing.join("d.moved")).expect("move d");
    symlink(&outside, backing.join("d")).expect("plant d");
    let r = fs::read(mnt.join("d/secret"));
    assert!(
        r.is_err(),
        "read through a swapped-in symlink must fail, got {:?}",
        r.ok()
    );
    if fs::write(mnt.join("d/created"), b"x").is_ok() {
        assert_eq!(
            fs::read(backing.join("d.moved/created")).expect("created in d.moved"),
            b"x",
            "a create on the cached node lands in its directory"
        );
    }
    if let Ok(it) = fs::read_dir(mnt.join("d")) {
        let names: Vec<_> = it.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert!(
            !names.iter().any(|n| n == "secret"),
            "listing through the symlink must not show the outside: {names:?}"
        );
    }
    // Nothing outside changed.
    assert!(
        !outside.join("created").exists(),
        "the daemon wrote outside the backing dir"
    );
    assert_eq!(fs::read(outside.join("secret")).expect("secret"), b"secret");
    let names: Vec<_> = fs::read_dir(&outside)
        .expect("outside")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1);
    drop(m);
}

fn mount_fails(args: &[&std::path::Path], want: &str) {
    let o = Command::new(dhrd())
        .arg("mount")
        .args(args)
        .arg("--quiet")
        .output()
        .expect("dhrd");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "mount {args:?} should fail");
    assert!(
        err.contains(want),
        "mount {args:?}: expected {want:?} in: {err}"
    );
    if let Some(m) = args.get(1) {
        if !want.contains("busy") {
            assert!(
                !is_mounted(m),
                "nothing may be mounted after a refused mount"
            );
        }
    }
}

#[test]
fn bad_input_fails_with_a_clear_error() {
    let s = Scratch::new("badinput");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("keep"), b"keep").expect("keep");
    // Missing backing directory.
    mount_fails(&[&s.0.join("missing"), &mnt], "backing directory");
    // Backing directory is a file.
    mount_fails(&[&backing.join("keep"), &mnt], "not a directory");
    // Backing equal to the mountpoint, and inside it.
    mount_fails(&[&mnt, &mnt], "inside (or equal to) the mountpoint");
    let nested = mnt.join("b");
    fs::create_dir(&nested).expect("nested");
    mount_fails(&[&nested, &mnt], "inside (or equal to) the mountpoint");
    fs::remove_dir(&nested).expect("rm nested");
    // Mountpoint inside the backing directory.
    let inner_mnt = backing.join("m");
    fs::create_dir(&inner_mnt).expect("inner mnt");
    mount_fails(&[&backing, &inner_mnt], "inside the backing directory");
    fs::remove_dir(&inner_mnt).expect("rm inner");
    // Non-empty mountpoint.
    let full = s.sub("full");
    fs::write(full.join("x"), b"x").expect("x");
    mount_fails(&[&backing, &full], "not empty");
    // Unreadable backing directory (a mode the daemon cannot read even as root is not
    // possible; use a directory below a file instead).
    mount_fails(&[&backing.join("keep/sub"), &mnt], "backing directory");
    // A second daemon on the same backing directory, and a busy mountpoint.
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let mnt2 = s.sub("mnt2");
    mount_fails(&[&backing, &mnt2], "already served by another dhrd daemon");
    let backing2 = s.sub("backing2");
    mount_fails(&[&backing2, &mnt], "busy");
    // Nothing was lost or changed.
    assert_eq!(fs::read(mnt.join("keep")).expect("keep"), b"keep");
    drop(m);
    assert_eq!(fs::read(backing.join("keep")).expect("keep"), b"keep");
    // status / umount of something that is not a dhrd mount.
    let o = Command::new(dhrd())
        .arg("status")
        .arg(&mnt2)
        .output()
        .expect("status");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no dhrd daemon"));
}

#[test]
fn an_object_cache_beyond_the_descriptor_limit_is_refused() {
    let s = Scratch::new("nofile");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    // 2000 objects need about 6256 descriptors; the shell caps the hard limit at 4096.
    let script = format!(
        "ulimit -Sn 4096 && ulimit -Hn 4096 && exec {} mount {} {} --quiet --object-cache 2000",
        dhrd(),
        backing.display(),
        mnt.display()
    );
    let o = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "the mount should be refused");
    assert!(err.contains("file descriptors"), "unclear error: {err}");
    assert!(!is_mounted(&mnt));
    // Within the limit it mounts.
    let m = Mount::start(&backing, &mnt, &["--quiet", "--object-cache", "1000"]);
    drop(m);
}

#[test]
fn status_reports_load_ram_and_durability() {
    let s = Scratch::new("status");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("f"), vec![1u8; 3 << 20]).expect("f");
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--mem", "64M", "--read-path", "direct"],
    );
    m.wait_loaded();
    let _ = fs::read(mnt.join("f")).expect("read");
    let st = m.status();
    // The same facts for machines: JSON with stable names, and Prometheus text.
    let status_as = |flag: &str| {
        let o = std::process::Command::new(dhrd())
            .args(["status", flag])
            .arg(&mnt)
            .output()
            .expect("dhrd status");
        assert!(o.status.success(), "status {flag}: {o:?}");
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let doc: serde_json::Value = serde_json::from_str(&status_as("--json")).expect("JSON");
    assert_eq!(doc["durability"], "sync");
    assert_eq!(doc["read_path"], "engine-direct");
    assert_eq!(doc["read_only"], false);
    assert_eq!(doc["ram"]["budget_bytes"], 64u64 << 20);
    assert_eq!(doc["load"]["complete"], true);
    assert_eq!(doc["load"]["bytes_total"], 3u64 << 20);
    assert!(doc["counters"]["reads"].as_u64() > Some(0), "{doc}");
    assert!(
        doc["latency"]["read"]["p99_le_us"].as_u64().is_some(),
        "{doc}"
    );
    let prom = status_as("--prometheus");
    let label = format!("{{mountpoint=\"{}\"}}", mnt.display());
    for want in [
        format!("dhrd_mount_ram_budget_bytes{label} 67108864\n"),
        format!("dhrd_mount_load_complete{label} 1\n"),
        format!("dhrd_mount_read_only{label} 0\n"),
    ] {
        assert!(prom.contains(&want), "prometheus lacks {want:?}:\n{prom}");
    }
    for want in [
        "load:",
        "100.0%",
        "RAM:",
        "64.0 MiB budget",
        "durability:      sync",
        "data path:       engine RAM copy per file, read path engine-direct",
        "read-only:       no",
        "reads (daemon):",
        "RAM ",
        "write latency:",
    ] {
        assert!(st.contains(want), "status lacks {want:?}:\n{st}");
    }
    // The control socket is private.
    let sock = fs::read_dir("/run/dhrd")
        .expect("control dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().map(|x| x == "sock").unwrap_or(false))
        .collect::<Vec<_>>();
    for p in sock {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0);
        assert_eq!(mode, 0o600, "{} mode {mode:o}", p.display());
    }
    drop(m);
}

#[test]
fn backing_full_fails_that_write_with_enospc_and_keeps_the_file_writable() {
    let s = Scratch::new("enospc");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let (ok, out) = sh(&format!(
        "mount -t tmpfs -o size=2M tmpfs {}",
        backing.display()
    ));
    assert!(ok, "tmpfs: {out}");
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _t = Umount(backing.clone());
    let m = Mount::start(&backing, &mnt, &["--quiet"]);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("fill"))
        .expect("create");
    use std::os::unix::fs::FileExt;
    let chunk = vec![7u8; 64 << 10];
    let mut written = 0u64;
    let err = loop {
        match f.write_all_at(&chunk, written) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(written < (8 << 20), "tmpfs of 2 MiB never filled up");
    };
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "expected ENOSPC, got {err}"
    );
    // Everything acknowledged reads back; nothing of the failed write is visible past it.
    let mut buf = vec![0u8; written as usize];
    f.read_exact_at(&mut buf, 0).expect("read back");
    assert!(buf.iter().all(|b| *b == 7));
    // Free space: the same file is writable again (no sticky failure for ENOSPC).
    f.set_len(0).expect("truncate");
    f.write_all_at(b"again", 0)
        .expect("write after freeing space");
    let st = m.status();
    assert!(st.contains("read-only:       no"), "{st}");
    drop(f);
    drop(m);
}

#[test]
fn daemon_mode_returns_once_mounted_and_umount_stops_it() {
    let s = Scratch::new("daemon");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("f"), b"data").expect("f");
    let st = Command::new(dhrd())
        .arg("mount")
        .arg(&backing)
        .arg(&mnt)
        .arg("--daemon")
        // The daemon adds --quiet itself; a user's own --quiet must not be passed twice.
        .arg("--quiet")
        .status()
        .expect("dhrd mount --daemon");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if is_mounted(&self.0) {
                let _ = Command::new(dhrd()).arg("umount").arg(&self.0).status();
                force_unmount(&self.0);
            }
        }
    }
    let _c = Cleanup(mnt.clone());
    assert!(st.success());
    assert!(is_mounted(&mnt), "mounted when --daemon returns");
    assert_eq!(fs::read(mnt.join("f")).expect("read"), b"data");
    let umount = |mnt: &std::path::Path| {
        let st = Command::new(dhrd())
            .arg("umount")
            .arg(mnt)
            .status()
            .expect("umount");
        assert!(st.success());
    };
    umount(&mnt);
    assert!(!is_mounted(&mnt));
    // Once `dhrd umount` returns, the backing is free: mounting it again at once works,
    // also when the daemon has much to tear down (thousands of objects and parked files).
    for i in 0..3000 {
        fs::write(backing.join(format!("g{i}")), vec![b'x'; 4 << 10]).expect("g");
    }
    for _ in 0..3 {
        let st = Command::new(dhrd())
            .args(["mount", "--daemon", "--quiet"])
            .arg(&backing)
            .arg(&mnt)
            .status()
            .expect("dhrd mount --daemon");
        assert!(st.success(), "mount right after umount");
        assert_eq!(fs::read(mnt.join("f")).expect("read"), b"data");
        for i in 0..3000 {
            fs::read(mnt.join(format!("g{i}"))).expect("read g");
        }
        umount(&mnt);
    }
}

/// A file larger than `--mem`: on the page cache path the prefix the budget allows is
/// warmed and pinned and the rest is served from the device; on the engine the chunks
/// past the budget stay on the backing. Both report what is over the budget.
#[test]
fn data_beyond_the_ram_budget_is_served_from_the_backing_and_reported() {
    for (read_path, over) in [
        ("pagecache", "over the budget 6.0 MiB"),
        ("engine-direct", "6.0 MiB over the budget"),
    ] {
        let s = Scratch::new(&format!("budget-{read_path}"));
        let backing = s.sub("backing");
        let mnt = s.sub("mnt");
        let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
        fs::write(backing.join("f"), &data).expect("f");
        let m = Mount::start(
            &backing,
            &mnt,
            &[
                "--quiet",
                "--mem",
                "2M",
                "--chunk",
                "1M",
                "--read-path",
                read_path,
            ],
        );
        m.wait_loaded();
        assert_eq!(fs::read(mnt.join("f")).expect("read"), data);
        // On the engine the file is larger than the budget, so the walk did not preload
        // it: its object and load start with the read above.
        m.wait_loaded();
        let st = m.status();
        assert!(st.contains(over), "{read_path}: {st}");
        assert!(st.contains("complete"), "{read_path}: {st}");
        drop(m);
    }
}

/// The page cache path's status: the warm-up, what is pinned, the open files' page cache
/// (none dirty in `sync` mode), under stable JSON names too.
#[test]
fn status_reports_the_warmup_and_pinned_ram() {
    let s = Scratch::new("status-pc");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    fs::write(backing.join("f"), vec![1u8; 3 << 20]).expect("f");
    // Written back, so the dirty pages counted below are only the mount's.
    fs::File::open(backing.join("f"))
        .expect("f")
        .sync_all()
        .expect("sync");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--mem", "64M"]);
    m.wait_loaded();
    let w = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("f"))
        .expect("open");
    std::os::unix::fs::FileExt::write_all_at(&w, b"fresh", 100).expect("write");
    let o = Command::new(dhrd())
        .args(["status", "--json"])
        .arg(&mnt)
        .output()
        .expect("status");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(doc["data_path"], "pagecache", "{doc}");
    assert_eq!(doc["read_path"], "pagecache", "{doc}");
    assert_eq!(doc["fallback"], serde_json::Value::Null, "{doc}");
    assert_eq!(doc["warmup"]["complete"], true, "{doc}");
    assert_eq!(doc["warmup"]["files_warmed"], 1, "{doc}");
    assert_eq!(doc["ram"]["pinned_bytes"], 3u64 << 20, "{doc}");
    assert_eq!(doc["ram"]["pinned_files"], 1, "{doc}");
    assert_eq!(doc["page_cache"]["open_inodes"], 1, "{doc}");
    assert_eq!(doc["page_cache"]["open_files_dirty_bytes"], 0, "{doc}");
    assert_eq!(doc["page_cache"]["open_files_writeback_bytes"], 0, "{doc}");
    assert!(
        doc["page_cache"]["open_files_cached_bytes"].as_u64() >= Some(3 << 20),
        "{doc}"
    );
    assert_eq!(doc["load"]["complete"], true, "{doc}");
    drop(w);
    let st = m.status();
    for want in [
        "data path:       page cache of the backing files",
        "warm-up:         100.0% in RAM",
        "pinned 3.0 MiB in 1 files of a 64.0 MiB budget",
        "read-only:       no",
    ] {
        assert!(st.contains(want), "status lacks {want:?}:\n{st}");
    }
    drop(m);
}

/// No /dev/fuse, or something else in its place: a clear message, exit 1, nothing mounted.
/// Runs the daemon in a private mount namespace (unshare -m) where /dev is replaced by an
/// empty tmpfs, or /dev/fuse by a plain file, so the host is untouched.
#[test]
fn missing_or_wrong_dev_fuse_is_reported() {
    let s = Scratch::new("devfuse");
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    let fake = s.sub("fake").join("fuse");
    fs::write(&fake, b"").expect("fake");
    let cases = [
        ("mount -t tmpfs tmpfs /dev", "/dev/fuse is missing"),
        (
            &*format!("mount --bind {} /dev/fuse", fake.display()),
            "/dev/fuse is not the FUSE device",
        ),
    ];
    for (setup, want) in cases {
        let script = format!(
            "{setup} && exec {} mount {} {} --quiet",
            dhrd(),
            backing.display(),
            mnt.display()
        );
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .output()
            .expect("unshare");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{setup}: {err}");
        assert!(err.contains(want), "{setup}: {err}");
        assert!(!is_mounted(&mnt));
    }
}
