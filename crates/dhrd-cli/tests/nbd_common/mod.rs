//! The `dhrd nbd` process as the NBD integration tests drive it: start and wait for the
//! ready line, SIGKILL or SIGTERM, and a writer that is cut off by a SIGKILL.
#![allow(dead_code)]

use dhrd_nbd::client::{Client, ClientAddr, ClientOptions, ClientTls};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
pub const BLOCK: usize = 64 << 10;

/// Deterministic contents of one block for one generation.
pub fn block(i: u64, gen: u64) -> Vec<u8> {
    let mut x =
        (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ gen.wrapping_mul(0xbf58_476d_1ce4_e5b9)) | 1;
    let mut v = Vec::with_capacity(BLOCK);
    while v.len() < BLOCK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// Panics unless the file system of `dir` keeps user extended attributes. The cache mark
/// of a backing lives in one; a check of the mark must fail where it cannot be kept, never
/// pass because no mark was found.
pub fn require_user_xattrs(dir: &Path) {
    let probe = dir.join("xattr-probe");
    let f = std::fs::File::create(&probe).unwrap_or_else(|e| panic!("{}: {e}", probe.display()));
    if let Err(e) = dhrd_io::xattr::set(&f, "user.dhrd.probe", b"1") {
        panic!(
            "the file system of {} does not keep user extended attributes ({e}), which the \
             cache mark of a backing needs: run the tests with TMPDIR on ext4, xfs, btrfs \
             or tmpfs (Linux 6.6 or later)",
            dir.display()
        );
    }
    drop(f);
    let _ = std::fs::remove_file(&probe);
}

pub fn tool(name: &str) -> PathBuf {
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join(name).is_file() {
            return dir.join(name);
        }
    }
    panic!("required tool `{name}` not found in PATH");
}

/// A running `dhrd nbd`; SIGKILLed on drop if still running.
pub struct Dhrd {
    pub child: Child,
    pub sock: PathBuf,
    pub stderr: PathBuf,
    /// The line printed when the socket listens (what it serves, and how).
    pub ready_line: String,
    /// How clients connect: with these TLS credentials, or in plaintext.
    pub tls: Option<ClientTls>,
}

/// A PSK file for identity `alice` in `dir`, in psktool's format, and the client's
/// credentials for it.
pub fn psk_for_tests(dir: &Path) -> (PathBuf, ClientTls) {
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let file = dir.join("keys.psk");
    std::fs::write(&file, format!("alice:{hex}\n")).unwrap_or_else(|e| panic!("{e}"));
    let tls = ClientTls::Psk {
        identity: "alice".into(),
        key,
    };
    (file, tls)
}

impl Dhrd {
    pub fn start(dir: &Path, backing: &Path, extra: &[&str]) -> Self {
        Self::start_tls(dir, backing, extra, None)
    }

    /// Starts it with `extra` (which should hold the server's TLS flags when `tls` is
    /// given); clients of [`Dhrd::connect`] use `tls`.
    pub fn start_tls(dir: &Path, backing: &Path, extra: &[&str], tls: Option<ClientTls>) -> Self {
        let sock = dir.join("nbd.sock");
        let stderr = dir.join(format!(
            "dhrd-{}.stderr",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let errf = std::fs::File::create(&stderr).unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_dhrd"))
            .arg("nbd")
            .arg("--backing")
            .arg(backing)
            .arg("--socket")
            .arg(&sock)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(errf)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dhrd: {e}"));
        let out = child.stdout.take().unwrap_or_else(|| unreachable!());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut me = Self {
            child,
            sock,
            stderr,
            ready_line: String::new(),
            tls,
        };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(l) if l.contains("dhrd nbd: serving") => {
                me.ready_line = l;
                me
            }
            other => panic!(
                "dhrd nbd did not become ready: {other:?}\nstderr:\n{}",
                me.stderr_text()
            ),
        }
    }

    /// A client of this server, over TLS if it was started with TLS.
    pub fn connect(&self) -> Client {
        let o = ClientOptions {
            addr: ClientAddr::Unix(self.sock.clone()),
            tls: self.tls.clone(),
        };
        Client::connect_with(&o).unwrap_or_else(|e| panic!("connect: {e}"))
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn term(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            assert!(Instant::now() < deadline, "dhrd did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dhrd {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// Writes distinct blocks with `depth` requests in flight until `kill_after` are
/// acknowledged, SIGKILLs the server while more are in flight, and returns the block
/// indices that were acknowledged, and those sent but not acknowledged.
pub fn write_until_killed(
    d: &mut Dhrd,
    order: &[u64],
    gen: u64,
    fua: bool,
    depth: usize,
    kill_after: usize,
) -> (Vec<u64>, Vec<u64>) {
    let mut c = d.connect();
    let mut handle_to_block = std::collections::HashMap::new();
    let mut acked = Vec::new();
    let mut next = 0usize;
    let mut killed = false;
    loop {
        while !killed && c.in_flight() < depth && next < order.len() {
            let i = order[next];
            next += 1;
            match c.send_write(i * BLOCK as u64, &block(i, gen), fua) {
                Ok(h) => {
                    handle_to_block.insert(h, i);
                }
                Err(_) => break,
            }
        }
        if c.in_flight() == 0 {
            break;
        }
        match c.recv() {
            Ok(r) => {
                assert_eq!(r.error, 0, "write failed before the kill");
                if let Some(i) = handle_to_block.remove(&r.handle) {
                    acked.push(i);
                }
            }
            Err(_) => break, // the server is gone
        }
        if !killed && acked.len() >= kill_after {
            d.kill9();
            killed = true;
        }
    }
    assert!(killed, "ran out of blocks before the kill point");
    (acked, handle_to_block.into_values().collect())
}

/// Writes a file of `blocks` blocks of generation `gen`.
pub fn blocks_file(path: &Path, blocks: u64, gen: u64) {
    let mut data = Vec::with_capacity(blocks as usize * BLOCK);
    for i in 0..blocks {
        data.extend_from_slice(&block(i, gen));
    }
    std::fs::write(path, &data).unwrap_or_else(|e| panic!("{e}"));
}

/// After a SIGKILL under `write_until_killed` of generation `new` over generation `old`:
/// every acknowledged block reads as new, every block never sent as old, and a block in
/// flight as one or the other (a block is one chunk, so never a mix).
pub fn check_after_kill(
    c: &mut Client,
    blocks: u64,
    acked: &[u64],
    unacked: &[u64],
    old: u64,
    new: u64,
) {
    for i in 0..blocks {
        let got = c
            .read(i * BLOCK as u64, BLOCK as u32)
            .unwrap_or_else(|e| panic!("read block {i}: {e}"));
        if acked.contains(&i) {
            assert!(got == block(i, new), "acknowledged block {i} lost");
        } else if !unacked.contains(&i) {
            assert!(got == block(i, old), "block {i} changed without a write");
        } else {
            assert!(
                got == block(i, old) || got == block(i, new),
                "block {i} torn across chunks"
            );
        }
    }
}

/// Every block in `blocks` of the file at `path` is of generation `gen`.
pub fn check_file_blocks(path: &Path, blocks: &[u64], gen: u64) {
    let on_disk = std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
    for &i in blocks {
        let at = i as usize * BLOCK;
        assert!(
            on_disk[at..at + BLOCK] == block(i, gen)[..],
            "block {i} not written back"
        );
    }
}
