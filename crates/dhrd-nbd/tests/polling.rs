//! The server's count of how it waited for request headers (`polls_caught`,
//! `polls_missed`): whether a request arrived while a reader polled, or cost a kernel
//! wake-up. One test in its own process: polling is limited to one thread per process,
//! so servers of other tests running at the same time would make this one skip polls.
//! Sleeps only let time pass.

mod common;

use common::*;
use dhrd_nbd::proto::*;
use std::time::Duration;

/// A client at queue depth 1 that sends each request as soon as it has the last reply.
fn ping_pong(c: &mut RawClient, requests: u64, pause: Duration) {
    for handle in 1..=requests {
        c.request(0, CMD_READ, handle, 4096 * handle, 4096);
        assert_eq!(c.simple_reply().ok(), Some((0, handle)), "read {handle}");
        c.read_n(4096).unwrap_or_else(|e| panic!("payload: {e}"));
        std::thread::sleep(pause);
    }
}

#[test]
fn waits_for_requests_are_counted_as_caught_by_polling_or_missed() {
    const REQUESTS: u64 = 20;
    // A budget far beyond the client's turn-around: every wait ends caught, except the
    // first, which may begin before the handshake's last bytes are read.
    let srv = TestServer::start_with(MemTarget::new(1 << 20), |c| {
        c.poll_before_block = Duration::from_secs(5);
    });
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    ping_pong(&mut c, REQUESTS, Duration::ZERO);
    let s = srv.handle().stats();
    assert_eq!(s.polls_missed, 0, "{s:?}");
    assert!(s.polls_caught >= REQUESTS - 1, "{s:?}");
    drop(c);
    srv.stop();

    // A client that pauses longer than the budget: the reader gives up polling and
    // blocks, and the count says so.
    let srv = TestServer::start_with(MemTarget::new(1 << 20), |c| {
        c.poll_before_block = Duration::from_millis(1);
    });
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    ping_pong(&mut c, 4, Duration::from_millis(100));
    let s = srv.handle().stats();
    assert!(s.polls_missed >= 3, "{s:?}");
    drop(c);
    srv.stop();

    // Polling off: nothing is counted.
    let srv = TestServer::start_with(MemTarget::new(1 << 20), |c| {
        c.poll_before_block = Duration::ZERO;
    });
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    ping_pong(&mut c, 4, Duration::ZERO);
    let s = srv.handle().stats();
    assert_eq!((s.polls_caught, s.polls_missed), (0, 0), "{s:?}");
    drop(c);
    srv.stop();
}
