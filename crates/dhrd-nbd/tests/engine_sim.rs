//! The engine over a simulated disk that knows exactly what is durable, seen through NBD:
//! - durability: in `fsync` mode a FUA write is durable when acknowledged, a plain write is
//!   durable after a FLUSH on any connection (CAN_MULTI_CONN) or when the server closes
//!   the connection to free its slot; in `sync` mode every acknowledged write is durable;
//! - backing failures (SPEC C4, C5): ENOSPC fails one request and the export stays
//!   writable; EIO fails the request, the export turns read-only for good (new
//!   connections are told so), and reads keep working.

mod common;

use common::*;
use dhrd_engine::{Durability, HybridObject, ObjectConfig};
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

fn sim_export(durability: Durability) -> (HybridObject<SimBacking>, TestServer) {
    sim_export_with(durability, |_| {})
}

fn sim_export_with(
    durability: Durability,
    tweak: impl FnOnce(&mut dhrd_nbd::ServerConfig),
) -> (HybridObject<SimBacking>, TestServer) {
    let obj = HybridObject::open(
        SimBacking::from_bytes(vec![0u8; SIZE], 2),
        ObjectConfig {
            fixed_len: true,
            chunk_bytes: 1 << 20,
            durability,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("open: {e}"));
    assert!(obj.wait_loaded(Some(Duration::from_secs(20))));
    let srv = TestServer::start_with(EngineTarget::new(obj.clone(), false), tweak);
    (obj, srv)
}

fn durable_has(obj: &HybridObject<SimBacking>, off: usize, data: &[u8]) -> bool {
    obj.backing().durable()[off..off + data.len()] == *data
}

#[test]
fn fsync_mode_fua_and_flush_make_writes_durable() {
    let (obj, srv) = sim_export(Durability::Fsync);
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    let (mut b, _, _) = RawClient::handshake(&srv.sock);

    // A plain write is acknowledged from RAM: readers see it, the disk need not have it.
    a.request(0, CMD_WRITE, 1, 4096, 5);
    a.send(b"plain");
    assert_eq!(a.simple_reply().ok(), Some((0, 1)));
    b.request(0, CMD_READ, 2, 4096, 5);
    assert_eq!(b.simple_reply().ok(), Some((0, 2)));
    assert_eq!(b.read_n(5).ok().as_deref(), Some(&b"plain"[..]));
    assert!(
        !durable_has(&obj, 4096, b"plain"),
        "fsync mode synced a plain write"
    );

    // FUA: durable when acknowledged.
    a.request(CMD_FLAG_FUA, CMD_WRITE, 3, 8192, 3);
    a.send(b"fua");
    assert_eq!(a.simple_reply().ok(), Some((0, 3)));
    assert!(
        durable_has(&obj, 8192, b"fua"),
        "FUA write not durable at its reply"
    );

    // A FLUSH on another connection covers every completed write (multi-conn).
    a.request(0, CMD_WRITE, 4, 12288, 5);
    a.send(b"other");
    assert_eq!(a.simple_reply().ok(), Some((0, 4)));
    b.request(0, CMD_FLUSH, 5, 0, 0);
    assert_eq!(b.simple_reply().ok(), Some((0, 5)));
    assert!(durable_has(&obj, 12288, b"other"));

    // TRIM and WRITE_ZEROES with FUA are durable too.
    a.request(CMD_FLAG_FUA, CMD_TRIM, 6, 12288, 5);
    assert_eq!(a.simple_reply().ok(), Some((0, 6)));
    assert!(durable_has(&obj, 12288, &[0u8; 5]));
    a.request(
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_WRITE_ZEROES,
        7,
        8192,
        3,
    );
    assert_eq!(a.simple_reply().ok(), Some((0, 7)));
    assert!(durable_has(&obj, 8192, &[0u8; 3]));
}

#[test]
fn fsync_mode_an_evicted_clients_writes_are_durable_when_it_sees_the_close() {
    const GRACE: Duration = Duration::from_secs(1);
    let (obj, srv) = sim_export_with(Durability::Fsync, |c| {
        c.max_connections = 1;
        c.idle_evict_after = GRACE;
    });
    let (mut a, _, _) = RawClient::handshake(&srv.sock);
    a.request(0, CMD_WRITE, 1, 4096, 7);
    a.send(b"evicted");
    assert_eq!(a.simple_reply().ok(), Some((0, 1)));
    assert!(!durable_has(&obj, 4096, b"evicted"));
    // Idle past the grace period, A gives its slot to B. It never sent FLUSH and now
    // cannot: the server flushes for it before closing the socket.
    std::thread::sleep(GRACE + Duration::from_millis(500));
    let (mut b, _, _) = RawClient::handshake(&srv.sock);
    assert!(a.closed_by_server());
    assert!(
        durable_has(&obj, 4096, b"evicted"),
        "an evicted client's acknowledged write was not flushed"
    );
    b.request(0, CMD_READ, 2, 4096, 7);
    assert_eq!(b.simple_reply().ok(), Some((0, 2)));
    assert_eq!(b.read_n(7).ok().as_deref(), Some(&b"evicted"[..]));
}

#[test]
fn sync_mode_acknowledged_writes_are_durable() {
    let (obj, srv) = sim_export(Durability::Sync);
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    for i in 0..16u64 {
        c.request(0, CMD_WRITE, i, i * 70_000 + 13, 7);
        c.send(format!("write{i:02}").as_bytes());
    }
    for _ in 0..16 {
        let (err, _) = c.simple_reply().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(err, 0);
    }
    for i in 0..16u64 {
        let off = (i * 70_000 + 13) as usize;
        assert!(durable_has(&obj, off, format!("write{i:02}").as_bytes()));
    }
    // Crash image: everything acknowledged survives a power cut now.
    let img = obj.backing().crash_image();
    for i in 0..16u64 {
        let off = (i * 70_000 + 13) as usize;
        assert_eq!(&img.data[off..off + 7], format!("write{i:02}").as_bytes());
    }
}
