//! Shared test harness: an in-process server on a temporary Unix socket, a test-double
//! target, a minimal raw NBD client, and lookup of the distribution's client tools.
//!
//! A missing client tool fails the test with the tool's name and its Debian package
//! (CI installs them), never a silent skip.
#![allow(dead_code)]

pub mod pki;

use dhrd_nbd::proto::*;
use dhrd_nbd::{ListenAddr, NbdError, Server, ServerConfig, ShutdownHandle, Target};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Debian package providing each client tool, for the failure message.
fn package_of(tool: &str) -> &'static str {
    match tool {
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "nbdsh" => "python3-libnbd",
        "qemu-img" | "qemu-io" | "qemu-nbd" => "qemu-utils",
        "nbdfuse" => "nbdfuse",
        "nbdkit" => "nbdkit",
        "mkfs.ext4" => "e2fsprogs",
        "certtool" | "psktool" => "gnutls-bin",
        "fio" => "fio",
        _ => "?",
    }
}

/// Full path of a required client tool; panics naming the tool and its package if absent.
pub fn tool(name: &str) -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "required NBD client tool `{name}` not found in PATH (install the Debian package `{}`)",
        package_of(name)
    );
}

/// `nbdsh` as a command. nbdsh runs `python3 -m nbd`; when the first python3 in PATH
/// lacks the module (a pyenv or venv interpreter), the distribution's python3 is used.
pub fn nbdsh() -> Command {
    let _ = tool("nbdsh");
    for py in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(py)
            .args(["-c", "import nbd"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            let mut c = Command::new(py);
            c.args(["-m", "nbd"]);
            return c;
        }
    }
    panic!("`nbdsh` is installed but no python3 can import the `nbd` module (install `python3-libnbd`)");
}

/// Runs a command, panicking with its output if it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn nbd_uri(sock: &Path) -> String {
    format!("nbd+unix:///?socket={}", sock.display())
}

/// An in-process server on a temporary Unix socket; shut down gracefully on drop.
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    /// Where it listens (the Unix socket, or a TCP address when the test chose one).
    pub addr: ListenAddr,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<dhrd_nbd::server::ServeSummary, NbdError>>>,
}

impl TestServer {
    pub fn start<T: Target>(target: T) -> Self {
        Self::start_with(target, |_| {})
    }

    pub fn start_with<T: Target>(target: T, tweak: impl FnOnce(&mut ServerConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        Self::start_in(dir, target, tweak)
    }

    pub fn start_in<T: Target>(
        dir: tempfile::TempDir,
        target: T,
        tweak: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let sock = dir.path().join("nbd.sock");
        let mut cfg = ServerConfig::new(ListenAddr::Unix(sock.clone()));
        tweak(&mut cfg);
        let server = Server::bind(target, cfg).unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = server.local_addr();
        let handle = server.shutdown_handle();
        let thread = std::thread::spawn(move || server.run());
        Self {
            dir,
            sock,
            addr,
            handle,
            thread: Some(thread),
        }
    }

    pub fn uri(&self) -> String {
        nbd_uri(&self.sock)
    }

    pub fn handle(&self) -> &ShutdownHandle {
        &self.handle
    }

    /// Waits until the server has no open connection (every connection thread ended and
    /// its socket closed); false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_idle_below(1, timeout)
    }

    /// Waits until fewer than `n` connections are open; false on timeout.
    pub fn wait_idle_below(&self, n: usize, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.handle.active_connections() >= n {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Graceful shutdown; returns the server's summary.
    pub fn stop(mut self) -> dhrd_nbd::server::ServeSummary {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> dhrd_nbd::server::ServeSummary {
        self.handle.shutdown();
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(s))) => s,
            Some(Ok(Err(e))) => panic!("server failed: {e}"),
            Some(Err(_)) => panic!("server thread panicked"),
            None => Default::default(),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop_inner();
        }
    }
}

/// A real engine export: a hybrid object over a backing file in the server's directory.
pub struct EngineExport {
    pub srv: TestServer,
    pub backing: PathBuf,
    pub obj: dhrd_engine::HybridObject<dhrd_io::FileBacking>,
}

pub fn engine_export(
    size: u64,
    durability: dhrd_engine::Durability,
    read_only: bool,
) -> EngineExport {
    engine_export_with(size, |c| c.durability = durability, read_only)
}

pub fn engine_export_with(
    size: u64,
    tweak: impl FnOnce(&mut dhrd_engine::ObjectConfig),
    read_only: bool,
) -> EngineExport {
    engine_export_of(&[], size, tweak, read_only)
}

/// An engine export whose backing holds `initial` at offset 0 before the object opens
/// (zeros up to `size` after it).
pub fn engine_export_of(
    initial: &[u8],
    size: u64,
    tweak: impl FnOnce(&mut dhrd_engine::ObjectConfig),
    read_only: bool,
) -> EngineExport {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, initial).unwrap_or_else(|e| panic!("backing: {e}"));
    let fb = dhrd_io::FileBacking::open(
        &backing,
        &dhrd_io::FileOptions {
            min_len: Some(size),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("backing: {e}"));
    let mut cfg = dhrd_engine::ObjectConfig {
        fixed_len: true,
        read_only,
        ..Default::default()
    };
    tweak(&mut cfg);
    let obj = dhrd_engine::HybridObject::open(fb, cfg).unwrap_or_else(|e| panic!("open: {e}"));
    let target = dhrd_nbd::EngineTarget::new(obj.clone(), read_only);
    let srv = TestServer::start_in(dir, target, |_| {});
    EngineExport { srv, backing, obj }
}

/// An engine export over a sparse backing of `size` bytes holding `pattern` bytes at each
/// `(offset, len)` of `data` and holes elsewhere; loaded into RAM before it is served
/// when `loaded`.
pub fn engine_export_sparse(size: u64, data: &[(u64, u64)], loaded: bool) -> EngineExport {
    engine_export_cfg(size, data, loaded, |_| {})
}

/// [`engine_export_sparse`] with the server's configuration tweaked (TLS, listen address).
pub fn engine_export_cfg(
    size: u64,
    data: &[(u64, u64)],
    loaded: bool,
    tweak: impl FnOnce(&mut ServerConfig),
) -> EngineExport {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let backing = dir.path().join("backing.img");
    let f = std::fs::File::create(&backing).unwrap_or_else(|e| panic!("backing: {e}"));
    f.set_len(size).unwrap_or_else(|e| panic!("backing: {e}"));
    for (i, &(off, len)) in data.iter().enumerate() {
        f.write_all_at(&pattern(len as usize, i as u64 + 1), off)
            .unwrap_or_else(|e| panic!("backing: {e}"));
    }
    drop(f);
    let fb = dhrd_io::FileBacking::open(&backing, &dhrd_io::FileOptions::default())
        .unwrap_or_else(|e| panic!("backing: {e}"));
    let cfg = dhrd_engine::ObjectConfig {
        fixed_len: true,
        ..Default::default()
    };
    let obj = dhrd_engine::HybridObject::open(fb, cfg).unwrap_or_else(|e| panic!("open: {e}"));
    if loaded {
        assert!(
            obj.wait_loaded(Some(Duration::from_secs(60))),
            "load did not finish"
        );
    }
    let target = dhrd_nbd::EngineTarget::new(obj.clone(), false);
    let srv = TestServer::start_in(dir, target, tweak);
    EngineExport { srv, backing, obj }
}

/// An in-memory target with error injection, to test the protocol layer on its own.
pub struct MemTarget {
    pub data: Mutex<Vec<u8>>,
    pub fail_writes_with: Mutex<Option<i32>>,
    pub read_only: bool,
    pub flushes: std::sync::atomic::AtomicU64,
    pub slow_writes: AtomicBool,
}

impl MemTarget {
    pub fn new(size: usize) -> Self {
        Self {
            data: Mutex::new(vec![0u8; size]),
            fail_writes_with: Mutex::new(None),
            read_only: false,
            flushes: Default::default(),
            slow_writes: AtomicBool::new(false),
        }
    }
}

impl Target for MemTarget {
    fn size(&self) -> u64 {
        self.data.lock().len() as u64
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), NbdError> {
        let d = self.data.lock();
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> Result<(), NbdError> {
        if let Some(e) = *self.fail_writes_with.lock() {
            return Err(NbdError::Errno(e));
        }
        if self.slow_writes.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut d = self.data.lock();
        let o = offset as usize;
        d[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn zero(&self, offset: u64, len: u64, _p: bool, _fua: bool) -> Result<(), NbdError> {
        let mut d = self.data.lock();
        d[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn flush(&self) -> Result<(), NbdError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A minimal synchronous NBD client speaking raw bytes, for hostile-input tests.
pub struct RawClient {
    pub s: UnixStream,
}

impl RawClient {
    pub fn connect(sock: &Path) -> Self {
        let s = UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap_or_else(|e| panic!("timeout: {e}"));
        Self { s }
    }

    pub fn read_n(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b)?;
        Ok(b)
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Reads the greeting and answers with fixed newstyle + no zeroes.
    pub fn greet(&mut self) {
        let g = self.read_n(18).unwrap_or_else(|e| panic!("greeting: {e}"));
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        self.send(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes());
    }

    pub fn option(&mut self, opt: u32, payload: &[u8]) {
        let mut v = Vec::new();
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        self.send(&v);
    }

    /// Reads one option reply: (option, type, payload).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self
            .read_n(OPTION_REPLY_HEADER_BYTES)
            .unwrap_or_else(|e| panic!("option reply: {e}"));
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap_or_default()),
            REPLY_MAGIC
        );
        let o = u32::from_be_bytes(h[8..12].try_into().unwrap_or_default());
        let t = u32::from_be_bytes(h[12..16].try_into().unwrap_or_default());
        let l = u32::from_be_bytes(h[16..20].try_into().unwrap_or_default()) as usize;
        let p = self
            .read_n(l)
            .unwrap_or_else(|e| panic!("option payload: {e}"));
        (o, t, p)
    }

    /// Full handshake to transmission with simple replies; returns (size, flags).
    pub fn handshake(sock: &Path) -> (Self, u64, u16) {
        let mut c = Self::connect(sock);
        c.greet();
        c.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
        let mut size = 0;
        let mut flags = 0;
        loop {
            let (_, t, p) = c.option_reply();
            if t == REP_ACK {
                break;
            }
            assert_eq!(t, REP_INFO, "unexpected reply type {t:#x}");
            if u16::from_be_bytes([p[0], p[1]]) == INFO_EXPORT {
                size = u64::from_be_bytes(p[2..10].try_into().unwrap_or_default());
                flags = u16::from_be_bytes([p[10], p[11]]);
            }
        }
        (c, size, flags)
    }

    pub fn request(&mut self, flags: u16, cmd: u16, handle: u64, offset: u64, len: u32) {
        self.send(&encode_request(flags, cmd, handle, offset, len));
    }

    /// Reads one simple reply header: (error, handle).
    pub fn simple_reply(&mut self) -> std::io::Result<(u32, u64)> {
        let b = self.read_n(SIMPLE_REPLY_HEADER_BYTES)?;
        let r = decode_simple_reply(b.as_slice().try_into().unwrap_or(&[0u8; 16]));
        assert_eq!(r.magic, SIMPLE_REPLY_MAGIC);
        Ok((r.error, r.handle))
    }

    /// True if the server closed the connection (EOF within the read timeout).
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures are reproducible.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The simulation, crash and power-cut tests lean on the invariants the code checks with
/// `debug_assert!` on its hot paths, so they run only in a profile that keeps them (the
/// workspace's dev and test profiles say so in Cargo.toml; `--release` does not).
#[test]
#[allow(clippy::assertions_on_constants)] // the constant is the profile's: what is checked
fn debug_assertions_are_on() {
    assert!(
        cfg!(debug_assertions),
        "these tests need debug assertions: run them without --release"
    );
}
