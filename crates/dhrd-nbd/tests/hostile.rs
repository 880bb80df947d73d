//! Hostile and broken clients, written as raw bytes on the socket, against an in-memory
//! test target: the server must answer or close as the protocol says, never crash, and
//! keep serving other clients.

mod common;

use common::*;
use dhrd_nbd::limits::MAX_PAYLOAD_BYTES;
use dhrd_nbd::proto::*;
use dhrd_nbd::{ListenAddr, Server, ServerConfig};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SIZE: usize = 1 << 20;

fn mem() -> Arc<MemTarget> {
    Arc::new(MemTarget::new(SIZE))
}

/// A fresh client can still do a write+read round trip.
fn still_serving(sock: &std::path::Path) {
    let (mut c, size, _) = RawClient::handshake(sock);
    assert_eq!(size, SIZE as u64);
    c.request(0, CMD_WRITE, 1, SIZE as u64 - 100, 4);
    c.send(b"ping");
    assert_eq!(c.simple_reply().ok(), Some((0, 1)));
    c.request(0, CMD_READ, 2, SIZE as u64 - 100, 4);
    assert_eq!(c.simple_reply().ok(), Some((0, 2)));
    assert_eq!(c.read_n(4).ok().as_deref(), Some(&b"ping"[..]));
}

#[test]
fn socket_is_private_and_flags_are_advertised() {
    let srv = TestServer::start(mem());
    let mode = std::fs::metadata(&srv.sock).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode.ok(), Some(0o600));
    let (_c, size, flags) = RawClient::handshake(&srv.sock);
    assert_eq!(size, SIZE as u64);
    for f in [
        TFLAG_HAS_FLAGS,
        TFLAG_SEND_FLUSH,
        TFLAG_SEND_FUA,
        TFLAG_SEND_TRIM,
        TFLAG_SEND_WRITE_ZEROES,
        TFLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x} missing from {flags:#x}");
    }
    assert_eq!(flags & TFLAG_READ_ONLY, 0);
}

#[test]
fn unknown_option_gets_err_unsup_and_negotiation_continues() {
    let srv = TestServer::start(mem());
    let mut c = RawClient::connect(&srv.sock);
    c.greet();
    c.option(0x7777, b"junk");
    assert_eq!(c.option_reply().1, REP_ERR_UNSUP);
    // TLS is not configured: STARTTLS is refused by policy, and negotiation goes on.
    c.option(OPT_STARTTLS, &[]);
    assert_eq!(c.option_reply().1, REP_ERR_POLICY);
    c.option(OPT_LIST, &[]);
    let (_, t, p) = c.option_reply();
    assert_eq!(t, REP_SERVER);
    assert_eq!(&p[..4], &[0, 0, 0, 0]); // default (empty) export name
    assert_eq!(c.option_reply().1, REP_ACK);
    c.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    loop {
        if c.option_reply().1 == REP_ACK {
            break;
        }
    }
    c.request(0, CMD_FLUSH, 5, 0, 0);
    assert_eq!(c.simple_reply().ok(), Some((0, 5)));
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let srv = TestServer::start(mem());
    let (mut other, _, _) = RawClient::handshake(&srv.sock);
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    let mut req = encode_request(0, CMD_READ, 1, 0, 512);
    req[0] ^= 0xff;
    c.send(&req);
    assert!(c.closed_by_server());
    other.request(0, CMD_FLUSH, 9, 0, 0);
    assert_eq!(other.simple_reply().ok(), Some((0, 9)));
    still_serving(&srv.sock);
}

#[test]
fn bad_option_magic_and_unknown_client_flags_close() {
    let srv = TestServer::start(mem());
    let mut c = RawClient::connect(&srv.sock);
    c.greet();
    c.send(&[0u8; 16]);
    assert!(c.closed_by_server());
    let mut c = RawClient::connect(&srv.sock);
    let _ = c.read_n(18);
    c.send(&0xffff_0000u32.to_be_bytes());
    assert!(c.closed_by_server());
    still_serving(&srv.sock);
}

#[test]
fn unknown_command_gets_einval_and_connection_survives() {
    let srv = TestServer::start(mem());
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    c.request(0, 0x00ff, 3, 0, 512);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 3)));
    c.request(0, CMD_READ, 4, 0, 1);
    assert_eq!(c.simple_reply().ok(), Some((0, 4)));
    assert_eq!(c.read_n(1).ok(), Some(vec![0]));
}

#[test]
fn out_of_range_and_bad_flags_get_errors_and_connection_survives() {
    let srv = TestServer::start(mem());
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    c.request(0, CMD_READ, 1, SIZE as u64, 1);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 1)));
    c.request(0, CMD_READ, 2, u64::MAX - 1, 4);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 2)));
    c.request(0, CMD_READ, 3, 0, MAX_PAYLOAD_BYTES + 1);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 3)));
    // A write past the end: its payload is still consumed, so the stream stays in sync.
    c.request(0, CMD_WRITE, 4, SIZE as u64 - 2, 4);
    c.send(b"abcd");
    assert_eq!(c.simple_reply().ok(), Some((ENOSPC, 4)));
    c.request(0, CMD_TRIM, 5, SIZE as u64, 1);
    assert_eq!(c.simple_reply().ok(), Some((ENOSPC, 5)));
    c.request(CMD_FLAG_NO_HOLE, CMD_WRITE, 6, 0, 2);
    c.send(b"xy");
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 6)));
    c.request(0, CMD_READ, 7, 0, 0);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 7)));
    c.request(0, CMD_READ, 8, SIZE as u64 - 1, 1);
    assert_eq!(c.simple_reply().ok(), Some((0, 8)));
    assert_eq!(c.read_n(1).ok(), Some(vec![0]));
}

#[test]
fn oversized_write_payload_is_refused_and_connection_closed() {
    let srv = TestServer::start(mem());
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    // Claims 4 GiB - 1: the server must not try to allocate or read it.
    c.request(0, CMD_WRITE, 11, 0, u32::MAX);
    assert_eq!(c.simple_reply().ok(), Some((EINVAL, 11)));
    assert!(c.closed_by_server());
    still_serving(&srv.sock);
}

#[test]
fn truncated_request_and_vanishing_client_leave_no_trace() {
    let t = mem();
    let srv = TestServer::start(Arc::clone(&t));
    // Half a request header, then gone.
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    c.send(&encode_request(0, CMD_READ, 1, 0, 512)[..10]);
    drop(c);
    // A write whose payload is cut short: the partial data must not reach the target.
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    c.request(0, CMD_WRITE, 2, 0, 1 << 20);
    c.send(&vec![0xaa; 1000]);
    let _ = c.s.flush();
    drop(c);
    // A client that sends requests and leaves without reading replies.
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    for h in 0..32 {
        c.request(0, CMD_READ, h, 0, 64 << 10);
    }
    drop(c);
    // Mid-negotiation.
    let mut c = RawClient::connect(&srv.sock);
    c.greet();
    c.send(&IHAVEOPT.to_be_bytes());
    drop(c);
    still_serving(&srv.sock);
    assert!(t.data.lock()[..1000].iter().all(|&b| b == 0));
    // Every one of those connections ended: no thread or socket left behind.
    assert!(
        srv.wait_idle(std::time::Duration::from_secs(10)),
        "connections still open after their clients vanished"
    );
    let s = srv.stop();
    assert_eq!(s.abandoned, 0);
}

#[test]
fn pipelined_requests_are_all_answered_by_handle() {
    let t = mem();
    t.slow_writes.store(true, Ordering::Relaxed);
    let srv = TestServer::start(Arc::clone(&t));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    const N: u64 = 48;
    let t0 = std::time::Instant::now();
    for h in 0..N {
        c.request(0, CMD_WRITE, 1000 + h, h * 4096, 4096);
        c.send(&pattern(4096, h));
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..N {
        let (err, h) = c.simple_reply().unwrap_or_else(|e| panic!("reply: {e}"));
        assert_eq!(err, 0);
        assert!(seen.insert(h), "duplicate reply for handle {h}");
    }
    assert_eq!(seen, (1000..1000 + N).collect());
    // Each write sleeps 50 ms; served one at a time they would take ~2.4 s. Concurrent
    // execution makes it a fraction of that (loose bound for slow CI machines).
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_millis(1200),
        "requests were not served concurrently: {took:?}"
    );
    let d = t.data.lock();
    for h in 0..N as usize {
        assert_eq!(&d[h * 4096..(h + 1) * 4096], &pattern(4096, h as u64)[..]);
    }
}

#[test]
fn target_errors_are_mapped_to_protocol_errors() {
    let t = mem();
    let srv = TestServer::start(Arc::clone(&t));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    for (host, wire) in [
        (libc::EIO, EIO),
        (libc::ENOSPC, ENOSPC),
        (libc::EROFS, EPERM),
        (libc::ENXIO, EIO),
    ] {
        *t.fail_writes_with.lock() = Some(host);
        c.request(0, CMD_WRITE, 7, 0, 3);
        c.send(b"abc");
        assert_eq!(c.simple_reply().ok(), Some((wire, 7)));
    }
    *t.fail_writes_with.lock() = None;
    c.request(CMD_FLAG_FUA, CMD_WRITE, 8, 0, 3);
    c.send(b"abc");
    assert_eq!(c.simple_reply().ok(), Some((0, 8)));
}

#[test]
fn read_only_export_refuses_writes() {
    let mut m = MemTarget::new(SIZE);
    m.read_only = true;
    let srv = TestServer::start(Arc::new(m));
    let (mut c, _, flags) = RawClient::handshake(&srv.sock);
    assert_ne!(flags & TFLAG_READ_ONLY, 0);
    assert_eq!(flags & TFLAG_SEND_TRIM, 0);
    c.request(0, CMD_WRITE, 1, 0, 2);
    c.send(b"no");
    assert_eq!(c.simple_reply().ok(), Some((EPERM, 1)));
    c.request(0, CMD_WRITE_ZEROES, 2, 0, 2);
    assert_eq!(c.simple_reply().ok(), Some((EPERM, 2)));
    c.request(0, CMD_FLUSH, 3, 0, 0);
    assert_eq!(c.simple_reply().ok(), Some((0, 3)));
}

#[test]
fn structured_replies_for_reads() {
    let srv = TestServer::start(mem());
    let mut c = RawClient::connect(&srv.sock);
    c.greet();
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().1, REP_ACK);
    c.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    while c.option_reply().1 != REP_ACK {}
    c.request(0, CMD_WRITE, 1, 10, 3);
    c.send(b"xyz");
    assert_eq!(c.simple_reply().ok(), Some((0, 1)));
    c.request(0, CMD_READ, 2, 10, 3);
    let h = c.read_n(STRUCTURED_READ_HEADER_BYTES).unwrap_or_default();
    assert_eq!(&h[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&h[4..6], &REPLY_FLAG_DONE.to_be_bytes());
    assert_eq!(&h[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
    assert_eq!(&h[8..16], &2u64.to_be_bytes());
    assert_eq!(&h[16..20], &11u32.to_be_bytes());
    assert_eq!(&h[20..28], &10u64.to_be_bytes());
    assert_eq!(c.read_n(3).ok().as_deref(), Some(&b"xyz"[..]));
    // A read error is a structured error chunk, never a simple reply.
    c.request(0, CMD_READ, 3, SIZE as u64, 3);
    let h = c.read_n(STRUCTURED_HEADER_BYTES + 6).unwrap_or_default();
    assert_eq!(&h[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&h[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
    assert_eq!(&h[20..24], &EINVAL.to_be_bytes());
}

#[test]
fn graceful_shutdown_answers_in_flight_requests() {
    let t = mem();
    t.slow_writes.store(true, Ordering::Relaxed);
    let srv = TestServer::start(Arc::clone(&t));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    const N: u64 = 20;
    for h in 0..N {
        c.request(0, CMD_WRITE, h, h * 512, 512);
        c.send(&[h as u8 + 1; 512]);
    }
    // Wait until the server has read them all (first reply arrives), then stop.
    let first = c.simple_reply().unwrap_or_else(|e| panic!("reply: {e}"));
    assert_eq!(first.0, 0);
    let sock = srv.sock.clone();
    let summary = srv.stop();
    assert_eq!(summary.abandoned, 0);
    for _ in 1..N {
        let (err, _) = c
            .simple_reply()
            .unwrap_or_else(|e| panic!("reply lost: {e}"));
        assert_eq!(err, 0);
    }
    assert!(c.closed_by_server());
    assert!(!sock.exists(), "socket file left behind");
    let d = t.data.lock();
    for h in 0..N as usize {
        assert!(d[h * 512..(h + 1) * 512].iter().all(|&b| b == h as u8 + 1));
    }
}

#[test]
fn remote_tcp_needs_explicit_permission() {
    let cfg = ServerConfig::new(ListenAddr::Tcp(
        "0.0.0.0:0".parse().unwrap_or_else(|_| unreachable!()),
    ));
    assert!(Server::bind(mem(), cfg).is_err());
    let cfg = ServerConfig::new(ListenAddr::Tcp(
        "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
    ));
    let s = Server::bind(mem(), cfg).unwrap_or_else(|e| panic!("loopback bind: {e}"));
    assert!(matches!(s.local_addr(), ListenAddr::Tcp(a) if a.port() != 0));
}

#[test]
fn second_server_on_same_socket_is_refused() {
    let srv = TestServer::start(mem());
    let cfg = ServerConfig::new(ListenAddr::Unix(srv.sock.clone()));
    assert!(Server::bind(mem(), cfg).is_err());
    still_serving(&srv.sock);
}

#[test]
fn connections_beyond_the_limit_are_closed_at_once() {
    use dhrd_nbd::limits::MAX_CONNECTIONS;
    use std::io::Read;
    let srv = TestServer::start(mem());
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut c = RawClient::connect(&srv.sock);
        // The greeting proves the server registered the connection.
        assert!(c.read_n(18).is_ok());
        held.push(c);
    }
    let mut extra = RawClient::connect(&srv.sock);
    let mut b = [0u8; 18];
    let n = extra.s.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "connection over the limit was served");
    // Freeing one slot lets a new client in.
    drop(held.pop());
    assert!(srv.wait_idle_below(MAX_CONNECTIONS, std::time::Duration::from_secs(10)));
    still_serving(&srv.sock);
}

#[test]
#[allow(clippy::expect_used)] // a test fails loudly by design
fn idle_connections_give_their_slots_to_new_clients() {
    use dhrd_nbd::client::Client;
    use std::time::Duration;
    // Generous compared with the gaps between this test's own steps, so that only the
    // clients made idle on purpose can ever be chosen.
    const EVICT_AFTER: Duration = Duration::from_secs(3);
    let srv = TestServer::start_with(mem(), |c| {
        c.max_connections = 3;
        c.idle_evict_after = EVICT_AFTER;
    });
    let sock = srv.sock.clone();
    let connect = || Client::connect(&sock).unwrap_or_else(|e| panic!("connect: {e}"));
    // Two clients go idle after an acknowledged write each.
    let mut old1 = connect();
    old1.write(0, b"first", false).expect("write 1");
    let mut old2 = connect();
    old2.write(4096, b"second", false).expect("write 2");
    std::thread::sleep(EVICT_AFTER + Duration::from_millis(500));
    old2.read(4096, 1)
        .expect("old2 becomes the more recently active one");
    // The third slot goes to a fresh client; all slots are now taken.
    let mut fresh = connect();
    fresh.read(0, 1).expect("fresh client");
    // A fourth client takes the slot of the connection idle longest (old1) and is served;
    // old1's acknowledged write is still there.
    let mut newcomer = connect();
    assert_eq!(newcomer.read(0, 5).expect("newcomer read"), b"first");
    assert_eq!(srv.handle().evicted_connections(), 1);
    // The evicted client sees the connection end; the others keep working.
    assert!(old1.read(0, 1).is_err(), "evicted client still served");
    assert_eq!(old2.read(4096, 6).expect("old2"), b"second");
    fresh.write(8192, b"fresh", false).expect("fresh write");
    // No connection is idle long enough now: a fifth client is refused at once.
    let mut extra = RawClient::connect(&srv.sock);
    let mut b = [0u8; 18];
    let n = std::io::Read::read(&mut extra.s, &mut b).unwrap_or(0);
    assert_eq!(
        n, 0,
        "a client over the limit was served while none was idle"
    );
    assert_eq!(srv.handle().evicted_connections(), 1);
    let summary = srv.stop();
    assert_eq!((summary.evicted, summary.refused), (1, 1));
}

#[test]
fn random_requests_and_garbage_never_break_the_server() {
    let t = mem();
    let srv = TestServer::start(Arc::clone(&t));
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..200 {
        let (mut c, _, _) = RawClient::handshake(&srv.sock);
        for _ in 0..(rnd() % 8) {
            let r = rnd();
            // Mostly valid magic with random fields; sometimes pure garbage.
            let cmd = (r % 9) as u16;
            let flags = ((r >> 8) % 64) as u16;
            let offset = match (r >> 16) % 3 {
                0 => rnd() % (2 * SIZE as u64),
                1 => rnd(),
                _ => SIZE as u64 - 1,
            };
            let len = match (r >> 24) % 4 {
                0 => (rnd() % 70_000) as u32,
                1 => rnd() as u32,
                2 => 0,
                _ => 1,
            };
            if round % 10 == 9 {
                let g: Vec<u8> = (0..(r % 100)).map(|_| rnd() as u8).collect();
                let _ = c.s.write_all(&g);
                continue;
            }
            let _ =
                c.s.write_all(&encode_request(flags, cmd, rnd(), offset, len));
            if cmd == CMD_WRITE && len <= 70_000 {
                // Sometimes the full payload, sometimes a truncated one.
                let n = if r % 5 == 0 { len / 2 } else { len } as usize;
                let _ = c.s.write_all(&vec![0x77; n]);
            }
        }
        drop(c);
    }
    still_serving(&srv.sock);
    assert!(
        srv.wait_idle(std::time::Duration::from_secs(20)),
        "connections left behind"
    );
    let s = srv.stop();
    assert_eq!(s.abandoned, 0);
}
