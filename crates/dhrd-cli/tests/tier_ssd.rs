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
    // (2,200 KiB - the 4 KiB header) / (64 KiB + a 16-byte entry) = 34 slots.
    assert_eq!(doc["tier"]["slots"].as_u64(), Some(34), "{doc}");
    assert!(
        doc["tier"]["dirty_at_open"].as_u64().unwrap_or(0) > 0,
        "{doc}"
    );
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
