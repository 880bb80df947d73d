//! Backing failures seen through NBD (SPEC C4, C5), on the engine over a simulated disk
//! with injected faults: ENOSPC fails one request and the export stays writable; EIO fails
//! the request, the export turns read-only for good (new connections are told so), and
//! reads keep working.

mod common;

use common::*;
use dhrd_engine::{HybridObject, ObjectConfig};
use dhrd_io::{Fault, FaultKind, SimBacking};
use dhrd_nbd::proto::*;
use dhrd_nbd::EngineTarget;
use std::time::Duration;

const SIZE: usize = 4 << 20;

fn fault_now(obj: &HybridObject<SimBacking>, kind: FaultKind, persist: bool) {
    let b = obj.backing();
    b.inject(Fault {
        at_op: b.stats().ops,
        kind,
        persist,
        reads: false,
    });
}

#[test]
fn enospc_then_eio_through_nbd() {
    let obj = HybridObject::open(
        SimBacking::from_bytes(vec![0u8; SIZE], 1),
        ObjectConfig {
            fixed_len: true,
            chunk_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("open: {e}"));
    assert!(obj.wait_loaded(Some(Duration::from_secs(20))));
    let srv = TestServer::start(EngineTarget::new(obj.clone(), false));
    let (mut c, _, flags) = RawClient::handshake(&srv.sock);
    assert_eq!(flags & TFLAG_READ_ONLY, 0);

    c.request(0, CMD_WRITE, 1, 0, 4);
    c.send(b"good");
    assert_eq!(c.simple_reply().ok(), Some((0, 1)));

    // C5: ENOSPC fails this request only.
    fault_now(&obj, FaultKind::Enospc, false);
    c.request(0, CMD_WRITE, 2, 4096, 4);
    c.send(b"full");
    assert_eq!(c.simple_reply().ok(), Some((ENOSPC, 2)));
    c.request(0, CMD_WRITE, 3, 8192, 4);
    c.send(b"more");
    assert_eq!(c.simple_reply().ok(), Some((0, 3)));

    // C4: EIO is sticky.
    fault_now(&obj, FaultKind::Eio, true);
    c.request(0, CMD_WRITE, 4, 12288, 4);
    c.send(b"lost");
    assert_eq!(c.simple_reply().ok(), Some((EIO, 4)));
    obj.backing().clear_faults();
    c.request(0, CMD_WRITE, 5, 16384, 4);
    c.send(b"nope");
    let (err, h) = c.simple_reply().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h, 5);
    assert_ne!(err, 0, "a write succeeded after a sticky backing failure");
    // Reads still work and RAM never took the refused bytes.
    c.request(0, CMD_READ, 6, 0, 16388);
    assert_eq!(c.simple_reply().ok(), Some((0, 6)));
    let d = c.read_n(16388).unwrap_or_default();
    assert_eq!(&d[..4], b"good");
    assert_eq!(&d[4096..4100], &[0u8; 4]);
    assert_eq!(&d[8192..8196], b"more");
    assert_eq!(&d[12288..12292], &[0u8; 4]);
    assert_eq!(&d[16384..16388], &[0u8; 4]);
    // A new connection is told the export is read-only.
    let (_c2, _, flags) = RawClient::handshake(&srv.sock);
    assert_ne!(flags & TFLAG_READ_ONLY, 0);
}
