//! The real `dhrd nbd` process: ready line, graceful SIGTERM, SIGKILL during writes and
//! during the initial load (every acknowledged write must survive the restart), and the
//! full stack nbdfuse + loop device + mkfs.ext4 + mount.

use dhrd_nbd::client::Client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod nbd_common;
use nbd_common::*;

#[test]
fn nbd_sigterm_flushes_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let mut d = Dhrd::start(
        dir.path(),
        &backing,
        &["--size", "16M", "--durability", "fsync"],
    );
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(c.size, 16 << 20);
    for i in 0..32u64 {
        c.send_write(i * BLOCK as u64, &block(i, 1), false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for _ in 0..32 {
        let r = c.recv().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.error, 0);
    }
    // No FLUSH from the client: the graceful shutdown must flush.
    assert_eq!(d.term(), Some(0), "stderr:\n{}", d.stderr_text());
    assert!(d.stderr_text().contains("all writes flushed"));
    assert!(!d.sock.exists(), "socket file left behind");
    let disk = std::fs::read(&backing).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..32usize {
        assert!(disk[i * BLOCK..(i + 1) * BLOCK] == block(i as u64, 1)[..]);
    }
}

#[test]
fn nbd_status_file_has_json_and_prometheus() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let status = dir.path().join("status.json");
    let status_arg = status.to_string_lossy().to_string();
    let mut d = Dhrd::start(
        dir.path(),
        &backing,
        &["--size", "4M", "--status-file", &status_arg],
    );
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    c.write(0, &block(0, 1), false)
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = c.read(0, 4096).unwrap_or_else(|e| panic!("{e}"));
    // Rewritten every second: wait for a version that has seen the write.
    let deadline = Instant::now() + READY_TIMEOUT;
    let doc = loop {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        if let Ok(doc) = serde_json::from_str::<serde_json::Value>(&text) {
            if doc["writes"]["count"].as_u64() >= Some(1) {
                break doc;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no status with the write: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(doc["size_bytes"], 4u64 << 20);
    assert_eq!(doc["durability"], "sync");
    assert_eq!(doc["read_only"], false);
    assert_eq!(doc["connections"]["open"], 1);
    assert!(doc["load"]["chunks_total"].as_u64() > Some(0), "{doc}");
    let prom = std::fs::read_to_string(dir.path().join("status.json.prom"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(prom.contains("dhrd_nbd_size_bytes 4194304\n"), "{prom}");
    assert!(
        prom.contains("dhrd_nbd_info{durability=\"sync\"} 1"),
        "{prom}"
    );
    drop(c);
    assert_eq!(d.term(), Some(0));
}

#[test]
fn nbd_refuses_non_loopback_without_allow_remote() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--size", "1M", "--listen", "0.0.0.0:0", "--backing"])
        .arg(dir.path().join("b.img"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
}

/// Sizes no export can have are refused before anything is made: a chunk size the engine
/// cannot use (for `nbd`, `load` and `mount`), an export of 0 bytes, and a size no file
/// system takes, which must not leave the backing file it was creating, nor touch one that
/// was there. So are a socket the start cannot listen on, TLS credentials it cannot load
/// and a status file it cannot write.
#[test]
fn bad_start_options_are_refused_before_the_backing_is_made() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let img = dir.path().join("b.img");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let img_s = img.to_string_lossy().into_owned();
    let sock = dir.path().join("s.sock").to_string_lossy().into_owned();
    for chunk in ["3K", "0", "128M"] {
        let err = run(&[
            "nbd",
            "--size",
            "1M",
            "--chunk",
            chunk,
            "--socket",
            &sock,
            "--backing",
            &img_s,
        ]);
        assert!(
            err.contains("power of two from 4K to 64M"),
            "{chunk}: {err}"
        );
        assert!(!img.exists(), "--chunk {chunk}: the backing was created");
        let err = run(&["load", &img_s, "--size", "1M", "--chunk", chunk]);
        assert!(err.contains("power of two"), "load --chunk {chunk}: {err}");
        assert!(
            !img.exists(),
            "load --chunk {chunk}: the backing was created"
        );
    }
    let err = run(&["nbd", "--size", "0", "--socket", &sock, "--backing", &img_s]);
    assert!(err.contains("holds nothing"), "--size 0: {err}");
    assert!(!img.exists(), "--size 0: the backing was created");
    let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
    std::fs::create_dir_all(&backing).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let err = run(&[
        "mount",
        &backing.to_string_lossy(),
        &mnt.to_string_lossy(),
        "--chunk",
        "3K",
    ]);
    assert!(err.contains("power of two"), "mount --chunk 3K: {err}");
    // More bytes than a file offset can hold, on any file system.
    let huge = || {
        let err = run(&[
            "nbd",
            "--size",
            "16000000T",
            "--socket",
            &sock,
            "--backing",
            &img_s,
        ]);
        assert!(err.contains("b.img"), "{err}");
    };
    huge();
    assert!(
        !img.exists(),
        "a refused size left the new backing file behind"
    );
    std::fs::write(&img, b"kept").unwrap_or_else(|e| panic!("{e}"));
    huge();
    assert_eq!(
        std::fs::read(&img).unwrap_or_else(|e| panic!("an existing backing went: {e}")),
        b"kept"
    );
    std::fs::remove_file(&img).unwrap_or_else(|e| panic!("{e}"));
    // Options the start cannot serve with: each is named, and nothing is made.
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap_or_else(|e| panic!("{e}"));
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::write(certs.join(f), "not a PEM file\n").unwrap_or_else(|e| panic!("{e}"));
    }
    let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (nowhere_sock, nowhere_status) = (at("nowhere/s.sock"), at("nowhere/status.json"));
    let certs = certs.to_string_lossy().into_owned();
    for (what, extra, named) in [
        (
            "a socket in a directory that does not exist",
            vec!["--socket", &nowhere_sock],
            &["listening on unix:", "nowhere/s.sock"][..],
        ),
        (
            "TLS credentials that exist but do not parse",
            vec![
                "--socket",
                &sock,
                "--tls",
                "require",
                "--tls-certificates",
                &certs,
            ],
            &["server-cert.pem"][..],
        ),
        (
            "a status file in a directory that does not exist",
            vec!["--socket", &sock, "--status-file", &nowhere_status],
            &["--status-file", "nowhere/status.json"][..],
        ),
    ] {
        let mut args = vec!["nbd", "--size", "1M", "--backing", &img_s];
        args.extend(extra);
        let err = run(&args);
        assert!(named.iter().all(|n| err.contains(n)), "{what}: {err}");
        assert!(!img.exists(), "{what}: the backing was created");
        assert!(
            !Path::new(&sock).exists(),
            "{what}: the start left its socket behind"
        );
    }
}

fn verify_blocks(d: &Dhrd, backing: &Path, blocks: &[u64], gen: u64, what: &str) {
    let mut c = d.connect();
    for &i in blocks {
        let got = c
            .read(i * BLOCK as u64, BLOCK as u32)
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert!(got == block(i, gen), "{what}: block {i} lost through NBD");
    }
    let disk = std::fs::read(backing).unwrap_or_else(|e| panic!("{e}"));
    for &i in blocks {
        let o = i as usize * BLOCK;
        assert!(
            disk[o..o + BLOCK] == block(i, gen)[..],
            "{what}: block {i} not on the backing"
        );
    }
}

#[test]
fn nbd_sigkill_during_writes_keeps_every_acknowledged_write() {
    // sync: every write; fsync: FUA writes.
    for (mode, fua) in [("sync", false), ("fsync", true)] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let backing = dir.path().join("b.img");
        let mut d = Dhrd::start(
            dir.path(),
            &backing,
            &["--size", "64M", "--durability", mode],
        );
        let order: Vec<u64> = (0..1024).collect();
        let (acked, _) = write_until_killed(&mut d, &order, 7, fua, 16, 300);
        drop(d);
        let d = Dhrd::start(dir.path(), &backing, &["--durability", mode]);
        verify_blocks(&d, &backing, &acked, 7, mode);
    }
}

#[test]
fn nbd_sigkill_over_tls_keeps_every_acknowledged_write() {
    // The same as above with every client on TLS-PSK under --tls require: the encrypted
    // path acknowledges a write only once it is as durable as the mode promises.
    for (mode, fua) in [("sync", false), ("fsync", true)] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let backing = dir.path().join("b.img");
        let (keys, tls) = psk_for_tests(dir.path());
        let keys = keys.to_string_lossy().into_owned();
        let flags = ["--durability", mode, "--tls", "require", "--tls-psk", &keys];
        let mut args = vec!["--size", "64M"];
        args.extend(flags);
        let mut d = Dhrd::start_tls(dir.path(), &backing, &args, Some(tls.clone()));
        assert!(d.ready_line.contains("TLS require"), "{}", d.ready_line);
        let order: Vec<u64> = (0..1024).collect();
        let (acked, _) = write_until_killed(&mut d, &order, 7, fua, 16, 300);
        drop(d);
        let d = Dhrd::start_tls(dir.path(), &backing, &flags, Some(tls));
        verify_blocks(&d, &backing, &acked, 7, mode);
        // A plaintext client gets nothing from the restarted server.
        assert!(
            Client::connect(&d.sock).is_err(),
            "plaintext served under require"
        );
    }
}

#[test]
fn nbd_tls_flags_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (keys, _) = psk_for_tests(dir.path());
    let keys = keys.to_string_lossy().into_owned();
    let bad_keys = dir.path().join("bad.psk");
    std::fs::write(&bad_keys, "alice:00ff\nbob:nothex\n").unwrap_or_else(|e| panic!("{e}"));
    let bad_keys = bad_keys.to_string_lossy().into_owned();
    let no_certs = dir.path().to_string_lossy().into_owned();
    for (args, want) in [
        (vec!["--tls", "require"], "needs --tls-certificates"),
        (vec!["--tls-psk", &keys], "--tls is off"),
        (
            vec![
                "--tls",
                "on",
                "--tls-psk",
                &keys,
                "--tls-certificates",
                &no_certs,
            ],
            "cannot be used with",
        ),
        (
            vec!["--tls", "on", "--tls-verify-peer", "--tls-psk", &keys],
            "--tls-certificates",
        ),
        (vec!["--tls", "require", "--tls-psk", &bad_keys], "line 2"),
        (
            vec!["--tls", "require", "--tls-certificates", &no_certs],
            "server-cert.pem is missing",
        ),
        (vec!["--tls", "maybe", "--tls-psk", &keys], "invalid value"),
    ] {
        let errf = dir.path().join("flags.stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_dhrd"))
            .args(["nbd", "--size", "1M", "--socket"])
            .arg(dir.path().join("s.sock"))
            .arg("--backing")
            .arg(dir.path().join("b.img"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&errf).unwrap_or_else(|e| panic!("{e}")))
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        // A configuration that is accepted would serve for ever: give it a while.
        let deadline = Instant::now() + READY_TIMEOUT;
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = std::fs::read_to_string(&errf).unwrap_or_default();
        assert!(
            status.is_some_and(|s| !s.success()),
            "{args:?} started: {err}"
        );
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Starts `dhrd nbd` on a TCP address; returns it with its stderr file once it serves.
fn start_tcp(dir: &Path, extra: &[&str]) -> (Child, PathBuf) {
    let errf = dir.join("tcp.stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args([
            "nbd",
            "--size",
            "1M",
            "--listen",
            "0.0.0.0:0",
            "--allow-remote",
        ])
        .arg("--backing")
        .arg(dir.join("b.img"))
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&errf).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut line = String::new();
    let out = child.stdout.take().unwrap_or_else(|| unreachable!());
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(line.contains("dhrd nbd: serving"), "{line}");
    (child, errf)
}

#[test]
fn nbd_allow_remote_without_tls_warns_at_start_and_in_status() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (keys, _) = psk_for_tests(dir.path());
    let keys = keys.to_string_lossy().into_owned();
    let status = dir.path().join("status.json");
    let status_arg = status.to_string_lossy().into_owned();
    for (extra, warned) in [
        (vec![], true),
        (vec!["--tls", "on", "--tls-psk", &keys], true),
        (vec!["--tls", "require", "--tls-psk", &keys], false),
    ] {
        let _ = std::fs::remove_file(&status);
        let mut args = extra.clone();
        args.extend(["--status-file", &status_arg]);
        let (mut child, errf) = start_tcp(dir.path(), &args);
        let doc: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&status).unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = child.wait();
        let err = std::fs::read_to_string(&errf).unwrap_or_default();
        assert_eq!(err.contains("warning: 0.0.0.0"), warned, "{extra:?}: {err}");
        assert_eq!(
            doc["tls"]["warning"].is_string(),
            warned,
            "{extra:?}: {doc}"
        );
        assert_eq!(doc["nbd"]["requests"], 0, "{doc}");
    }
}

#[test]
fn nbd_sigkill_during_initial_load_keeps_data_and_acknowledged_writes() {
    const BLOCKS: u64 = 2048; // 128 MiB
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&backing).unwrap_or_else(|e| panic!("{e}")),
        );
        for i in 0..BLOCKS {
            f.write_all(&block(i, 0)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    // Loading 128 MiB at 16 MiB/s takes ~8 s: the whole test runs during the load.
    let mut d = Dhrd::start(
        dir.path(),
        &backing,
        &["--load-rate", "16M", "--chunk", "1M"],
    );
    let started = Instant::now();
    // Reads during the load see the backing's bytes (I5), wherever the loader is.
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    for i in (0..BLOCKS).step_by(97) {
        let got = c
            .read(i * BLOCK as u64, BLOCK as u32)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(got == block(i, 0), "block {i} wrong during load");
    }
    drop(c);
    // Scattered writes across loaded, loading and unloaded chunks (I1-I3).
    let mut order: Vec<u64> = (0..BLOCKS).filter(|i| i % 3 == 1).collect();
    let mut x = 12345u64;
    for k in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(k, (x % (k as u64 + 1)) as usize);
    }
    let (acked, unsure) = write_until_killed(&mut d, &order, 5, false, 8, 200);
    let load_was_running = !d.stderr_text().contains("dhrd nbd: loaded");
    eprintln!(
        "killed after {:.2} s, load still running: {load_was_running}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        load_was_running,
        "the load finished before the kill; raise the size"
    );
    drop(d);
    let d = Dhrd::start(dir.path(), &backing, &[]);
    verify_blocks(&d, &backing, &acked, 5, "after kill during load");
    // Every block never written still holds its original bytes.
    let touched: std::collections::HashSet<u64> =
        acked.iter().chain(unsure.iter()).copied().collect();
    let never: Vec<u64> = (0..BLOCKS)
        .filter(|i| !touched.contains(i) && !order.contains(i))
        .step_by(7)
        .collect();
    verify_blocks(&d, &backing, &never, 0, "untouched");
}

/// Runs a command; `Err(stderr)` if it fails.
fn sh(cmd: &mut Command) -> Result<String, String> {
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "{cmd:?}: {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("{cmd:?}: {e}")),
    }
}

/// Undoes the mount stack in reverse order, whatever the test reached.
#[derive(Default)]
struct Stack {
    mounts: Vec<PathBuf>,
    loops: Vec<String>,
    fuse: Option<(PathBuf, Child)>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for m in self.mounts.drain(..).rev() {
            let _ = sh(Command::new("umount").arg(&m));
        }
        for l in self.loops.drain(..).rev() {
            let _ = sh(Command::new("losetup").arg("-d").arg(&l));
        }
        if let Some((mp, mut child)) = self.fuse.take() {
            let _ = sh(Command::new("fusermount3").arg("-u").arg(&mp));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Panics naming what is missing of root and the device nodes a test needs: the suite runs
/// as root on a machine with them (README), so anywhere it runs their absence is a defect
/// of the setup, not a reason to pass.
fn require_root_and(devices: &[&str]) {
    let mut missing: Vec<&str> = devices
        .iter()
        .copied()
        .filter(|d| !Path::new(d).exists())
        .collect();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root");
    }
    assert!(
        missing.is_empty(),
        "this test needs root and {devices:?}; missing: {missing:?}"
    );
}

#[test]
fn nbd_nbdfuse_loop_mkfs_ext4_mount() {
    require_root_and(&["/dev/loop-control", "/dev/fuse"]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let fuse_dir = dir.path().join("fuse");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(&mnt).unwrap_or_else(|e| panic!("{e}"));
    let mut d = Dhrd::start(dir.path(), &backing, &["--size", "128M"]);
    let content: Vec<u8> = (0..40u64).flat_map(|i| block(i, 9)).collect();
    {
        let mut st = Stack::default();
        let pidfile = dir.path().join("nbdfuse.pid");
        let child = Command::new(tool("nbdfuse"))
            .arg("-P")
            .arg(&pidfile)
            .arg(fuse_dir.join("disk"))
            .arg("--unix")
            .arg(&d.sock)
            .spawn()
            .unwrap_or_else(|e| panic!("nbdfuse: {e}"));
        st.fuse = Some((fuse_dir.clone(), child));
        let deadline = Instant::now() + READY_TIMEOUT;
        while !pidfile.exists() {
            assert!(Instant::now() < deadline, "nbdfuse did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let lo = sh(Command::new("losetup")
            .args(["-f", "--show"])
            .arg(fuse_dir.join("disk")))
        .unwrap_or_else(|e| panic!("no loop device over the export: {e}"))
        .trim()
        .to_string();
        st.loops.push(lo.clone());
        sh(Command::new(tool("mkfs.ext4")).args(["-q", "-F", &lo]))
            .unwrap_or_else(|e| panic!("{e}"));
        sh(Command::new("mount").arg(&lo).arg(&mnt))
            .unwrap_or_else(|e| panic!("cannot mount the ext4 on the export: {e}"));
        st.mounts.push(mnt.clone());
        std::fs::write(mnt.join("file.bin"), &content).unwrap_or_else(|e| panic!("{e}"));
        sh(&mut Command::new("sync")).unwrap_or_else(|e| panic!("{e}"));
        // Remount: the file comes back through the whole stack.
        sh(Command::new("umount").arg(&mnt)).unwrap_or_else(|e| panic!("{e}"));
        st.mounts.clear();
        sh(Command::new("mount").arg(&lo).arg(&mnt)).unwrap_or_else(|e| panic!("{e}"));
        st.mounts.push(mnt.clone());
        let back = std::fs::read(mnt.join("file.bin")).unwrap_or_else(|e| panic!("{e}"));
        assert!(back == content, "file differs after remount");
    }
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    // The backing file alone is a valid ext4 image holding the file.
    let o = Command::new(tool("debugfs"))
        .args(["-R", "cat /file.bin"])
        .arg(&backing)
        .output()
        .unwrap_or_else(|e| panic!("debugfs: {e}"));
    assert!(
        o.status.success(),
        "debugfs: {}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout == content, "backing image lacks the file");
}

#[test]
fn nbd_block_device_backing_is_exported_at_its_size() {
    require_root_and(&["/dev/loop-control"]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let img = dir.path().join("dev.img");
    std::fs::write(&img, vec![0u8; 24 << 20]).unwrap_or_else(|e| panic!("{e}"));
    let lo = sh(Command::new("losetup").args(["-f", "--show"]).arg(&img))
        .unwrap_or_else(|e| panic!("no loop device: {e}"))
        .trim()
        .to_string();
    let mut st = Stack::default();
    st.loops.push(lo.clone());
    let mut d = Dhrd::start(dir.path(), Path::new(&lo), &[]);
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(c.size, 24 << 20);
    c.write(5 << 20, &block(3, 4), false)
        .unwrap_or_else(|e| panic!("{e}"));
    let got = c
        .read(5 << 20, BLOCK as u32)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == block(3, 4));
    drop(c);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    drop(st);
    let disk = std::fs::read(&img).unwrap_or_else(|e| panic!("{e}"));
    assert!(disk[5 << 20..(5 << 20) + BLOCK] == block(3, 4)[..]);
}

#[test]
fn nbd_first_request_is_served_at_once_on_a_large_backing() {
    // I7: time to the first served request does not grow with the data size. A sparse
    // 16 GiB backing with a slow loader must answer about as fast as a 16 MiB one.
    let mut times = Vec::new();
    for size in ["16M", "16G"] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let backing = dir.path().join("b.img");
        let t0 = Instant::now();
        let d = Dhrd::start(
            dir.path(),
            &backing,
            &["--size", size, "--load-rate", "64M", "--mem", "64M"],
        );
        let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
        let last = c.size - BLOCK as u64;
        let got = c.read(last, BLOCK as u32).unwrap_or_else(|e| panic!("{e}"));
        assert!(got.iter().all(|&b| b == 0));
        c.write(last, &block(1, 1), false)
            .unwrap_or_else(|e| panic!("{e}"));
        times.push(t0.elapsed());
    }
    eprintln!("first request served after {times:?}");
    assert!(
        times[1] < times[0] + Duration::from_secs(2),
        "a larger backing delayed the first request: {times:?}"
    );
}
