//! Connection slots: how long a negotiation may hold a slot. No assertion depends on how
//! fast anything runs (waits for liveness are generous).

mod common;

use common::*;
use dhrd_nbd::proto::*;
use dhrd_nbd::{ListenAddr, NbdError, Server, ServerConfig};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SIZE: usize = 1 << 20;
/// Upper bound for anything that must happen eventually.
const LIVENESS: Duration = Duration::from_secs(20);

/// The server ended the connection with an orderly close: end of stream, no stray bytes,
/// no reset.
fn closed_cleanly(c: &mut RawClient) -> bool {
    let mut b = [0u8; 1];
    matches!(c.s.read(&mut b), Ok(0))
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
    ];
    for c in bad {
        assert!(matches!(
            Server::bind(MemTarget::new(SIZE), c),
            Err(NbdError::Config(_))
        ));
    }
}
