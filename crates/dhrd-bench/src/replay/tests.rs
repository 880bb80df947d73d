//! Unit tests of trace parsing, folding, repeated passes and verification. Each parser
//! test runs on a synthetic trace of its format (`tests/trace_fixtures`), so it tests
//! something on every machine, and on the public trace of that format where present.

use super::*;

#[path = "../../tests/trace_fixtures/mod.rs"]
mod trace_fixtures;
use trace_fixtures::{HM0, TPCC, WEBSEARCH};

fn parse_path(p: &Path, fmt: TraceFormat) -> Result<Trace> {
    let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
    parse_trace(
        BufReader::new(f),
        &p.display().to_string(),
        fmt,
        false,
        None,
    )
}

/// The public trace `rel`, parsed; None when the public traces are absent.
fn parse_real(rel: &str, fmt: TraceFormat) -> Result<Option<Trace>> {
    trace_fixtures::traces_dir()
        .map(|d| parse_path(&d.join(rel), fmt))
        .transpose()
}

/// Parses the synthetic trace of `spec` in its own format and auto-detected, and compares
/// every record with what was generated.
fn check_synthetic(spec: trace_fixtures::Spec, fmt: TraceFormat) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let syn = trace_fixtures::write(spec, dir.path())?;
    for f in [fmt, TraceFormat::Auto] {
        let t = parse_path(&syn.path, f)?;
        assert_eq!(t.format, fmt);
        assert_eq!(t.records.len(), spec.records);
        let writes = t.records.iter().filter(|r| r.op == Op::Write).count();
        assert_eq!(writes, spec.writes);
        assert_eq!(t.zero_size_skipped, spec.zero_size as u64);
        assert_eq!(t.bad_lines_skipped, 0);
        assert_eq!(t.records.len(), syn.reqs.len());
        for (i, (got, want)) in t.records.iter().zip(&syn.reqs).enumerate() {
            let want = Record {
                time_ns: u128::from(want.time_ns),
                offset: want.offset,
                len: want.len,
                op: if want.write { Op::Write } else { Op::Read },
            };
            assert_eq!(*got, want, "{:?} record {i}", spec.kind);
        }
        assert_eq!((t.min_offset, t.max_end), (syn.min_offset(), syn.max_end()));
        eprintln!(
            "synthetic {} as {f:?}: {} records ({writes} writes, {} zero-size skipped) match",
            spec.kind.name(),
            t.records.len(),
            t.zero_size_skipped
        );
    }
    Ok(())
}

#[test]
fn parses_spc() -> Result<()> {
    check_synthetic(trace_fixtures::SPC, TraceFormat::Spc)?;
    for fmt in [TraceFormat::Spc, TraceFormat::Auto] {
        let Some(t) = parse_real(WEBSEARCH, fmt)? else {
            return Ok(());
        };
        assert_eq!(t.format, TraceFormat::Spc);
        assert_eq!(t.records.len(), 24_783);
        assert_eq!(t.records.iter().filter(|r| r.op == Op::Write).count(), 4);
        assert_eq!(
            t.records[0],
            Record {
                time_ns: 0,
                offset: 657_728 * 512,
                len: 8192,
                op: Op::Read
            }
        );
        // 0.011565 - 0.011413 s
        assert_eq!(t.records[1].time_ns, 152_000);
        assert!(t.max_end > 16 << 30, "WebSearch spans ~17 GiB");
    }
    Ok(())
}

#[test]
fn parses_msr() -> Result<()> {
    check_synthetic(trace_fixtures::MSR, TraceFormat::Msr)?;
    for fmt in [TraceFormat::Msr, TraceFormat::Auto] {
        let Some(t) = parse_real(HM0, fmt)? else {
            return Ok(());
        };
        assert_eq!(t.format, TraceFormat::Msr);
        assert_eq!(t.records.len(), 1000);
        assert_eq!(
            t.records[0],
            Record {
                time_ns: 0,
                offset: 9_056_014_336,
                len: 2048,
                op: Op::Write
            }
        );
        // (128166385295514878 - 128166385295514663) ticks of 100 ns
        assert_eq!(t.records[1].time_ns, 21_500);
    }
    Ok(())
}

#[test]
fn parses_disksim() -> Result<()> {
    check_synthetic(trace_fixtures::DISKSIM, TraceFormat::Disksim)?;
    for fmt in [TraceFormat::Disksim, TraceFormat::Auto] {
        let Some(t) = parse_real(TPCC, fmt)? else {
            return Ok(());
        };
        assert_eq!(t.format, TraceFormat::Disksim);
        assert_eq!(t.records.len(), 6999);
        assert_eq!(t.records.iter().filter(|r| r.op == Op::Write).count(), 2618);
        assert_eq!(
            t.records[0],
            Record {
                time_ns: 0,
                offset: 264_719_034 * 512,
                len: 16 * 512,
                op: Op::Write
            }
        );
        assert_eq!(t.records[1].time_ns, 315_000);
    }
    Ok(())
}

fn parse_str(s: &str, fmt: TraceFormat, skip_bad: bool) -> Result<Trace> {
    parse_trace(s.as_bytes(), "t", fmt, skip_bad, None)
}

#[test]
fn malformed_lines_name_their_line_number() {
    let cases = [
        ("0,1,512,R,0.1\n0,2,512,X,0.2\n", TraceFormat::Spc, "t:2:"),
        (
            "0,1,512,R,0.1\n\n# c\n0,abc,512,R,0.2\n",
            TraceFormat::Auto,
            "t:4:",
        ),
        (
            "1,h,0,Read,0,512,1\n1,h,0,Read,0,512\n",
            TraceFormat::Msr,
            "t:2:",
        ),
        ("1 0 0 1 1\n2 0 0 1 2\n", TraceFormat::Disksim, "t:2:"),
        ("hello world\n", TraceFormat::Auto, "cannot detect"),
        ("0,1,999999999999,R,0.1\n", TraceFormat::Spc, "exceeds"),
        ("0,1,512,R,-1\n", TraceFormat::Spc, "t:1:"),
        (
            "1 0 99999999999999999 1 1\n",
            TraceFormat::Disksim,
            "overflows",
        ),
    ];
    for (text, fmt, want) in cases {
        match parse_str(text, fmt, false) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(e) => assert!(format!("{e:#}").contains(want), "{text:?}: {e:#}"),
        }
    }
}

#[test]
fn skip_bad_counts_and_zero_size_is_skipped() -> Result<()> {
    let t = parse_str(
        "0,1,512,R,0.1\ngarbage\n0,2,0,W,0.2\n0,3,1024,w,0.3\n",
        TraceFormat::Spc,
        true,
    )?;
    assert_eq!(t.records.len(), 2);
    assert_eq!(t.bad_lines_skipped, 1);
    assert_eq!(t.zero_size_skipped, 1);
    assert_eq!(t.records[1].op, Op::Write);
    assert_eq!(t.records[1].time_ns, 200_000_000);
    let e = parse_str("0,2,0,W,0.2\n", TraceFormat::Spc, false);
    assert!(
        e.is_err(),
        "a trace of only zero-size requests has nothing to replay"
    );
    let t = parse_trace(
        "1 0 0 1 1\n2 0 8 1 0\n3 0 16 1 1\n".as_bytes(),
        "t",
        TraceFormat::Auto,
        false,
        Some(2),
    )?;
    assert_eq!(t.records.len(), 2);
    Ok(())
}

#[test]
fn folding_wraps_aligns_and_clips() {
    let span = 1 << 20;
    let rec = |offset, len| Record {
        time_ns: 5,
        offset,
        len,
        op: Op::Read,
    };
    let recs = [
        rec(4096, 8192),
        rec(span + 1000, 512),
        rec(span - 512, 4096),
        rec(3 * span + 4096, 100),
    ];
    let (r, st) = fold(&recs, span, 512, false);
    assert_eq!((r[0].offset, r[0].len), (4096, 8192));
    assert_eq!((r[1].offset, r[1].len), (512, 512));
    assert_eq!((r[2].offset, r[2].len), (span - 512, 512));
    assert_eq!((r[3].offset, r[3].len), (4096, 100));
    assert_eq!(
        st,
        FoldStats {
            wrapped: 2,
            clipped: 1,
            aligned: 1
        }
    );
    let (r, st) = fold(&recs, span, 4096, true);
    assert_eq!((r[1].offset, r[1].len), (0, 4096));
    assert_eq!((r[2].offset, r[2].len), (span - 4096, 4096));
    assert_eq!((r[3].offset, r[3].len), (4096, 4096));
    assert!(r
        .iter()
        .all(|q| q.offset % 4096 == 0 && q.len % 4096 == 0 && q.offset + q.len <= span));
    assert_eq!(st.clipped, 0);
}

#[test]
fn repeat_shifts_each_pass_after_the_previous_one() {
    let r = |t, off| Request {
        time_ns: t,
        offset: off,
        len: 512,
        op: Op::Read,
    };
    let one = [r(0, 0), r(100, 512), r(200, 1024)];
    let three = repeat_passes(&one, 3);
    assert_eq!(three.len(), 9);
    let times: Vec<u64> = three.iter().map(|q| q.time_ns).collect();
    // One pass spans 200 ns; the next starts one mean gap (100 ns) after it ends.
    assert_eq!(times, [0, 100, 200, 300, 400, 500, 600, 700, 800]);
    assert!(three.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert_eq!(three[4].offset, 512);
    assert_eq!(repeat_passes(&one, 1), one.to_vec());
    assert!(repeat_passes(&[], 5).is_empty());
}

#[test]
fn written_map_tracks_last_writer() {
    let mut m = WrittenMap::default();
    m.insert(0, 100, 1);
    m.insert(50, 150, 2);
    m.insert(20, 30, 3);
    assert_eq!(
        m.overlapping(0, 200),
        vec![(0, 20, 1), (20, 30, 3), (30, 50, 1), (50, 150, 2)]
    );
    assert_eq!(
        m.overlapping(25, 60),
        vec![(25, 30, 3), (30, 50, 1), (50, 60, 2)]
    );
    assert_eq!(m.overlapping(150, 300), vec![]);
    m.insert(0, 200, 4);
    assert_eq!(m.overlapping(0, 1000), vec![(0, 200, 4)]);
    assert_eq!(m.bytes(), 200);
}

#[test]
fn check_read_detects_a_changed_byte_and_a_stale_writer() {
    let mut m = WrittenMap::default();
    m.insert(1000, 3000, 7);
    let mut buf = vec![0u8; 4096];
    fill_pattern(&mut buf[1000..3000], 7, 1000);
    // An unaligned piece must equal the same bytes of a whole-range fill.
    let mut piece = vec![0u8; 13];
    fill_pattern(&mut piece, 7, 1003);
    assert_eq!(&piece[..], &buf[1003..1016]);
    let (mm, checked) = check_read(&m, &buf, 0, 0);
    assert!(mm.is_empty());
    assert_eq!(checked, 2000);
    buf[2345] ^= 1;
    let (mm, _) = check_read(&m, &buf, 0, 9);
    assert_eq!(mm.len(), 1);
    assert_eq!((mm[0].offset, mm[0].request, mm[0].writer), (2345, 9, 7));
    // Content of an older write (a lost update) is detected as well.
    fill_pattern(&mut buf[1000..3000], 6, 1000);
    assert_eq!(check_read(&m, &buf, 0, 0).0.len(), 1);
}
