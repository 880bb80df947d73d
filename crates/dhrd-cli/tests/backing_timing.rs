//! `--backing-timing` (E1) on the real `dhrd nbd` and `dhrd load` processes: a backing
//! operation takes at least the profile's latency, data is unchanged by the emulation,
//! the startup line says which timing is active, and a bad profile is refused with the
//! accepted syntax. Times are checked from below only: a loaded machine is slower, never
//! faster, so an upper bound would only measure the machine.

use dhrd_nbd::client::Client;
use std::process::Command;
use std::time::{Duration, Instant};

mod nbd_common;
use nbd_common::*;

/// The emulated latency of every backing operation in these tests, in microseconds.
const LATENCY_US: u64 = 2000;
const PROFILE: &str = "2000,2000,2000,0";
const EXPORT_BLOCKS: u64 = 128; // 8 MiB of 64 KiB blocks

#[test]
fn nbd_backing_timing_delays_backing_reads_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    // Real data rather than a sparse file: a hole may be answered from the file's
    // metadata without any read, and the test must reach the (timed) backing.
    let mut data = Vec::with_capacity((EXPORT_BLOCKS as usize) * BLOCK);
    for i in 0..EXPORT_BLOCKS {
        data.extend_from_slice(&block(i, 1));
    }
    std::fs::write(&backing, &data).unwrap_or_else(|e| panic!("{e}"));
    // A RAM budget of one chunk keeps every other chunk on the backing, so the reads
    // below are backing reads whatever the background load has done meanwhile.
    let mut d = Dhrd::start(
        dir.path(),
        &backing,
        &["--backing-timing", PROFILE, "--mem", "1M", "--chunk", "1M"],
    );
    assert!(
        d.ready_line.contains(
            "backing timing read 2000 us, write 2000 us, sync 2000 us, unlimited bandwidth"
        ),
        "startup line without the timing: {}",
        d.ready_line
    );
    let latency = Duration::from_micros(LATENCY_US);
    let mut c = Client::connect(&d.sock).unwrap_or_else(|e| panic!("connect: {e}"));

    // Existing data, read from an unloaded chunk.
    let i = 100u64;
    let t = Instant::now();
    let got = c
        .read(i * BLOCK as u64, BLOCK as u32)
        .unwrap_or_else(|e| panic!("read: {e}"));
    let took = t.elapsed();
    assert!(got == block(i, 1), "block {i} read back wrong");
    assert!(took >= latency, "backing read took only {took:?}");

    // A write (durable at its reply in sync mode: a backing write and a sync) and the
    // same bytes read back from the backing.
    let j = 110u64;
    let t = Instant::now();
    c.write(j * BLOCK as u64, &block(j, 2), false)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let took = t.elapsed();
    assert!(took >= latency, "durable write took only {took:?}");
    let t = Instant::now();
    let got = c
        .read(j * BLOCK as u64, BLOCK as u32)
        .unwrap_or_else(|e| panic!("read: {e}"));
    let took = t.elapsed();
    assert!(got == block(j, 2), "written block {j} read back wrong");
    assert!(took >= latency, "backing read took only {took:?}");

    drop(c);
    assert_eq!(d.term(), Some(0), "stderr:\n{}", d.stderr_text());
    let disk = std::fs::read(&backing).unwrap_or_else(|e| panic!("{e}"));
    let o = j as usize * BLOCK;
    assert!(
        disk[o..o + BLOCK] == block(j, 2)[..],
        "the write is not on the backing"
    );
}

/// Runs `dhrd ARGS` to completion and returns (success, stdout, stderr).
fn dhrd(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dhrd"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_backing_timing_names_the_accepted_syntax() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let sock = dir.path().join("nbd.sock");
    let backing = backing.to_string_lossy();
    let sock = sock.to_string_lossy();
    for bad in ["fast", "1,2,3", "1,2,3,x", "1.5,0,0,0", ""] {
        let (ok, _, err) = dhrd(&[
            "nbd",
            "--backing",
            &backing,
            "--size",
            "1M",
            "--socket",
            &sock,
            "--backing-timing",
            bad,
        ]);
        assert!(!ok, "nbd accepted --backing-timing {bad:?}");
        assert!(
            err.contains("--backing-timing")
                && err.contains("ssd, hdd, nvm or READ_US,WRITE_US,SYNC_US,MBPS"),
            "nbd --backing-timing {bad:?}: {err}"
        );
        let (ok, _, err) = dhrd(&["load", &backing, "--size", "1M", "--backing-timing", bad]);
        assert!(!ok, "load accepted --backing-timing {bad:?}");
        assert!(
            err.contains("READ_US,WRITE_US,SYNC_US,MBPS"),
            "load --backing-timing {bad:?}: {err}"
        );
    }
    assert!(
        !dir.path().join("b.img").exists(),
        "a refused command created the backing"
    );
}

#[test]
fn load_backing_timing_slows_the_load_and_is_reported() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let backing = dir.path().join("b.img");
    let backing = backing.to_string_lossy();
    // One loader thread reads 4 chunks one after the other, each at least LATENCY_US.
    let (ok, out, err) = dhrd(&[
        "load",
        &backing,
        "--size",
        "4M",
        "--fill",
        "--chunk",
        "1M",
        "--loader-threads",
        "1",
        "--backing-timing",
        PROFILE,
        "--json",
    ]);
    assert!(ok, "dhrd load failed: {err}");
    let doc: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(doc["chunks_loaded"], 4, "{doc}");
    assert_eq!(
        doc["backing_timing"],
        "read 2000 us, write 2000 us, sync 2000 us, unlimited bandwidth"
    );
    let full = doc["full_load_s"].as_f64().unwrap_or(0.0);
    assert!(
        full >= 4.0 * LATENCY_US as f64 / 1e6,
        "4 timed chunk reads took only {full} s"
    );
}
