//! Connection slots: which connection the server closes to let a new client in, when it
//! may close an idle one on its own, and how long a negotiation may hold a slot. Every
//! sleep here only makes a connection idle for at least some time; no assertion depends
//! on how fast anything runs (waits for liveness are generous).

mod common;

use common::*;
use dhrd_nbd::proto::*;
use dhrd_nbd::{ListenAddr, NbdError, Server, ServerConfig, Target};
use parking_lot::{Condvar, Mutex};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: usize = 1 << 20;
/// Upper bound for anything that must happen eventually.
const LIVENESS: Duration = Duration::from_secs(20);

/// A memory target whose FLUSH can be held inside the target, to keep a request in flight
/// for as long as a test needs.
struct Gated {
    mem: MemTarget,
    held: Mutex<bool>,
    released: Condvar,
    /// FLUSH requests that have reached the target.
    flushes_entered: AtomicU64,
}

impl Gated {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            mem: MemTarget::new(SIZE),
            held: Mutex::new(false),
            released: Condvar::new(),
            flushes_entered: AtomicU64::new(0),
        })
    }

    fn hold(&self) {
        *self.held.lock() = true;
    }

    fn release(&self) {
        *self.held.lock() = false;
        self.released.notify_all();
    }
}

impl Target for Gated {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), NbdError> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), NbdError> {
        self.mem.write_at(buf, offset, fua)
    }
    fn zero(&self, offset: u64, len: u64, may_punch: bool, fua: bool) -> Result<(), NbdError> {
        self.mem.zero(offset, len, may_punch, fua)
    }
    fn flush(&self) -> Result<(), NbdError> {
        self.flushes_entered.fetch_add(1, Ordering::SeqCst);
        let mut held = self.held.lock();
        while *held {
            self.released.wait(&mut held);
        }
        drop(held);
        self.mem.flush()
    }
}

/// Polls `cond` until it holds; false after [`LIVENESS`].
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + LIVENESS;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The server ended the connection with an orderly close: end of stream, no stray bytes,
/// no reset.
fn closed_cleanly(c: &mut RawClient) -> bool {
    let mut b = [0u8; 1];
    matches!(c.s.read(&mut b), Ok(0))
}

/// A new client is closed at accept, before the greeting.
fn refused(sock: &std::path::Path) -> bool {
    let mut c = RawClient::connect(sock);
    closed_cleanly(&mut c)
}

/// A write and a read back on a fresh request handle pair.
fn round_trip(c: &mut RawClient, offset: u64, data: &[u8], handle: u64) {
    c.request(0, CMD_WRITE, handle, offset, data.len() as u32);
    c.send(data);
    assert_eq!(c.simple_reply().ok(), Some((0, handle)), "write");
    c.request(0, CMD_READ, handle + 1, offset, data.len() as u32);
    assert_eq!(c.simple_reply().ok(), Some((0, handle + 1)), "read");
    assert_eq!(c.read_n(data.len()).ok().as_deref(), Some(data));
}

fn read_back(c: &mut RawClient, offset: u64, len: usize, handle: u64) -> Vec<u8> {
    c.request(0, CMD_READ, handle, offset, len as u32);
    assert_eq!(c.simple_reply().ok(), Some((0, handle)), "read");
    c.read_n(len)
        .unwrap_or_else(|e| panic!("read payload: {e}"))
}

#[test]
fn a_write_payload_still_arriving_is_never_cut_to_free_a_slot() {
    const GRACE: Duration = Duration::from_secs(1);
    let t = Arc::new(MemTarget::new(SIZE));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.max_connections = 1;
        c.idle_evict_after = GRACE;
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    // Half of a write's payload, then a pause longer than the grace period: the request
    // is being received, so the connection is busy, not idle.
    let payload = pattern(64 << 10, 7);
    a.request(0, CMD_WRITE, 1, 8192, payload.len() as u32);
    a.send(&payload[..payload.len() / 2]);
    std::thread::sleep(GRACE + Duration::from_millis(500));
    assert!(refused(&srv.sock), "a slot was freed by cutting a request");
    assert_eq!(srv.handle().evicted_connections(), 0);
    assert_eq!(srv.handle().refused_connections(), 1);
    // The request completes and is acknowledged; the connection goes on working.
    a.send(&payload[payload.len() / 2..]);
    assert_eq!(a.simple_reply().ok(), Some((0, 1)));
    assert_eq!(&t.data.lock()[8192..8192 + payload.len()], &payload[..]);
    round_trip(&mut a, 0, b"still here", 2);
}

#[test]
fn a_request_in_flight_keeps_its_slot_until_answered() {
    const GRACE: Duration = Duration::from_secs(1);
    let t = Gated::new();
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.max_connections = 1;
        c.idle_evict_after = GRACE;
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    t.hold();
    a.request(0, CMD_FLUSH, 7, 0, 0);
    assert!(eventually(|| t.flushes_entered.load(Ordering::SeqCst) == 1));
    // Executing for longer than the grace period is not being idle.
    std::thread::sleep(GRACE + Duration::from_millis(500));
    assert!(refused(&srv.sock), "a busy connection lost its slot");
    t.release();
    assert_eq!(
        a.simple_reply().ok(),
        Some((0, 7)),
        "the request was not answered"
    );
    // Once answered and idle past the grace period, the slot may go to a new client.
    std::thread::sleep(GRACE + Duration::from_millis(500));
    let (mut b, _, _) = RawClient::handshake(&srv.sock);
    round_trip(&mut b, 0, b"newcomer", 1);
    assert!(
        closed_cleanly(&mut a),
        "the evicted client did not see a clean close"
    );
    let s = srv.stop();
    assert_eq!((s.evicted, s.refused), (1, 1));
}

#[test]
fn an_evicted_client_sees_a_clean_close_after_its_writes_are_flushed() {
    const GRACE: Duration = Duration::from_secs(1);
    let t = Arc::new(MemTarget::new(SIZE));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.max_connections = 1;
        c.idle_evict_after = GRACE;
    });
    // A writes without FLUSH and goes idle.
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    round_trip(&mut a, 4096, b"alpha", 1);
    std::thread::sleep(GRACE + Duration::from_millis(500));
    let (mut b, _, _) = RawClient::handshake(&srv.sock);
    // A could not send the FLUSH it may have meant to: the server flushed for it before
    // closing, so by the time A sees the end of the stream its writes are durable.
    assert!(
        closed_cleanly(&mut a),
        "the evicted client did not see a clean close"
    );
    assert_eq!(
        t.flushes.load(Ordering::SeqCst),
        1,
        "no flush before the close"
    );
    assert_eq!(read_back(&mut b, 4096, 5, 1), b"alpha");
    // B's own FLUSH covers its write, so its eviction needs no second one.
    b.request(0, CMD_WRITE, 2, 8192, 4);
    b.send(b"beta");
    assert_eq!(b.simple_reply().ok(), Some((0, 2)));
    b.request(0, CMD_FLUSH, 3, 0, 0);
    assert_eq!(b.simple_reply().ok(), Some((0, 3)));
    std::thread::sleep(GRACE + Duration::from_millis(500));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    assert!(closed_cleanly(&mut b));
    assert_eq!(t.flushes.load(Ordering::SeqCst), 2);
    assert_eq!(read_back(&mut c, 8192, 4, 1), b"beta");
    let s = srv.stop();
    assert_eq!((s.evicted, s.refused), (2, 0));
}

#[test]
fn negotiation_must_end_within_the_handshake_timeout_in_total() {
    let srv = TestServer::start_with(Arc::new(MemTarget::new(SIZE)), |c| {
        c.handshake_timeout = Duration::from_secs(1);
    });
    // One client never says anything; another sends one byte of a long option every
    // 100 ms, far inside any per-read timeout.
    let mut silent = RawClient::connect(&srv.sock);
    assert!(silent.read_n(18).is_ok(), "greeting");
    let mut slow = RawClient::connect(&srv.sock);
    assert!(slow.read_n(18).is_ok(), "greeting");
    let stop = Arc::new(AtomicBool::new(false));
    let dribbler = {
        let stop = Arc::clone(&stop);
        let mut s = slow.s.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
        std::thread::spawn(move || {
            let mut bytes = CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
            bytes.extend_from_slice(&OPT_LIST.to_be_bytes());
            bytes.extend_from_slice(&4096u32.to_be_bytes());
            bytes.resize(bytes.len() + 4096, 0);
            for b in bytes {
                if stop.load(Ordering::SeqCst) || s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    assert!(
        srv.wait_idle(LIVENESS),
        "a negotiation outlived the handshake timeout"
    );
    stop.store(true, Ordering::SeqCst);
    assert!(dribbler.join().is_ok());
    assert!(closed_cleanly(&mut silent));
    assert!(slow.closed_by_server());
    // The server goes on serving clients that negotiate in time.
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    round_trip(&mut c, 0, b"after", 1);
}

#[test]
fn the_idle_timeout_closes_idle_connections_but_never_a_busy_one() {
    // Long compared with the gap between the busy client's handshake and its request, so
    // that it cannot be closed before it is busy.
    const IDLE: Duration = Duration::from_secs(3);
    let t = Gated::new();
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.idle_timeout = Some(IDLE);
    });
    let (mut idle, _, _) = RawClient::handshake(&srv.sock);
    let (mut busy, _, _) = RawClient::handshake(&srv.sock);
    assert_eq!(read_back(&mut idle, 0, 4, 1), [0u8; 4]);
    t.hold();
    busy.request(0, CMD_FLUSH, 9, 0, 0);
    assert!(eventually(|| t.flushes_entered.load(Ordering::SeqCst) == 1));
    assert!(closed_cleanly(&mut idle), "the idle client was not closed");
    assert_eq!(srv.handle().idle_closed_connections(), 1);
    // The busy connection stays, however long its request takes.
    std::thread::sleep(IDLE + Duration::from_millis(500));
    assert_eq!(srv.handle().idle_closed_connections(), 1);
    assert_eq!(srv.handle().active_connections(), 1);
    t.release();
    assert_eq!(
        busy.simple_reply().ok(),
        Some((0, 9)),
        "the request was not answered"
    );
    // Answered and then idle, it goes too.
    assert!(closed_cleanly(&mut busy));
    let s = srv.stop();
    assert_eq!((s.idle_closed, s.evicted, s.refused), (2, 0, 0));
}

#[test]
fn limits_that_would_refuse_everyone_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let cfg = || ServerConfig::new(ListenAddr::Unix(dir.path().join("nbd.sock")));
    let bad = [
        ServerConfig {
            max_connections: 0,
            ..cfg()
        },
        ServerConfig {
            handshake_timeout: Duration::ZERO,
            ..cfg()
        },
        ServerConfig {
            idle_timeout: Some(Duration::ZERO),
            ..cfg()
        },
        ServerConfig {
            reply_timeout: Duration::ZERO,
            ..cfg()
        },
        ServerConfig {
            payload_timeout: Duration::ZERO,
            ..cfg()
        },
    ];
    for c in bad {
        assert!(matches!(
            Server::bind(MemTarget::new(SIZE), c),
            Err(NbdError::Config(_))
        ));
    }
}
