//! `RbdBacking` against a real one-node Ceph cluster: the durable-I/O contract checked
//! against an in-memory oracle, persistence across reopen, the exclusive lock, snapshots,
//! and the errors a user sees for a wrong pool, image, conf or image feature.

mod cluster;

use dhrd_io::{Durable, SplitMix64};
use dhrd_rbd::{RbdBacking, RbdError, RbdOptions, RbdSpec};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn opts(conf: &std::path::Path) -> RbdOptions {
    RbdOptions {
        conf: Some(conf.to_path_buf()),
        lock_wait: Duration::from_secs(2),
        ..Default::default()
    }
}

fn spec(name: &str) -> RbdSpec {
    RbdSpec::parse(&format!("rbd:rbd/{name}")).unwrap_or_else(|e| panic!("{e}"))
}

fn open_new(c: &cluster::Cluster, name: &str, len: u64) -> RbdBacking {
    let o = RbdOptions {
        create: true,
        min_len: Some(len),
        ..opts(&c.conf)
    };
    RbdBacking::open(&spec(name), &o).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

fn read_all(b: &RbdBacking) -> Vec<u8> {
    let len = b.len().unwrap_or_else(|e| panic!("{e}")) as usize;
    let mut v = vec![0u8; len + 4096];
    let n = b.read_at(&mut v, 0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, len, "read of the whole image is short");
    v.truncate(n);
    v
}

#[test]
fn random_operations_match_an_oracle_and_survive_reopen() {
    let (c, _g) = cluster::shared();
    let name = c.image_name("oracle");
    let b = open_new(c, &name, 8 * MIB);
    assert!(b.writes_are_durable());
    let mut oracle = vec![0u8; 8 * MIB as usize];
    let mut rng = SplitMix64::new(0x5eed_0001);
    for step in 0..300 {
        let len = oracle.len() as u64;
        match rng.next_u64() % 10 {
            0..=4 => {
                // Writes of 1 B to 1 MiB, some crossing 4 MiB object boundaries, some
                // past the end (which grows the image).
                let n = 1 + rng.next_u64() % MIB;
                let off = rng.next_u64() % (len + MIB / 2);
                let data: Vec<u8> = (0..n).map(|i| (i as u8) ^ (step as u8)).collect();
                b.write_at(&data, off)
                    .unwrap_or_else(|e| panic!("write: {e}"));
                let end = (off + n) as usize;
                if end > oracle.len() {
                    oracle.resize(end, 0);
                }
                oracle[off as usize..end].copy_from_slice(&data);
            }
            5..=6 => {
                let n = 1 + rng.next_u64() % (3 * MIB);
                let off = rng.next_u64() % (len + 4096);
                let mut buf = vec![0xAAu8; n as usize];
                let got = b
                    .read_at(&mut buf, off)
                    .unwrap_or_else(|e| panic!("read: {e}"));
                let want = oracle.len().saturating_sub(off as usize).min(n as usize);
                assert_eq!(got, want, "step {step}: read length at {off}+{n}");
                assert!(
                    buf[..got] == oracle[off as usize..off as usize + got],
                    "step {step}: bytes at {off}"
                );
            }
            7 => {
                let n = rng.next_u64() % (2 * MIB);
                let off = rng.next_u64() % len;
                b.zero_range(off, n).unwrap_or_else(|e| panic!("zero: {e}"));
                let end = (off + n).min(len) as usize;
                oracle[off as usize..end].fill(0);
            }
            8 => {
                let new = 4 * MIB + rng.next_u64() % (8 * MIB);
                b.set_len(new).unwrap_or_else(|e| panic!("set_len: {e}"));
                oracle.resize(new as usize, 0);
            }
            _ => b.sync().unwrap_or_else(|e| panic!("sync: {e}")),
        }
        assert_eq!(
            b.len().unwrap_or(0),
            oracle.len() as u64,
            "step {step}: length"
        );
    }
    // A bulk read (the loader's path, several requests in flight) agrees with the oracle.
    let mut bulk = vec![0u8; 4 * MIB as usize];
    let n = b
        .read_bulk_at(&mut bulk, 0)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, bulk.len().min(oracle.len()));
    assert!(bulk[..n] == oracle[..n], "bulk read differs");
    drop(b);
    // Everything written is in the cluster: a new client sees it.
    let b = RbdBacking::open(&spec(&name), &opts(&c.conf)).unwrap_or_else(|e| panic!("{e}"));
    assert!(read_all(&b) == oracle, "contents after reopen differ");
    drop(b);
    c.remove_image(&name);
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_lock() {
    let (c, _g) = cluster::shared();
    let name = c.image_name("lock");
    // A directory of this user that nobody else may write: owner records elsewhere are
    // refused (they could be forged).
    let owners = std::env::temp_dir().join(format!("dhrd-owners-{name}"));
    let record = owners.join("img.owner");
    let first = RbdBacking::open(
        &spec(&name),
        &RbdOptions {
            create: true,
            min_len: Some(4 * MIB),
            owner_record: Some(record.clone()),
            ..opts(&c.conf)
        },
    )
    .unwrap_or_else(|e| panic!("open {name}: {e}"));
    assert!(record.exists(), "no owner record written");
    first
        .write_at(b"first", 0)
        .unwrap_or_else(|e| panic!("{e}"));
    // The record names a live holder (this process): it must not be broken.
    let second = RbdBacking::open(
        &spec(&name),
        &RbdOptions {
            owner_record: Some(record.clone()),
            ..opts(&c.conf)
        },
    );
    match second {
        Err(RbdError::Locked { owners, .. }) => assert!(!owners.is_empty()),
        Err(e) => panic!("expected Locked, got {e}"),
        Ok(_) => panic!("a second writer opened an image the first holds"),
    }
    // The first still writes: the refused attempt did not take the lock away.
    first
        .write_at(b"still", 0)
        .unwrap_or_else(|e| panic!("first after refusal: {e}"));
    // A read-only open takes no lock.
    let ro = RbdBacking::open(
        &spec(&name),
        &RbdOptions {
            read_only: true,
            ..opts(&c.conf)
        },
    )
    .unwrap_or_else(|e| panic!("read-only open: {e}"));
    let mut buf = [0u8; 5];
    ro.read_at(&mut buf, 0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&buf, b"still");
    assert_eq!(
        ro.write_at(b"x", 0).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS))
    );
    drop(ro);
    // Closing releases the lock even while other references to the backing exist; later
    // requests fail cleanly.
    first.close();
    assert!(!record.exists(), "the owner record outlived the lock");
    assert_eq!(
        first.write_at(b"x", 0).map_err(|e| e.raw_os_error()),
        Err(Some(libc::ESHUTDOWN))
    );
    // Once the holder has closed, the lock is free at once.
    let again = RbdBacking::open(&spec(&name), &opts(&c.conf))
        .unwrap_or_else(|e| panic!("open after the holder closed: {e}"));
    drop(again);
    drop(first);
    let _ = std::fs::remove_dir_all(&owners);
    c.remove_image(&name);
}

#[test]
fn a_snapshot_is_served_read_only() {
    let (c, _g) = cluster::shared();
    let name = c.image_name("snap");
    let b = open_new(c, &name, 4 * MIB);
    b.write_at(b"before", 0).unwrap_or_else(|e| panic!("{e}"));
    drop(b);
    c.rbd(&["snap", "create", &format!("rbd/{name}@s1")]);
    let b = RbdBacking::open(&spec(&name), &opts(&c.conf)).unwrap_or_else(|e| panic!("{e}"));
    b.write_at(b"after!", 0).unwrap_or_else(|e| panic!("{e}"));
    let snap = RbdSpec::parse(&format!("rbd:rbd/{name}@s1")).unwrap_or_else(|e| panic!("{e}"));
    let s = RbdBacking::open(&snap, &opts(&c.conf)).unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 6];
    s.read_at(&mut buf, 0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&buf, b"before");
    assert_eq!(
        s.write_at(b"x", 0).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS))
    );
    drop(s);
    drop(b);
    c.rbd(&["snap", "purge", "--no-progress", &format!("rbd/{name}")]);
    c.remove_image(&name);
}

#[test]
fn wrong_names_and_settings_get_clear_errors() {
    let (c, _g) = cluster::shared();
    let missing = RbdBacking::open(&spec(&c.image_name("missing")), &opts(&c.conf));
    let e = missing
        .err()
        .unwrap_or_else(|| panic!("a missing image opened"));
    assert!(e.to_string().contains("give a size"), "{e}");
    assert_eq!(e.errno(), libc::ENOENT);

    let no_pool = RbdSpec::parse("rbd:nosuchpool/x").unwrap_or_else(|e| panic!("{e}"));
    let e = RbdBacking::open(&no_pool, &opts(&c.conf))
        .err()
        .unwrap_or_else(|| panic!("opened"));
    assert!(e.to_string().contains("nosuchpool"), "{e}");

    let bad_conf = RbdOptions {
        conf: Some("/nonexistent/ceph.conf".into()),
        ..Default::default()
    };
    let e = RbdBacking::open(&spec("x"), &bad_conf)
        .err()
        .unwrap_or_else(|| panic!("opened"));
    assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");

    // An image without the exclusive-lock feature could be written by two clients at once.
    let name = c.image_name("nolock");
    c.rbd(&[
        "create",
        "--size",
        "4M",
        "--image-feature",
        "layering",
        &format!("rbd/{name}"),
    ]);
    let e = RbdBacking::open(&spec(&name), &opts(&c.conf))
        .err()
        .unwrap_or_else(|| panic!("opened"));
    assert!(matches!(e, RbdError::NoExclusiveLock { .. }), "{e}");
    assert!(e.to_string().contains("rbd feature enable"), "{e}");
    c.remove_image(&name);
}

/// The benchmark's plain librbd reader (`dhrd-bench rbd-read`) reads exactly what was
/// written, with pieces that do not divide the image and more of them than the depth, and
/// opens read-only beside a writer that holds the lock.
#[test]
fn the_bulk_reader_reads_the_image_with_a_window_of_requests() {
    let (c, _g) = cluster::shared();
    let name = c.image_name("bulk");
    let b = open_new(c, &name, 6 * MIB);
    let mut want = vec![0u8; 6 * MIB as usize];
    SplitMix64::new(0x5eed_0b01).fill(&mut want);
    b.write_at(&want, 0)
        .unwrap_or_else(|e| panic!("write: {e}"));
    b.sync().unwrap_or_else(|e| panic!("sync: {e}"));
    let r = dhrd_rbd::BulkReader::open(&spec(&name), &opts(&c.conf))
        .unwrap_or_else(|e| panic!("a read-only open beside the lock holder: {e}"));
    assert_eq!(r.size_bytes(), 6 * MIB);
    assert!(r.object_bytes().is_power_of_two());
    for (piece, depth) in [(1 << 20, 16), (300_000, 3), (4096, 1)] {
        let mut got = vec![0u8; 6 * MIB as usize - 100];
        r.read_window(&mut got, 100, piece, depth)
            .unwrap_or_else(|e| panic!("piece {piece} depth {depth}: {e}"));
        assert!(
            got == want[100..],
            "piece {piece} depth {depth}: wrong bytes"
        );
    }
    let mut past = vec![0u8; 4096];
    assert!(r.read_window(&mut past, 6 * MIB - 1, 4096, 1).is_err());
}
