//! NBD_CMD_BLOCK_STATUS with `base:allocation`: the meta context negotiation and the
//! replies on the wire, then the real clients that use them (nbdinfo --map, nbdcopy,
//! qemu-img map and convert), which must skip the holes of a sparse export: the server's
//! statistics count the bytes they read.

mod common;

use common::*;
use dhrd_nbd::proto::*;
use std::process::Command;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
/// Data of the sparse export: 1 MiB at 8 MiB, 64 KiB at 40 MiB, the last 1 MiB.
const DATA: [(u64, u64); 3] = [(8 * MIB, MIB), (40 * MIB, 64 << 10), (SIZE - MIB, MIB)];

fn data_bytes() -> u64 {
    DATA.iter().map(|d| d.1).sum()
}

fn text(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// (offset, length, type) of each line of `nbdinfo --map`.
fn map_of(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = text(&run_ok(Command::new(tool("nbdinfo")).args(["--map", uri])));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
            (n(0), n(1), n(2) as u32)
        })
        .collect()
}

fn meta_payload(queries: &[&str]) -> Vec<u8> {
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    p
}

/// Negotiates structured replies and `base:allocation`, then enters transmission.
fn block_status_client(sock: &std::path::Path) -> (RawClient, u32) {
    let mut c = RawClient::connect(sock);
    c.greet();
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().1, REP_ACK);
    c.option(OPT_SET_META_CONTEXT, &meta_payload(&["base:allocation"]));
    let (_, t, p) = c.option_reply();
    assert_eq!(t, REP_META_CONTEXT);
    assert_eq!(&p[4..], b"base:allocation");
    let id = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
    assert_eq!(c.option_reply().1, REP_ACK);
    c.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    while c.option_reply().1 != REP_ACK {}
    (c, id)
}

/// Reads one structured block status reply: (handle, context id, descriptors).
fn block_status_reply(c: &mut RawClient) -> (u64, u32, Vec<(u32, u32)>) {
    let h = c
        .read_n(STRUCTURED_HEADER_BYTES)
        .unwrap_or_else(|e| panic!("{e}"));
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    assert_eq!(be32(&h, 0), STRUCTURED_REPLY_MAGIC);
    let flags = u16::from_be_bytes([h[4], h[5]]);
    let rtype = u16::from_be_bytes([h[6], h[7]]);
    let handle = u64::from_be_bytes(h[8..16].try_into().unwrap_or_default());
    let len = be32(&h, 16) as usize;
    let p = c.read_n(len).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(flags, REPLY_FLAG_DONE);
    if rtype != REPLY_TYPE_BLOCK_STATUS {
        return (handle, u32::MAX, vec![(rtype.into(), be32(&p, 0))]);
    }
    let d = (4..len)
        .step_by(8)
        .map(|at| (be32(&p, at), be32(&p, at + 4)))
        .collect();
    (handle, be32(&p, 0), d)
}

#[test]
fn block_status_on_the_wire() {
    let e = engine_export_sparse(SIZE, &DATA, true);
    let (mut c, id) = block_status_client(&e.srv.sock);
    const HZ: u32 = STATE_HOLE | STATE_ZERO;
    c.request(0, CMD_BLOCK_STATUS, 1, 0, 16 * MIB as u32);
    assert_eq!(
        block_status_reply(&mut c),
        (
            1,
            id,
            vec![(8 * MIB as u32, HZ), (MIB as u32, 0), (7 * MIB as u32, HZ)]
        )
    );
    // REQ_ONE: one extent, never past the request.
    c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 2, 4 * MIB, 4096);
    assert_eq!(block_status_reply(&mut c), (2, id, vec![(4096, HZ)]));
    c.request(
        CMD_FLAG_REQ_ONE,
        CMD_BLOCK_STATUS,
        3,
        7 * MIB,
        4 * MIB as u32,
    );
    assert_eq!(block_status_reply(&mut c), (3, id, vec![(MIB as u32, HZ)]));
    // A request that ends inside an extent is cut there.
    c.request(0, CMD_BLOCK_STATUS, 4, 8 * MIB + 4096, 8192);
    assert_eq!(block_status_reply(&mut c), (4, id, vec![(8192, 0)]));
    // Past the end, and empty: EINVAL in an error chunk; the connection stays usable.
    c.request(0, CMD_BLOCK_STATUS, 5, SIZE - 4096, 8192);
    assert_eq!(
        block_status_reply(&mut c),
        (5, u32::MAX, vec![(REPLY_TYPE_ERROR.into(), EINVAL)])
    );
    c.request(0, CMD_BLOCK_STATUS, 6, 0, 0);
    assert_eq!(block_status_reply(&mut c).2[0].1, EINVAL);
    // A write fills a hole; a trim makes one.
    c.request(0, CMD_WRITE, 7, 20 * MIB, 4096);
    c.send(&[1u8; 4096]);
    assert_eq!(c.simple_reply().ok(), Some((0, 7)));
    c.request(0, CMD_TRIM, 8, 8 * MIB, MIB as u32);
    assert_eq!(c.simple_reply().ok(), Some((0, 8)));
    c.request(0, CMD_BLOCK_STATUS, 9, 16 * MIB, 8 * MIB as u32);
    let (_, _, d) = block_status_reply(&mut c);
    assert_eq!(d[0], (4 * MIB as u32, HZ));
    assert_eq!(d[1].1, 0);
    c.request(0, CMD_BLOCK_STATUS, 10, 0, 16 * MIB as u32);
    assert_eq!(block_status_reply(&mut c).2, vec![(16 * MIB as u32, HZ)]);
    let s = e.srv.handle().stats();
    assert_eq!(s.block_status, 6, "{s:?}");
    assert_eq!(s.bytes_read, 0, "block status read data: {s:?}");
}

#[test]
fn block_status_without_a_meta_context_is_refused() {
    let e = engine_export_sparse(4 * MIB, &[], false);
    let mut c = RawClient::connect(&e.srv.sock);
    c.greet();
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().1, REP_ACK);
    c.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    while c.option_reply().1 != REP_ACK {}
    c.request(0, CMD_BLOCK_STATUS, 1, 0, 4096);
    assert_eq!(block_status_reply(&mut c).2[0].1, EINVAL);
}

#[test]
fn nbdinfo_map_shows_the_holes_loaded_or_not() {
    for loaded in [false, true] {
        let e = engine_export_sparse(SIZE, &DATA, loaded);
        let map = map_of(&e.srv.uri());
        let data: Vec<(u64, u64)> = map
            .iter()
            .filter(|m| m.2 == 0)
            .map(|m| (m.0, m.1))
            .collect();
        assert_eq!(data, DATA.to_vec(), "loaded {loaded}: {map:?}");
        assert!(map.iter().all(|m| m.2 == 0 || m.2 == 3), "{map:?}");
        assert_eq!(map.iter().map(|m| m.1).sum::<u64>(), SIZE);
    }
}

#[test]
fn sparse_copies_skip_the_holes() {
    let e = engine_export_sparse(SIZE, &DATA, true);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let want = std::fs::read(&e.backing).unwrap_or_else(|e| panic!("{e}"));
    // nbdcopy to a file: same bytes, and only the data was read.
    let out = dir.path().join("nbdcopy.img");
    run_ok(Command::new(tool("nbdcopy")).arg(e.srv.uri()).arg(&out));
    assert!(
        std::fs::read(&out).ok() == Some(want.clone()),
        "nbdcopy copy differs"
    );
    let read_nbdcopy = e.srv.handle().stats().bytes_read;
    // qemu-img convert: the same.
    let out2 = dir.path().join("qemu.img");
    run_ok(
        Command::new(tool("qemu-img"))
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(e.srv.uri())
            .arg(&out2),
    );
    assert!(
        std::fs::read(&out2).ok() == Some(want),
        "qemu-img copy differs"
    );
    let read_qemu = e.srv.handle().stats().bytes_read - read_nbdcopy;
    eprintln!(
        "{} data bytes of {SIZE}: nbdcopy read {read_nbdcopy}, qemu-img convert read {read_qemu}",
        data_bytes()
    );
    // Requests are aligned to the client's own sizes, so allow a few MiB around the data.
    for (who, n) in [("nbdcopy", read_nbdcopy), ("qemu-img", read_qemu)] {
        assert!(n >= data_bytes(), "{who} read {n}, less than the data");
        assert!(
            n <= data_bytes() + 8 * MIB,
            "{who} read {n} of {SIZE}: holes were read"
        );
    }
    // qemu-img map agrees on what is data.
    let map = text(&run_ok(
        Command::new(tool("qemu-img"))
            .args(["map", "--output=json", "-f", "raw"])
            .arg(e.srv.uri()),
    ));
    assert!(map.contains("\"zero\": true"), "{map}");
}
