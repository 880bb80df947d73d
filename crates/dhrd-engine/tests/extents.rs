//! Block status (`HybridObject::extents`): holes of a file backing, zeros the RAM tier
//! knows of, and the bounds of the answer.

use dhrd_engine::{Allocation, Extent, HybridObject, ObjectConfig};
use dhrd_io::{FileBacking, FileOptions, SimBacking};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

fn ext(len: u64, allocation: Allocation) -> Extent {
    Extent { len, allocation }
}

fn cfg(chunk_bytes: u64) -> ObjectConfig {
    ObjectConfig {
        chunk_bytes,
        fixed_len: true,
        name: "extents".into(),
        ..Default::default()
    }
}

fn sparse_file(dir: &std::path::Path, len: u64, data: &[(u64, u64)]) -> FileBacking {
    let path = dir.join("b.img");
    let f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
    f.set_len(len).unwrap_or_else(|e| panic!("{e}"));
    for &(off, n) in data {
        f.write_all_at(&vec![0x5a; n as usize], off)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    drop(f);
    FileBacking::open(&path, &FileOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn holes_of_the_backing_are_reported_loaded_or_not() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let b = sparse_file(dir.path(), 16 * MIB, &[(4 * MIB, MIB)]);
    let o = HybridObject::open(
        b,
        ObjectConfig {
            load_disabled: true,
            ..cfg(MIB)
        },
    )?;
    let want = vec![
        ext(4 * MIB, Allocation::Hole),
        ext(MIB, Allocation::Data),
        ext(11 * MIB, Allocation::Hole),
    ];
    // Nothing Loaded: the backing answers.
    assert_eq!(o.extents(0, 16 * MIB, 64)?, want);
    while !matches!(o.load_step(), dhrd_engine::LoadStep::Idle) {}
    assert!(o.is_fully_loaded());
    // Loaded: the same (RAM equals the backing).
    assert_eq!(o.extents(0, 16 * MIB, 64)?, want);
    // A write fills a hole, a trim makes one.
    o.write_at(&[1u8; 4096], 8 * MIB)?;
    o.zero_range(4 * MIB, MIB)?;
    let got = o.extents(0, 16 * MIB, 64)?;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], ext(8 * MIB, Allocation::Hole));
    assert_eq!(got[1].allocation, Allocation::Data);
    assert!(got[1].len >= 4096, "{got:?}");
    assert_eq!(got.iter().map(|e| e.len).sum::<u64>(), 16 * MIB);
    // Bounds: clipped to the request and to the length, limited in number.
    assert_eq!(o.extents(MIB, 4096, 64)?, vec![ext(4096, Allocation::Hole)]);
    assert_eq!(
        o.extents(15 * MIB, 8 * MIB, 64)?,
        vec![ext(MIB, Allocation::Hole)]
    );
    assert_eq!(o.extents(16 * MIB, MIB, 64)?, vec![]);
    assert_eq!(
        o.extents(0, 16 * MIB, 1)?,
        vec![ext(8 * MIB, Allocation::Hole)]
    );
    assert_eq!(o.extents(0, 16 * MIB, 2)?.len(), 2);
    Ok(())
}

#[test]
fn zeros_the_ram_tier_knows_of_are_reported_over_a_backing_without_holes(
) -> Result<(), Box<dyn std::error::Error>> {
    // The simulated disk reports no holes (the default: all data), like an RBD image.
    let sim = Arc::new(SimBacking::from_bytes(vec![0x33; 4 * MIB as usize], 7));
    let o = HybridObject::open(sim, cfg(256 << 10))?;
    assert!(o.wait_loaded(Some(WAIT)));
    assert_eq!(
        o.extents(0, 4 * MIB, 64)?,
        vec![ext(4 * MIB, Allocation::Data)]
    );
    o.zero_range(MIB, MIB)?;
    assert_eq!(
        o.extents(0, 4 * MIB, 64)?,
        vec![
            ext(MIB, Allocation::Data),
            ext(MIB, Allocation::Zero),
            ext(2 * MIB, Allocation::Data)
        ]
    );
    // A write over zeros makes that page data again.
    o.write_at(&[9u8; 4096], MIB + 8192)?;
    let got = o.extents(MIB, MIB, 64)?;
    assert_eq!(
        got,
        vec![
            ext(8192, Allocation::Zero),
            ext(4096, Allocation::Data),
            ext(MIB - 12288, Allocation::Zero)
        ]
    );
    Ok(())
}

#[test]
fn chunks_not_loaded_over_a_backing_without_holes_are_data(
) -> Result<(), Box<dyn std::error::Error>> {
    let sim = Arc::new(SimBacking::from_bytes(vec![0; 2 * MIB as usize], 7));
    let o = HybridObject::open(
        sim,
        ObjectConfig {
            load_disabled: true,
            ..cfg(MIB)
        },
    )?;
    // The RAM of an Unloaded chunk is a hole, but it is not what reads return.
    assert_eq!(
        o.extents(0, 2 * MIB, 64)?,
        vec![ext(2 * MIB, Allocation::Data)]
    );
    Ok(())
}
