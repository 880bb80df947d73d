//! The real `dhrd-bench replay` process on the public traces in `../shared/traces/`: verified
//! replays at queue depth 1 and 4, a target tampered with mid-run (verify must fail), an
//! O_DIRECT replay, original timing with a large speedup, and malformed traces.

use serde_json::Value;
use std::error::Error;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn Error>>;

const WEBSEARCH: &str = "websearch/WebSearch1.first24783.spc";
const HM0: &str = "msr_cambridge/hm_0.first1000.csv";
const TPCC: &str = "oltp_tpcc/tpcc-small.trace";
/// Requests per replay in the default suite (keeps every run well under a second).
const MAX_REQUESTS: u64 = 3000;
/// A small target so the folded traces overlap a lot and verify has much to check.
const SMALL_TARGET: &str = "16M";
/// How long the tamper test waits for the replayer's first write to land.
const WRITE_WAIT: Duration = Duration::from_secs(20);

fn traces_dir() -> Option<PathBuf> {
    let d = std::env::var_os("DHRD_TRACES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/traces"
            ))
        });
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!(
            "skipping: trace directory {} not found (set DHRD_TRACES_DIR)",
            d.display()
        );
        None
    }
}

fn dhrd(args: &[&str]) -> Result<Output, Box<dyn Error>> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dhrd-bench"))
        .arg("replay")
        .args(args)
        .output()?)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn read_json(p: &Path) -> Result<Value, Box<dyn Error>> {
    Ok(serde_json::from_str(&std::fs::read_to_string(p)?)?)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

#[test]
fn replay_each_trace_verified_at_qd1_and_qd4() -> TestResult {
    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let target = tmp.path().join("target.img");
    let json = tmp.path().join("out.json");
    let max = MAX_REQUESTS.to_string();
    for (trace, format, records, has_writes) in [
        (WEBSEARCH, "spc", 24_783, false),
        (HM0, "msr", 1000, true),
        (TPCC, "disksim", 6999, true),
    ] {
        for qd in ["1", "4"] {
            let tr = dir.join(trace);
            let o = dhrd(&[
                "--trace",
                s(&tr),
                "--target",
                s(&target),
                "--size",
                SMALL_TARGET,
                "--queue-depth",
                qd,
                "--verify",
                "--max-requests",
                &max,
                "--json",
                s(&json),
            ])?;
            assert!(o.status.success(), "{trace} qd {qd}: {}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("folded into the target: offset mod"), "{out}");
            assert!(out.contains("verify         OK"), "{out}");
            let j = read_json(&json)?;
            assert_eq!(j["format"], format);
            assert_eq!(j["queue_depth"].as_u64(), qd.parse().ok());
            let n = j["requests"].as_u64().unwrap_or(0);
            assert_eq!(n, MAX_REQUESTS.min(records));
            assert_eq!(
                j["reads"].as_u64().unwrap_or(0) + j["writes"].as_u64().unwrap_or(0),
                n
            );
            assert_eq!(j["span_bytes"].as_u64(), Some(16 << 20));
            assert_eq!(j["verify"]["ok"], true);
            assert_eq!(j["verify"]["mismatches"].as_u64(), Some(0));
            if has_writes {
                assert!(
                    j["verify"]["checked_bytes"].as_u64().unwrap_or(0) > 0,
                    "{trace}: verify checked nothing: {j}"
                );
            }
            assert!(j["latency_us"]["read"]["p99"].as_f64().is_some(), "{j}");
        }
    }
    Ok(())
}

/// Changes bytes the replay wrote, through a second fd, between the replay's write and its
/// later read of them: verify must fail and name the offset.
#[test]
fn tampered_target_fails_verify() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let target = tmp.path().join("target.img");
    let trace = tmp.path().join("t.spc");
    // Write 8 KiB at offset 0 at t=0, read it back at t=2 s.
    std::fs::write(&trace, "0,0,8192,W,0.0\n0,0,8192,R,2.0\n")?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&target)?;
    f.set_len(1 << 20)?;
    let child = Command::new(env!("CARGO_BIN_EXE_dhrd-bench"))
        .args(["replay", "--trace", s(&trace), "--target", s(&target)])
        .args(["--timing", "original", "--verify"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Wait until the replay's write is visible, then overwrite one byte in its range.
    let t0 = Instant::now();
    let mut b = [0u8; 8192];
    loop {
        f.read_exact_at(&mut b, 0)?;
        if b.iter().any(|&x| x != 0) {
            break;
        }
        assert!(t0.elapsed() < WRITE_WAIT, "the replay's write never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
    f.write_all_at(&[!b[4242]], 4242)?;
    let o = child.wait_with_output()?;
    assert!(
        !o.status.success(),
        "verify passed a tampered target: {}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("verify failed"), "{}", text(&o));
    assert!(err.contains("first at offset 4242"), "{}", text(&o));
    Ok(())
}

#[test]
fn direct_io_replay_on_a_temp_file() -> TestResult {
    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    // The target directory is on the build's disk, more likely to take O_DIRECT than /tmp.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let target = tmp.path().join("target.img");
    let json = tmp.path().join("out.json");
    let tr = dir.join(HM0);
    let o = dhrd(&[
        "--trace",
        s(&tr),
        "--target",
        s(&target),
        "--size",
        SMALL_TARGET,
        "--direct",
        "--queue-depth",
        "4",
        "--verify",
        "--json",
        s(&json),
    ])?;
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("O_DIRECT") {
        eprintln!("skipping: the file system refuses O_DIRECT: {}", text(&o));
        return Ok(());
    }
    assert!(o.status.success(), "{}", text(&o));
    let j = read_json(&json)?;
    assert_eq!(j["direct"], true);
    assert_eq!(j["folding"]["align"].as_u64(), Some(4096));
    assert_eq!(j["folding"]["lengths_rounded_up"], true);
    assert!(j["folding"]["aligned"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(j["verify"]["ok"], true);
    assert!(
        j["verify"]["checked_bytes"].as_u64().unwrap_or(0) > 0,
        "{j}"
    );
    Ok(())
}

#[test]
fn original_timing_with_a_large_speedup() -> TestResult {
    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let target = tmp.path().join("target.img");
    let json = tmp.path().join("out.json");
    let tr = dir.join(WEBSEARCH);
    // About 60 s of trace at 1000x: at least 60 ms.
    let o = dhrd(&[
        "--trace",
        s(&tr),
        "--target",
        s(&target),
        "--size",
        "64M",
        "--timing",
        "original",
        "--speedup",
        "1000",
        "--queue-depth",
        "2",
        "--json",
        s(&json),
    ])?;
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("start lateness"));
    let j = read_json(&json)?;
    assert_eq!(j["timing"], "original");
    assert_eq!(j["requests"].as_u64(), Some(24_783));
    let el = j["elapsed_s"].as_f64().unwrap_or(0.0);
    assert!(
        el >= 0.055,
        "replay ran faster than the trace allows: {el} s"
    );
    assert!(j["lateness_us"]["hist"]["max"].as_f64().is_some(), "{j}");
    Ok(())
}

#[test]
fn malformed_trace_fails_with_its_line_number() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let target = tmp.path().join("target.img");
    let trace = tmp.path().join("bad.spc");
    let mut f = std::fs::File::create(&trace)?;
    f.write_all(b"0,8,4096,R,0.1\n0,16,0,W,0.2\n0,x,4096,R,0.3\n0,24,4096,W,0.4\n")?;
    let o = dhrd(&["--trace", s(&trace), "--target", s(&target), "--size", "1M"])?;
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.spc:3:"), "{err}");
    let json = tmp.path().join("out.json");
    let o = dhrd(&[
        "--trace",
        s(&trace),
        "--target",
        s(&target),
        "--size",
        "1M",
        "--skip-bad",
        "--verify",
        "--json",
        s(&json),
    ])?;
    assert!(o.status.success(), "{}", text(&o));
    let j = read_json(&json)?;
    assert_eq!(j["requests"].as_u64(), Some(2));
    assert_eq!(j["bad_lines_skipped"].as_u64(), Some(1));
    assert_eq!(j["zero_size_skipped"].as_u64(), Some(1));
    Ok(())
}

/// `--nbd`: a verified replay of a trace with writes through an in-process NBD server over
/// a real engine object, one connection per worker, and the fast-request share reported.
#[test]
fn replay_through_an_nbd_export_is_verified() -> TestResult {
    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let export_bytes: u64 = 16 << 20;
    let fb = dhrd_io::FileBacking::open(
        &tmp.path().join("backing.img"),
        &dhrd_io::FileOptions {
            min_len: Some(export_bytes),
            ..Default::default()
        },
    )?;
    let cfg = dhrd_engine::ObjectConfig {
        fixed_len: true,
        ..Default::default()
    };
    let obj = dhrd_engine::HybridObject::open(fb, cfg)?;
    let sock = tmp.path().join("nbd.sock");
    let server = dhrd_nbd::Server::bind(
        dhrd_nbd::EngineTarget::new(obj, false),
        dhrd_nbd::ServerConfig::new(dhrd_nbd::ListenAddr::Unix(sock.clone())),
    )?;
    let stop = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.run());
    let json = tmp.path().join("out.json");
    let o = dhrd(&[
        "--trace",
        s(&dir.join(HM0)),
        "--nbd",
        s(&sock),
        "--queue-depth",
        "4",
        "--verify",
        "--fast-below-us",
        "60000000",
        "--json",
        s(&json),
    ])?;
    // --write-plan: the folded requests, and no I/O.
    let plan = tmp.path().join("plan.txt");
    let planned = dhrd(&[
        "--trace",
        s(&dir.join(HM0)),
        "--nbd",
        s(&sock),
        "--write-plan",
        s(&plan),
    ])?;
    assert!(planned.status.success(), "{}", text(&planned));
    let lines: Vec<String> = std::fs::read_to_string(&plan)?
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 1000);
    for l in &lines {
        let f: Vec<&str> = l.split(' ').collect();
        let (off, len): (u64, u64) = (f[1].parse()?, f[2].parse()?);
        assert!(f[0] == "R" || f[0] == "W", "{l}");
        assert!(
            off % 4096 == 0 && len % 4096 == 0 && off + len <= export_bytes,
            "{l}"
        );
    }

    // --size larger than the export is refused, naming the export's size.
    let too_big = dhrd(&[
        "--trace",
        s(&dir.join(HM0)),
        "--nbd",
        s(&sock),
        "--size",
        "1G",
    ])?;
    stop.shutdown();
    let served = thread.join().map_err(|_| "the server thread panicked")?;
    assert!(o.status.success(), "{}", text(&o));
    served?;
    assert!(!too_big.status.success());
    assert!(
        String::from_utf8_lossy(&too_big.stderr)
            .contains("exceeds the NBD export's 16777216 bytes"),
        "{}",
        text(&too_big)
    );
    let j = read_json(&json)?;
    assert_eq!(j["target_kind"], "NBD export");
    assert_eq!(j["span_bytes"].as_u64(), Some(export_bytes));
    assert_eq!(j["requests"].as_u64(), Some(1000));
    assert_eq!(j["verify"]["ok"], true, "{j}");
    assert!(
        j["verify"]["checked_bytes"].as_u64().unwrap_or(0) > 0,
        "{j}"
    );
    // Every request of an in-memory export completes within a minute.
    assert_eq!(j["fast_share"]["all"].as_f64(), Some(1.0), "{j}");
    assert!(
        j["fast_share"]["mean_us"].as_f64().unwrap_or(0.0) > 0.0,
        "{j}"
    );

    Ok(())
}
