//! The real `dhrd-bench replay` process: verified replays at queue depth 1 and 4, a target
//! tampered with mid-run (verify must fail), an O_DIRECT replay, original timing with a
//! large speedup, a replay through an NBD export, and malformed traces.
//!
//! Every test runs on synthetic traces that it generates from a fixed seed
//! (`trace_fixtures`), so it checks the replayer on any machine, and those runs are checked
//! exactly: request and byte counts, folding statistics, the folded plan. Where the public
//! traces in `../shared/traces/` exist, the tests run on them as well.

mod trace_fixtures;

use serde_json::Value;
use std::error::Error;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use trace_fixtures::{traces_dir, Synthetic, HM0, TPCC, WEBSEARCH};

type TestResult = Result<(), Box<dyn Error>>;

/// Requests per replay in the default suite (keeps every run well under a second).
const MAX_REQUESTS: u64 = 3000;
/// A small target so the folded traces overlap a lot and verify has much to check.
const SMALL_TARGET: &str = "16M";
const SMALL_TARGET_BYTES: u64 = 16 << 20;
// A synthetic request never crosses a window boundary, so in a span that is a multiple of
// the window nothing is clipped and the bytes moved are known exactly.
const _: () = assert!(SMALL_TARGET_BYTES.is_multiple_of(trace_fixtures::WINDOW_BYTES));
/// The span of the original-timing replays (a multiple of the synthetic window as well).
const TIMING_TARGET: &str = "64M";
const TIMING_TARGET_BYTES: u64 = 64 << 20;
const _: () = assert!(TIMING_TARGET_BYTES.is_multiple_of(trace_fixtures::WINDOW_BYTES));
/// The synthetic SPC trace spans about 14 s: at this speedup, about 140 ms.
const SYNTHETIC_SPEEDUP: f64 = 100.0;
/// Alignment of buffered replays (trace sectors) and of O_DIRECT and NBD replays.
const SECTOR_BYTES: u64 = 512;
const DIRECT_ALIGN_BYTES: u64 = 4096;
/// How long the tamper test waits for the replayer's first write to land.
const WRITE_WAIT: Duration = Duration::from_secs(20);

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

fn count(syn: &Synthetic, f: impl Fn(&trace_fixtures::Req) -> bool) -> u64 {
    syn.reqs.iter().filter(|r| f(r)).count() as u64
}

/// Checks the report of a whole replay of `syn` folded into `span` bytes at alignment
/// `align`, with lengths rounded up to it if `round_len`: every count is known.
fn check_exact(j: &Value, syn: &Synthetic, span: u64, align: u64, round_len: bool) {
    let spec = syn.spec;
    let (n, writes) = (spec.records as u64, spec.writes as u64);
    assert_eq!(j["format"], spec.kind.name(), "{j}");
    assert_eq!(j["requests"].as_u64(), Some(n), "{j}");
    assert_eq!(j["writes"].as_u64(), Some(writes), "{j}");
    assert_eq!(j["reads"].as_u64(), Some(n - writes), "{j}");
    let (read_bytes, write_bytes) = syn.bytes(if round_len { align } else { 1 });
    assert_eq!(j["read_bytes"].as_u64(), Some(read_bytes), "{j}");
    assert_eq!(j["write_bytes"].as_u64(), Some(write_bytes), "{j}");
    assert_eq!(
        j["zero_size_skipped"].as_u64(),
        Some(spec.zero_size as u64),
        "{j}"
    );
    assert_eq!(j["bad_lines_skipped"].as_u64(), Some(0), "{j}");
    let f = &j["folding"];
    assert_eq!(
        f["trace_min_offset"].as_u64(),
        Some(syn.min_offset()),
        "{j}"
    );
    assert_eq!(f["trace_max_end"].as_u64(), Some(syn.max_end()), "{j}");
    let wrapped = count(syn, |r| r.offset >= span);
    let aligned = count(syn, |r| {
        !(r.offset % span).is_multiple_of(align) || (round_len && !r.len.is_multiple_of(align))
    });
    assert_eq!(f["wrapped"].as_u64(), Some(wrapped), "{j}");
    assert_eq!(f["aligned"].as_u64(), Some(aligned), "{j}");
    assert_eq!(f["clipped"].as_u64(), Some(0), "{j}");
    eprintln!(
        "synthetic {} into {span} bytes: {n} requests ({writes} writes), {read_bytes} bytes \
         read, {write_bytes} written, {wrapped} wrapped, {aligned} aligned; verify: {} bytes \
         checked",
        spec.kind.name(),
        j["verify"]["checked_bytes"]
    );
}

/// A verified replay of `trace` into a `SMALL_TARGET` file at queue depth `qd`; checks what
/// holds for any trace and returns the JSON report.
fn verified_replay(trace: &Path, dir: &Path, qd: &str) -> Result<Value, Box<dyn Error>> {
    let target = dir.join("target.img");
    let json = dir.join("out.json");
    let max = MAX_REQUESTS.to_string();
    let o = dhrd(&[
        "--trace",
        s(trace),
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
    assert!(
        o.status.success(),
        "{} qd {qd}: {}",
        trace.display(),
        text(&o)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("folded into the target: offset mod"), "{out}");
    assert!(out.contains("verify         OK"), "{out}");
    let j = read_json(&json)?;
    assert_eq!(j["queue_depth"].as_u64(), qd.parse().ok());
    let n = j["requests"].as_u64().unwrap_or(0);
    assert_eq!(
        j["reads"].as_u64().unwrap_or(0) + j["writes"].as_u64().unwrap_or(0),
        n
    );
    assert_eq!(j["span_bytes"].as_u64(), Some(SMALL_TARGET_BYTES));
    assert_eq!(j["verify"]["ok"], true);
    assert_eq!(j["verify"]["mismatches"].as_u64(), Some(0));
    assert!(j["latency_us"]["read"]["p99"].as_f64().is_some(), "{j}");
    Ok(j)
}

fn checked_bytes(j: &Value) -> u64 {
    j["verify"]["checked_bytes"].as_u64().unwrap_or(0)
}

#[test]
fn replay_each_trace_verified_at_qd1_and_qd4() -> TestResult {
    let tmp = tempfile::tempdir()?;
    for spec in trace_fixtures::ALL {
        let syn = trace_fixtures::write(spec, tmp.path())?;
        for qd in ["1", "4"] {
            let j = verified_replay(&syn.path, tmp.path(), qd)?;
            check_exact(&j, &syn, SMALL_TARGET_BYTES, SECTOR_BYTES, false);
            assert!(checked_bytes(&j) > 0, "verify checked nothing: {j}");
        }
    }

    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    for (trace, format, records, has_writes) in [
        (WEBSEARCH, "spc", 24_783, false),
        (HM0, "msr", 1000, true),
        (TPCC, "disksim", 6999, true),
    ] {
        for qd in ["1", "4"] {
            let j = verified_replay(&dir.join(trace), tmp.path(), qd)?;
            assert_eq!(j["format"], format);
            assert_eq!(j["requests"].as_u64(), Some(MAX_REQUESTS.min(records)));
            if has_writes {
                assert!(
                    checked_bytes(&j) > 0,
                    "{trace}: verify checked nothing: {j}"
                );
            }
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

/// A verified O_DIRECT replay of `trace` at queue depth 4; None if the file system under
/// `dir` refuses O_DIRECT.
fn direct_replay(trace: &Path, dir: &Path) -> Result<Option<Value>, Box<dyn Error>> {
    let target = dir.join("target.img");
    let json = dir.join("out.json");
    let o = dhrd(&[
        "--trace",
        s(trace),
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
        dhrd_testkit::skip(format!(
            "the file system of {} refuses O_DIRECT: {}",
            dir.display(),
            text(&o)
        ));
        return Ok(None);
    }
    assert!(o.status.success(), "{}", text(&o));
    let j = read_json(&json)?;
    assert_eq!(j["direct"], true);
    assert_eq!(j["folding"]["align"].as_u64(), Some(DIRECT_ALIGN_BYTES));
    assert_eq!(j["folding"]["lengths_rounded_up"], true);
    assert!(j["folding"]["aligned"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(j["verify"]["ok"], true);
    assert!(checked_bytes(&j) > 0, "{j}");
    Ok(Some(j))
}

#[test]
fn direct_io_replay_on_a_temp_file() -> TestResult {
    // The target directory is on the build's disk, more likely to take O_DIRECT than /tmp.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    // MSR: some requests at byte offsets and sizes, which O_DIRECT must align.
    let syn = trace_fixtures::write(trace_fixtures::MSR, tmp.path())?;
    let Some(j) = direct_replay(&syn.path, tmp.path())? else {
        return Ok(());
    };
    check_exact(&j, &syn, SMALL_TARGET_BYTES, DIRECT_ALIGN_BYTES, true);

    if let Some(dir) = traces_dir() {
        direct_replay(&dir.join(HM0), tmp.path())?;
    }
    Ok(())
}

/// A replay of `trace` at its own times divided by `speedup`, into a `TIMING_TARGET` file
/// at queue depth 2; returns the JSON report.
fn original_timing(trace: &Path, dir: &Path, speedup: f64) -> Result<Value, Box<dyn Error>> {
    let target = dir.join("target.img");
    let json = dir.join("out.json");
    let o = dhrd(&[
        "--trace",
        s(trace),
        "--target",
        s(&target),
        "--size",
        TIMING_TARGET,
        "--timing",
        "original",
        "--speedup",
        &speedup.to_string(),
        "--queue-depth",
        "2",
        "--json",
        s(&json),
    ])?;
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("start lateness"));
    let j = read_json(&json)?;
    assert_eq!(j["timing"], "original");
    assert!(j["lateness_us"]["hist"]["max"].as_f64().is_some(), "{j}");
    Ok(j)
}

#[test]
fn original_timing_with_a_large_speedup() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let syn = trace_fixtures::write(trace_fixtures::SPC, tmp.path())?;
    let j = original_timing(&syn.path, tmp.path(), SYNTHETIC_SPEEDUP)?;
    check_exact(&j, &syn, TIMING_TARGET_BYTES, SECTOR_BYTES, false);
    // The last request is dispatched no earlier than its trace time over the speedup.
    let last_s = syn.reqs.last().map_or(0, |r| r.time_ns) as f64 / 1e9;
    let min_s = last_s / SYNTHETIC_SPEEDUP;
    let el = j["elapsed_s"].as_f64().unwrap_or(0.0);
    assert!(min_s > 0.05, "the synthetic trace is too short to time");
    assert!(
        el >= min_s * 0.999,
        "replay ran faster than the trace allows: {el} s < {min_s} s"
    );

    let Some(dir) = traces_dir() else {
        return Ok(());
    };
    // About 60 s of trace at 1000x: at least 60 ms.
    let j = original_timing(&dir.join(WEBSEARCH), tmp.path(), 1000.0)?;
    assert_eq!(j["requests"].as_u64(), Some(24_783));
    let el = j["elapsed_s"].as_f64().unwrap_or(0.0);
    assert!(
        el >= 0.055,
        "replay ran faster than the trace allows: {el} s"
    );
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

    // A line that is no record, in the middle of each synthetic trace.
    const BAD_LINENO: usize = 100;
    for spec in trace_fixtures::ALL {
        let syn = trace_fixtures::write(spec, tmp.path())?;
        let good = std::fs::read_to_string(&syn.path)?;
        let mut lines: Vec<&str> = good.lines().collect();
        lines.insert(BAD_LINENO - 1, "not a trace record");
        let name = format!("bad.{}", spec.kind.name());
        let bad = tmp.path().join(&name);
        std::fs::write(&bad, lines.join("\n") + "\n")?;
        let o = dhrd(&["--trace", s(&bad), "--target", s(&target), "--size", "1M"])?;
        assert!(!o.status.success(), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        let want = format!("{name}:{BAD_LINENO}: malformed {} record", spec.kind.name());
        assert!(err.contains(&want), "{err}");
        let o = dhrd(&[
            "--trace",
            s(&bad),
            "--target",
            s(&target),
            "--size",
            SMALL_TARGET,
            "--skip-bad",
            "--verify",
            "--json",
            s(&json),
        ])?;
        assert!(o.status.success(), "{}", text(&o));
        let j = read_json(&json)?;
        assert_eq!(j["requests"].as_u64(), Some(spec.records as u64), "{j}");
        assert_eq!(j["bad_lines_skipped"].as_u64(), Some(1), "{j}");
        assert_eq!(
            j["zero_size_skipped"].as_u64(),
            Some(spec.zero_size as u64),
            "{j}"
        );
        assert_eq!(j["verify"]["ok"], true, "{j}");
    }
    Ok(())
}

/// `--nbd`: a verified replay of `trace` (which has writes) through an in-process NBD
/// server over a real engine object, one connection per worker, and the fast-request
/// share reported; then `--write-plan` and a refused `--size`. Returns the replay's JSON
/// report and the plan's lines.
fn nbd_replay(trace: &Path, records: u64) -> Result<(Value, Vec<String>), Box<dyn Error>> {
    let tmp = tempfile::tempdir()?;
    let export_bytes = SMALL_TARGET_BYTES;
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
        s(trace),
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
        s(trace),
        "--nbd",
        s(&sock),
        "--write-plan",
        s(&plan),
    ])?;
    // --size larger than the export is refused, naming the export's size.
    let too_big = dhrd(&["--trace", s(trace), "--nbd", s(&sock), "--size", "1G"])?;
    stop.shutdown();
    let served = thread.join().map_err(|_| "the server thread panicked")?;
    assert!(o.status.success(), "{}", text(&o));
    served?;

    assert!(planned.status.success(), "{}", text(&planned));
    let lines: Vec<String> = std::fs::read_to_string(&plan)?
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len() as u64, records);
    for l in &lines {
        let f: Vec<&str> = l.split(' ').collect();
        let (off, len): (u64, u64) = (f[1].parse()?, f[2].parse()?);
        assert!(f[0] == "R" || f[0] == "W", "{l}");
        assert!(
            off % DIRECT_ALIGN_BYTES == 0
                && len % DIRECT_ALIGN_BYTES == 0
                && off + len <= export_bytes,
            "{l}"
        );
    }

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
    assert_eq!(j["requests"].as_u64(), Some(records));
    assert_eq!(j["verify"]["ok"], true, "{j}");
    assert!(checked_bytes(&j) > 0, "{j}");
    // Every request of an in-memory export completes within a minute.
    assert_eq!(j["fast_share"]["all"].as_f64(), Some(1.0), "{j}");
    assert!(
        j["fast_share"]["mean_us"].as_f64().unwrap_or(0.0) > 0.0,
        "{j}"
    );
    Ok((j, lines))
}

#[test]
fn replay_through_an_nbd_export_is_verified() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let syn = trace_fixtures::write(trace_fixtures::MSR, tmp.path())?;
    let (j, plan) = nbd_replay(&syn.path, trace_fixtures::MSR.records as u64)?;
    check_exact(&j, &syn, SMALL_TARGET_BYTES, DIRECT_ALIGN_BYTES, true);
    // The plan is each request folded: offset mod span aligned down, length rounded up.
    let want: Vec<String> = syn
        .reqs
        .iter()
        .map(|r| {
            let op = if r.write { 'W' } else { 'R' };
            let off = r.offset % SMALL_TARGET_BYTES / DIRECT_ALIGN_BYTES * DIRECT_ALIGN_BYTES;
            let len = r.len.div_ceil(DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES;
            format!("{op} {off} {len}")
        })
        .collect();
    assert_eq!(plan, want);

    if let Some(dir) = traces_dir() {
        nbd_replay(&dir.join(HM0), 1000)?;
    }
    Ok(())
}
