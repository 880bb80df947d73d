//! Which requests of a client that sends one request at a time keep the reader role with
//! the thread that executes them (`gate.rs`: a *quiet* hand-off wakes no second thread).
//! Counted through the server's statistics, not timed: a read with a small reply is as
//! cheap to answer as a write's header, so a stream of them must turn the connection
//! serial; a read whose reply is sent straight from the target's memory (64 KiB and up)
//! may wait for the client and must always wake a second reader.

mod common;

use common::*;
use dhrd_nbd::proto::*;

/// More than the gate's `SERIAL_AFTER_QUIET_REQUESTS`, so the connection turns serial.
const ONE_AT_A_TIME: u64 = 64;

fn read_one(c: &mut RawClient, handle: u64, offset: u64, len: u32) {
    c.request(0, CMD_READ, handle, offset, len);
    assert_eq!(c.simple_reply().ok(), Some((0, handle)), "read {handle}");
    c.read_n(len as usize)
        .unwrap_or_else(|e| panic!("payload of read {handle}: {e}"));
}

/// A server and a client that has read [`ONE_AT_A_TIME`] 4 KiB blocks one at a time; the
/// connection must be serial by then.
fn serial_client() -> (TestServer, RawClient) {
    let srv = TestServer::start(MemTarget::new(4 << 20));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    for i in 0..ONE_AT_A_TIME {
        read_one(&mut c, i, 4096 * i, 4096);
    }
    let s = srv.handle().stats();
    assert!(
        s.quiet_handoffs > 0,
        "4 KiB reads one at a time never made the connection serial: {s:?}"
    );
    (srv, c)
}

#[test]
fn small_reads_one_at_a_time_are_served_without_waking_a_second_reader() {
    let (srv, mut c) = serial_client();
    // Up to just under the zero-copy bound, reads still leave quietly.
    let before = srv.handle().stats();
    for i in 0..ONE_AT_A_TIME {
        read_one(&mut c, 500 + i, 4096 * i, (64 << 10) - 4096);
    }
    let after = srv.handle().stats();
    assert!(
        after.quiet_handoffs > before.quiet_handoffs,
        "60 KiB reads one at a time woke a second reader each: {after:?}"
    );
}

#[test]
fn a_read_answered_from_the_targets_memory_always_wakes_a_second_reader() {
    let (srv, mut c) = serial_client();
    let serial = srv.handle().stats();
    for i in 0..16u64 {
        read_one(&mut c, 1000 + i, (64 << 10) * i, 64 << 10);
    }
    let after = srv.handle().stats();
    assert_eq!(
        after.quiet_handoffs, serial.quiet_handoffs,
        "a 64 KiB read kept the reader role: {after:?}"
    );
}
