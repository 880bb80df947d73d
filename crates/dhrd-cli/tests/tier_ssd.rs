//! The tiered device (SPEC T1) on the real `dhrd nbd` process: an SSD file caching a slow
//! backing. After a SIGKILL under write load a restart serves every acknowledged block
//! (dirty ones from the SSD) and a clean stop writes them all back to the backing.

use dhrd_nbd::client::Client;

mod nbd_common;
use nbd_common::*;

const EXPORT_BLOCKS: u64 = 64; // 4 MiB of 64 KiB blocks

#[test]
fn acknowledged_writes_survive_sigkill_on_the_ssd_tier() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("lower.img");
    let ssd = dir.path().join("ssd.img");
    blocks_file(&backing, EXPORT_BLOCKS, 1);
    let ssd_s = ssd.to_string_lossy().to_string();
    // The SSD holds half the export; the lower tier takes 20 ms per request, so the
    // write-back is far behind when the process is killed.
    let args = [
        "--tier-ssd",
        ssd_s.as_str(),
        "--tier-ssd-size",
        "2200K",
        "--backing-timing",
        "20000,20000,20000,0",
        "--chunk",
        "64K",
        "--mem",
        "1M",
    ];
    let mut d = Dhrd::start(dir.path(), &backing, &args);
    assert!(
        d.ready_line.contains("cached on SSD tier"),
        "{}",
        d.ready_line
    );
    let order: Vec<u64> = (0..EXPORT_BLOCKS).collect();
    let (acked, unacked) = write_until_killed(&mut d, &order, 2, false, 4, 24);
    let status = dir.path().join("status.json");
    let status_s = status.to_string_lossy().to_string();
    let mut with_status = args.to_vec();
    with_status.extend(["--status-file", status_s.as_str()]);
    let mut d = Dhrd::start(dir.path(), &backing, &with_status);
    let said = d.stderr_text();
    assert!(said.contains("dirty on the --tier-ssd"), "{said}");
    // The status file shows the tier: its slots and what was dirty at open.
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&status).unwrap_or_else(|e| panic!("status: {e}")),
    )
    .unwrap_or_else(|e| panic!("status JSON: {e}"));
    // (2,200 KiB - the 4 KiB header - two tables of one page) / 64 KiB = 34 slots.
    assert_eq!(doc["tier"]["slots"].as_u64(), Some(34), "{doc}");
    assert!(
        doc["tier"]["dirty_at_open"].as_u64().unwrap_or(0) > 0,
        "{doc}"
    );
    // The per-request counts the figure 11 benchmark reads its hit shares from.
    for k in [
        "read_requests_ssd",
        "read_requests_lower",
        "write_requests_ssd",
        "write_requests_lower",
    ] {
        assert!(doc["tier"][k].is_u64(), "{k} missing: {doc}");
    }
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    check_after_kill(&mut c, EXPORT_BLOCKS, &acked, &unacked, 1, 2);
    drop(c);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
    assert!(
        d.stderr_text().contains("SSD tier written back"),
        "{}",
        d.stderr_text()
    );
    check_file_blocks(&backing, &acked, 2);
}

/// The SSD records which backing it caches: started over another backing it refuses its
/// dirty chunks (and touches neither file), `--adopt-cache` writes them back over that
/// backing, and clean chunks of a backing that is not the recorded one are never served.
#[test]
fn the_ssd_tier_serves_only_the_backing_it_was_made_for() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    let ssd = dir.path().join("ssd.img");
    require_user_xattrs(dir.path());
    blocks_file(&a, EXPORT_BLOCKS, 1);
    blocks_file(&b, EXPORT_BLOCKS, 2);
    let ssd_s = ssd.to_string_lossy().to_string();
    let plain = [
        "--tier-ssd",
        ssd_s.as_str(),
        "--tier-ssd-size",
        "2200K",
        "--chunk",
        "64K",
        "--mem",
        "1M",
    ];
    // A write to the lower tier takes 5 s: the write-back is far from acknowledged at the
    // kill (its data may have reached a already, since the timed device writes first).
    let mut slow = plain.to_vec();
    slow.extend(["--backing-timing", "0,5000000,0,0"]);
    let mut d = Dhrd::start(dir.path(), &a, &slow);
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    c.write(0, &block(0, 3), false)
        .unwrap_or_else(|e| panic!("write: {e}"));
    drop(c);
    d.kill9();
    // Without the tier, a is refused: it lacks the block the SSD holds. The mark that says
    // so lives in a user extended attribute, which the suite's file system must keep.
    let marked = dhrd_io::xattr::get(
        &std::fs::File::open(&a).unwrap_or_else(|e| panic!("{e}")),
        dhrd_tier::pairing::MARK_XATTR,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let text = marked.unwrap_or_else(|| panic!("no cache mark on a backing the SSD holds dirty"));
    assert!(text.starts_with(b"dhrd cache "), "{text:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--socket"])
        .arg(dir.path().join("plain.sock"))
        .arg("--backing")
        .arg(&a)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("lacks data") && said.contains("--drop-cache-mark"),
        "{said}"
    );
    // Over b: refused, with the way out named.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(["nbd", "--socket"])
        .arg(dir.path().join("refused.sock"))
        .arg("--backing")
        .arg(&b)
        .args(plain)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("dirty chunks") && said.contains("--adopt-cache"),
        "{said}"
    );
    check_file_blocks(&b, &(0..EXPORT_BLOCKS).collect::<Vec<_>>(), 2);
    // Adopted over b: the dirty block is served and written back to b at the stop.
    let mut adopt = plain.to_vec();
    adopt.push("--adopt-cache");
    serves_block_0(dir.path(), &b, &adopt, "dirty chunks adopted", 3);
    check_file_blocks(&b, &[0], 3);
    // Back over a, cleanly: the SSD now holds b's block 0 (clean, generation 3); a's own is
    // served. The killed write-back may have left generation 3 in a as well, so a's block 0
    // is first given a generation the SSD never held.
    write_block(&a, 0, 4);
    serves_block_0(dir.path(), &a, &plain, "not trusted", 4);
}

/// Starts dhrd over `backing` with `args`, checks that its stderr says `said` and that
/// block 0 reads as generation `gen`, and stops it cleanly.
fn serves_block_0(
    dir: &std::path::Path,
    backing: &std::path::Path,
    args: &[&str],
    said: &str,
    gen: u64,
) {
    let mut d = Dhrd::start(dir, backing, args);
    assert!(d.stderr_text().contains(said), "{}", d.stderr_text());
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));
    let got = c
        .read(0, BLOCK as u32)
        .unwrap_or_else(|e| panic!("read: {e}"));
    assert!(got == block(0, gen), "block 0 is not of generation {gen}");
    drop(c);
    assert_eq!(d.term(), Some(0), "{}", d.stderr_text());
}

/// Writes block `i` of generation `gen` into `path` directly, keeping its extended
/// attributes (the cache mark).
fn write_block(path: &std::path::Path, i: u64, gen: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{e}"));
    f.write_all_at(&block(i, gen), i * BLOCK as u64)
        .unwrap_or_else(|e| panic!("{e}"));
    f.sync_all().unwrap_or_else(|e| panic!("{e}"));
}
