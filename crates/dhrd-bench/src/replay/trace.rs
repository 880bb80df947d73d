//! Trace parsing (SPC, MSR Cambridge, DiskSim ASCII), folding of trace offsets into the
//! target's span, and repeated passes. Pure functions of their input: no I/O beyond the
//! reader given.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One parsed trace record, with its absolute trace time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub time_ns: u128,
    pub offset: u64,
    pub len: u64,
    pub op: Op,
}

/// A parsed trace: records in file order, times relative to the first record.
#[derive(Debug)]
pub struct Trace {
    pub format: TraceFormat,
    pub records: Vec<Record>,
    pub zero_size_skipped: u64,
    pub bad_lines_skipped: u64,
    /// Lowest offset and highest end over the kept records (the unfolded span).
    pub min_offset: u64,
    pub max_end: u64,
}

pub(super) fn field_u64(s: &str, what: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("{what} {s:?} is not a non-negative integer"))
}

pub(super) fn check_len(len: u64) -> Result<u64, String> {
    if len > MAX_REQUEST_BYTES {
        return Err(format!(
            "request size {len} exceeds the limit of {MAX_REQUEST_BYTES} bytes"
        ));
    }
    Ok(len)
}

pub(super) fn sectors_to_bytes(sectors: u64, what: &str) -> Result<u64, String> {
    sectors
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| format!("{what} {sectors} sectors overflows a byte offset"))
}

pub(super) fn parse_spc(line: &str) -> Result<Record, String> {
    let f: Vec<&str> = line.split(',').collect();
    // SPC allows optional trailing fields after the timestamp.
    if f.len() < 5 {
        return Err(format!(
            "SPC needs 5 comma-separated fields, found {}",
            f.len()
        ));
    }
    field_u64(f[0], "ASU")?;
    let offset = sectors_to_bytes(field_u64(f[1], "LBA")?, "LBA")?;
    let len = check_len(field_u64(f[2], "size")?)?;
    let op = match f[3].trim() {
        "R" | "r" => Op::Read,
        "W" | "w" => Op::Write,
        o => return Err(format!("opcode {o:?} is not R or W")),
    };
    let secs: f64 = f[4]
        .trim()
        .parse()
        .map_err(|_| format!("timestamp {:?} is not a number", f[4]))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("timestamp {secs} is not a non-negative time"));
    }
    Ok(Record {
        time_ns: (secs * 1e9).round() as u128,
        offset,
        len,
        op,
    })
}

pub(super) fn parse_msr(line: &str) -> Result<Record, String> {
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != 7 {
        return Err(format!(
            "MSR needs 7 comma-separated fields, found {}",
            f.len()
        ));
    }
    let ticks = field_u64(f[0], "timestamp")?;
    field_u64(f[2], "disk number")?;
    let op = match f[3].trim().to_ascii_lowercase().as_str() {
        "read" => Op::Read,
        "write" => Op::Write,
        o => return Err(format!("type {o:?} is not Read or Write")),
    };
    let offset = field_u64(f[4], "offset")?;
    let len = check_len(field_u64(f[5], "size")?)?;
    field_u64(f[6], "response time")?;
    Ok(Record {
        time_ns: u128::from(ticks) * FILETIME_TICK_NS,
        offset,
        len,
        op,
    })
}

pub(super) fn parse_disksim(line: &str) -> Result<Record, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 {
        return Err(format!(
            "DiskSim needs 5 whitespace-separated fields, found {}",
            f.len()
        ));
    }
    let time_ns = match f[0].parse::<u64>() {
        Ok(t) => u128::from(t),
        Err(_) => match f[0].parse::<f64>() {
            Ok(t) if t.is_finite() && t >= 0.0 => t.round() as u128,
            _ => return Err(format!("time {:?} is not a non-negative number", f[0])),
        },
    };
    field_u64(f[1], "device")?;
    let offset = sectors_to_bytes(field_u64(f[2], "LBA")?, "LBA")?;
    let size_sectors = field_u64(f[3], "size")?;
    let len = check_len(sectors_to_bytes(size_sectors, "size")?)?;
    let op = match f[4] {
        "1" => Op::Read,
        "0" => Op::Write,
        o => return Err(format!("type {o:?} is not 1 (read) or 0 (write)")),
    };
    Ok(Record {
        time_ns,
        offset,
        len,
        op,
    })
}

/// Parses one record line in a known format.
pub fn parse_line(format: TraceFormat, line: &str) -> Result<Record, String> {
    match format {
        TraceFormat::Spc => parse_spc(line),
        TraceFormat::Msr => parse_msr(line),
        TraceFormat::Disksim => parse_disksim(line),
        TraceFormat::Auto => detect(line)
            .ok_or_else(|| String::from("not an SPC, MSR or DiskSim record"))
            .and_then(|f| parse_line(f, line)),
    }
}

/// The format a record line parses as. The formats cannot be confused: MSR has 7 comma
/// fields with a Read/Write type, SPC 5+ comma fields with an R/W opcode, DiskSim no commas.
pub fn detect(line: &str) -> Option<TraceFormat> {
    [TraceFormat::Msr, TraceFormat::Spc, TraceFormat::Disksim]
        .into_iter()
        .find(|&f| parse_line(f, line).is_ok())
}

/// Parses a whole trace. Blank lines and `#` comments are ignored; zero-size records are
/// skipped and counted; a malformed line is an error naming its line number unless
/// `skip_bad`. Stops after `max_requests` kept records.
pub fn parse_trace<R: BufRead>(
    reader: R,
    name: &str,
    format: TraceFormat,
    skip_bad: bool,
    max_requests: Option<u64>,
) -> Result<Trace> {
    let mut format = format;
    let mut records = Vec::new();
    let (mut zero, mut bad) = (0u64, 0u64);
    for (idx, line) in reader.split(b'\n').enumerate() {
        let lineno = idx + 1;
        let raw = line.with_context(|| format!("reading {name}"))?;
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if format == TraceFormat::Auto {
            match detect(text) {
                Some(f) => format = f,
                None => bail!(
                    "{name}:{lineno}: cannot detect the trace format (not SPC, MSR or \
                     DiskSim): {text:?}; pass --format"
                ),
            }
        }
        let rec = match parse_line(format, text) {
            Ok(r) => r,
            Err(msg) if skip_bad => {
                let _ = msg;
                bad += 1;
                continue;
            }
            Err(msg) => bail!(
                "{name}:{lineno}: malformed {} record: {msg}: {text:?} (--skip-bad skips such \
                 lines)",
                format.name()
            ),
        };
        if rec.len == 0 {
            zero += 1;
            continue;
        }
        records.push(rec);
        if max_requests.is_some_and(|m| records.len() as u64 >= m) {
            break;
        }
    }
    if records.is_empty() {
        bail!("{name}: no requests to replay ({zero} zero-size, {bad} malformed lines skipped)");
    }
    let t0 = records[0].time_ns;
    let mut min_offset = u64::MAX;
    let mut max_end = 0u64;
    for r in &mut records {
        r.time_ns = r.time_ns.saturating_sub(t0);
        min_offset = min_offset.min(r.offset);
        max_end = max_end.max(r.offset.saturating_add(r.len));
    }
    Ok(Trace {
        format,
        records,
        zero_size_skipped: zero,
        bad_lines_skipped: bad,
        min_offset,
        max_end,
    })
}

// ---------------------------------------------------------------------------------------
// Folding

/// A request as issued against the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Dispatch time relative to the first request (original timing), before --speedup.
    pub time_ns: u64,
    pub offset: u64,
    pub len: u64,
    pub op: Op,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldStats {
    /// Requests whose offset was at or beyond the span (wrapped by the modulo).
    pub wrapped: u64,
    /// Requests shortened because they crossed the end of the span.
    pub clipped: u64,
    /// Requests whose offset or length changed by alignment.
    pub aligned: u64,
}

/// Folds trace records into `[0, span)`: offset mod span, aligned down to `align`; length
/// rounded up to `align` if `round_len`; clipped at the end. `span` must be a non-zero
/// multiple of `align`, so every folded request is non-empty.
pub fn fold(
    records: &[Record],
    span: u64,
    align: u64,
    round_len: bool,
) -> (Vec<Request>, FoldStats) {
    let mut st = FoldStats::default();
    let reqs = records
        .iter()
        .map(|r| {
            if r.offset >= span {
                st.wrapped += 1;
            }
            let offset = r.offset % span / align * align;
            let mut len = if round_len {
                r.len.div_ceil(align) * align
            } else {
                r.len
            };
            if offset != r.offset % span || len != r.len {
                st.aligned += 1;
            }
            if len > span - offset {
                len = span - offset;
                st.clipped += 1;
            }
            Request {
                time_ns: u64::try_from(r.time_ns).unwrap_or(u64::MAX),
                offset,
                len,
                op: r.op,
            }
        })
        .collect();
    (reqs, st)
}

/// The request list `passes` times over; pass k's times are shifted by k times the span
/// of one pass (plus one request's gap, so passes do not start at the same instant).
pub fn repeat_passes(reqs: &[Request], passes: u32) -> Vec<Request> {
    let span_ns = reqs.last().map_or(0, |r| r.time_ns);
    let gap_ns = if reqs.len() > 1 {
        span_ns / (reqs.len() as u64 - 1)
    } else {
        0
    };
    let mut out = Vec::with_capacity(reqs.len().saturating_mul(passes.max(1) as usize));
    for k in 0..u64::from(passes.max(1)) {
        let shift = k.saturating_mul(span_ns.saturating_add(gap_ns));
        out.extend(reqs.iter().map(|r| Request {
            time_ns: r.time_ns.saturating_add(shift),
            ..*r
        }));
    }
    out
}
