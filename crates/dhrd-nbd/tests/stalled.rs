//! Clients that stop half-way through a request: one that stops reading its socket in the
//! middle of a large read reply, one that stops sending in the middle of a write payload.
//! Neither may hold anything beyond its own connection: the other clients' reads still
//! load and evict within the RAM budget, and the stalled connection's slot comes free.
//! Sleeps only let time pass; every wait is for a condition, bounded by [`LIVENESS`].

mod common;

use common::*;
use dhrd_engine::{Admission, CacheConfig, CachePolicy, ChunkIndex, ChunkState, ReadAhead};
use dhrd_nbd::proto::*;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound for anything that must happen eventually.
const LIVENESS: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds; false after [`LIVENESS`].
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + LIVENESS;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Bytes queued for reading on a socket (FIONREAD).
fn queued_bytes(s: &std::os::unix::net::UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `n`, which lives across the call.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

/// A client that stops reading its socket in the middle of a large read reply (sent from
/// the RAM tier without a copy) must not stop the loading of other clients' data, nor
/// keep RAM over the budget. The reply it gets when it reads again is still the data.
#[test]
fn a_client_that_stops_reading_does_not_stop_loading_for_others() {
    const CB: u64 = 256 << 10;
    const CHUNKS: u64 = 32;
    const BUDGET_CHUNKS: u64 = 4;
    const STALLED_READ: u32 = (BUDGET_CHUNKS * CB) as u32;
    let budget = dhrd_engine::RamBudget::new(BUDGET_CHUNKS * CB);
    let data = pattern((CHUNKS * CB) as usize, 29);
    let ex = engine_export_of(
        &data,
        CHUNKS * CB,
        |c| {
            c.chunk_bytes = CB;
            c.budget = Some(budget.clone());
            c.loader_config.threads = 2;
            c.cache = CacheConfig {
                policy: CachePolicy::Clock,
                admission: Admission::Always,
                read_ahead: ReadAhead::None,
                prefill: false,
                ..CacheConfig::default()
            };
        },
        false,
    );
    let loaded = |c: u64| ex.obj.chunk_state(ChunkIndex(c)) == Some(ChunkState::Loaded);
    let (mut good, _, _) = RawClient::handshake(&ex.srv.sock);
    let mut handle = 0u64;
    let mut read = |c: &mut RawClient, offset: u64, len: usize| {
        handle += 1;
        c.request(0, CMD_READ, handle, offset, len as u32);
        assert_eq!(c.simple_reply().ok(), Some((0, handle)), "read at {offset}");
        let got = c.read_n(len).unwrap_or_else(|e| panic!("payload: {e}"));
        assert!(
            got == data[offset as usize..offset as usize + len],
            "bytes at {offset}"
        );
    };
    // The first chunks come into RAM (a miss loads its chunk), as much as the budget holds.
    for c in 0..BUDGET_CHUNKS {
        read(&mut good, c * CB, 4096);
        assert!(eventually(|| loaded(c)), "chunk {c} was not loaded");
    }
    // The stalled client asks for all of them at once and never reads the reply, which
    // is larger than the socket buffers. All of it is in RAM, so it is sent zero-copy.
    assert!((0..BUDGET_CHUNKS).all(loaded), "{:?}", ex.obj.progress());
    let before = ex.obj.stats();
    let (mut stalled, _, _) = RawClient::handshake(&ex.srv.sock);
    stalled.request(0, CMD_READ, 77, 0, STALLED_READ);
    assert!(
        eventually(|| queued_bytes(&stalled.s) > 0),
        "the reply to the stalled client never started"
    );
    let after = ex.obj.stats();
    assert_eq!(
        (
            after.bytes_read_ram - before.bytes_read_ram,
            after.reads_backing
        ),
        (STALLED_READ.into(), before.reads_backing),
        "the stalled read was not served from RAM"
    );
    // Every other chunk is read by the good client: each miss evicts one chunk and loads
    // its own, while the stalled reply is still being sent.
    for c in BUDGET_CHUNKS..CHUNKS {
        read(&mut good, c * CB + 100, 4096);
        assert!(
            eventually(|| loaded(c)),
            "chunk {c} was not loaded while a client stalled: {:?}",
            ex.obj.progress()
        );
    }
    assert!(ex.obj.stats().evictions >= CHUNKS - BUDGET_CHUNKS);
    // And the RAM of the evicted chunks is given back: the budget bounds memory.
    assert!(
        eventually(|| ex.obj.progress().ram_resident_bytes <= budget.limit_bytes()),
        "RAM stays over the budget while a client stalls: {} bytes resident, limit {}",
        ex.obj.progress().ram_resident_bytes,
        budget.limit_bytes()
    );
    // The stalled client reads at last: its reply is whole and holds the data.
    assert_eq!(stalled.simple_reply().ok(), Some((0, 77)));
    let got = stalled
        .read_n(STALLED_READ as usize)
        .unwrap_or_else(|e| panic!("stalled payload: {e}"));
    assert!(
        got == data[..STALLED_READ as usize],
        "the late reply's bytes"
    );
    read(&mut good, 0, 4096);
    drop(stalled);
    drop(good);
    let s = ex.srv.stop();
    assert_eq!(s.abandoned, 0);
    ex.obj
        .verify_mirror()
        .unwrap_or_else(|e| panic!("mirror: {e}"));
}

/// A reply has a deadline as a whole: a client that takes a few bytes of a large reply now
/// and then (each socket write makes progress, so no timeout per write would ever fire)
/// loses its connection once the reply timeout has passed, and the server stays usable.
#[test]
fn a_client_that_reads_a_trickle_is_cut_at_the_reply_deadline() {
    const READ: usize = 8 << 20;
    let t = Arc::new(MemTarget::new(READ));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.reply_timeout = Duration::from_secs(1);
    });
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    c.request(0, CMD_READ, 5, 0, READ as u32);
    let mut got = 0usize;
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + LIVENESS;
    let ended = loop {
        if Instant::now() > deadline {
            break false;
        }
        match std::io::Read::read(&mut c.s, &mut buf) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("read: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        ended,
        "a trickling reader kept its reply going past the deadline"
    );
    assert!(
        got < SIMPLE_REPLY_HEADER_BYTES + READ,
        "the whole reply arrived"
    );
    let (mut d, _, _) = RawClient::handshake(&srv.sock);
    d.request(0, CMD_READ, 6, 0, 4096);
    assert_eq!(d.simple_reply().ok(), Some((0, 6)));
    assert!(d.read_n(4096).is_ok());
}

/// A client that sends a write's header and part of its payload and then stops is busy,
/// never idle, so neither idle eviction nor the idle timeout frees its slot: the payload
/// deadline does. Its partial write never reaches the target, and the slot goes to the
/// next client.
#[test]
fn a_client_that_stops_mid_payload_gives_up_its_slot() {
    const SIZE: usize = 1 << 20;
    let t = Arc::new(MemTarget::new(SIZE));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.max_connections = 1;
        c.idle_evict_after = Duration::from_millis(500);
        c.idle_timeout = Some(Duration::from_secs(1));
        c.payload_timeout = Duration::from_secs(2);
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    a.request(0, CMD_WRITE, 1, 0, 64 << 10);
    a.send(&[0xaa; 1000]);
    assert!(
        a.closed_by_server(),
        "a client stalled mid-payload kept its connection"
    );
    assert!(eventually(|| srv.handle().active_connections() == 0));
    let (mut b, _, _) = RawClient::handshake(&srv.sock);
    b.request(0, CMD_WRITE, 2, 0, 4);
    b.send(b"next");
    assert_eq!(b.simple_reply().ok(), Some((0, 2)));
    let d = t.data.lock();
    assert_eq!(&d[..4], b"next");
    assert!(
        d[4..1000].iter().all(|&x| x == 0),
        "the partial write reached the target"
    );
}

/// The same with a client that keeps sending one payload byte now and then: each read
/// makes progress, so only a deadline for the whole payload ends it.
#[test]
fn a_client_that_trickles_its_payload_is_cut_at_the_payload_deadline() {
    const SIZE: usize = 1 << 20;
    let t = Arc::new(MemTarget::new(SIZE));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.payload_timeout = Duration::from_secs(1);
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    a.request(0, CMD_WRITE, 1, 0, 64 << 10);
    let mut w = a.s.try_clone().unwrap_or_else(|e| panic!("clone: {e}"));
    let deadline = Instant::now() + LIVENESS;
    let trickle = std::thread::spawn(move || {
        while Instant::now() < deadline {
            if std::io::Write::write_all(&mut w, &[0xbb]).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    assert!(
        a.closed_by_server(),
        "a trickling writer kept its connection"
    );
    assert_eq!(trickle.join().ok(), Some(true));
    assert!(t.data.lock().iter().all(|&x| x == 0));
}

/// The server, not the client, ends a connection at a deadline, so the client can no
/// longer send the FLUSH it may have meant to: as when it evicts an idle connection, the
/// server flushes that connection's unflushed writes before the socket closes.
#[test]
fn a_connection_cut_at_a_deadline_has_its_writes_flushed() {
    const SIZE: usize = 1 << 20;
    let t = Arc::new(MemTarget::new(SIZE));
    let srv = TestServer::start_with(Arc::clone(&t), |c| {
        c.payload_timeout = Duration::from_secs(1);
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    a.request(0, CMD_WRITE, 1, 0, 5);
    a.send(b"acked");
    assert_eq!(a.simple_reply().ok(), Some((0, 1)));
    a.request(0, CMD_WRITE, 2, 4096, 4096);
    a.send(&[0xcc; 100]);
    assert!(a.closed_by_server(), "the stalled payload was not cut");
    assert!(eventually(|| srv.handle().active_connections() == 0));
    assert_eq!(
        t.flushes.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the cut connection's acknowledged write was not flushed"
    );
    assert_eq!(&t.data.lock()[..5], b"acked");
}
