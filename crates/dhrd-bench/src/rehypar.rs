//! `dhrd-bench rehypar`: space utilisation and fragmentation of the fast tier's allocators
//! (SPEC T3). ReHypar (at each requested threshold v), the plain extent allocator
//! (first-fit and best-fit) and the fixed-bucket allocator run the same allocation traces
//! on a device of the same size; prints one JSON object on stdout and a table on stderr.
//! Nothing is timed: the figures are counts of blocks, so they reproduce exactly from
//! `--seed` on any machine.
//!
//! The traces (docs/tiering.md explains each choice):
//! - `postmark`: Postmark-like small files, 500 B to 10 000 B uniformly: an initial set,
//!   then transactions that create or delete a file with equal odds (the paper's Postmark
//!   runs have 1 000 to 20 000 files and 100 000 transactions). Reads and appends are left
//!   out: reads allocate nothing, and appends are what `iozone` models.
//! - `iozone`: IOzone-like sequential writers: files of 1 MiB to 256 MiB (powers of two,
//!   equally likely) written in 8 KiB records by concurrent writers, records interleaved
//!   round-robin; each record is one allocation hinted at the end of the file's previous
//!   record. Finished files stay; the oldest are deleted when live data would pass
//!   `--iozone-fill-percent` of the device.
//! - `trace:NAME`: a block trace from `../shared/traces` parsed by the `replay` parser. A
//!   write to trace blocks never written before allocates those blocks (each maximal new
//!   run is one allocation, hinted at the end of the run holding the trace block just
//!   before it); reads and rewrites allocate nothing, nothing is freed. All devices of a
//!   trace share one address space, as in `replay`.
//!
//! Invariants: every allocator sees the same event list; an allocation that fails is
//! counted and its object simply has less data (a later free of it frees what it got);
//! every free of a harness-held extent must succeed (anything else aborts the run, since it
//! would be a bug in an allocator or here).

use crate::fileio::{emit, r3};
use crate::replay::{parse_trace, Op, TraceFormat};
use anyhow::{bail, Context, Result};
use dhrd_alloc::{
    AllocOutcome, BlockCount, BucketAllocator, Extent, ExtentAllocator, FitPolicy, FreePolicy,
    Placement, ReHypar, ReHyparConfig, SpaceAllocator, SpaceStats,
};
use dhrd_io::SplitMix64;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// The paper's block size (1 KiB); all sizes below are in these blocks.
const BLOCK_BYTES: u64 = dhrd_alloc::rehypar::BLOCK_BYTES_DEFAULT;
/// Statistics snapshots per run for the time-averaged figures.
const SAMPLES: usize = 100;
/// Bounds on the options, so a typo cannot ask for terabytes of state.
const DEVICE_MIB_MAX: u64 = 1 << 20;
const EVENTS_MAX: u64 = 1 << 26;
const WRITERS_MAX: u64 = 64;
/// Postmark's file sizes (its defaults, and the paper's 500 B to 10 KB).
const POSTMARK_BYTES_MIN: u64 = 500;
const POSTMARK_BYTES_MAX: u64 = 10_000;
/// IOzone: 8 KiB records; files from 1 MiB to 256 MiB in powers of two.
const IOZONE_RECORD_BYTES: u64 = 8 << 10;
const IOZONE_FILE_BYTES_MIN: u64 = 1 << 20;
const IOZONE_FILE_SHIFTS: u64 = 9;
/// The public traces used when no --trace is given, relative to --traces-dir.
const DEFAULT_TRACES: [(&str, &str); 3] = [
    ("websearch", "websearch/WebSearch1.first24783.spc"),
    ("hm_0", "msr_cambridge/hm_0.first1000.csv"),
    ("tpcc", "oltp_tpcc/tpcc-small.trace"),
];
/// Seeds of the generators are the run's seed mixed with these, so workloads differ.
/// Label of the baseline the table's last column divides by.
const FIRST_FIT: &str = "extent first-fit";
const POSTMARK_SALT: u64 = 0x706f_7374;
const IOZONE_SALT: u64 = 0x696f_7a6f;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Postmark,
    Iozone,
    Traces,
}

#[derive(clap::Args, Debug)]
pub struct RehyparArgs {
    /// Fast-device size in MiB, the same for every allocator and workload.
    #[arg(long, default_value_t = 1024)]
    pub device_mib: u64,
    /// Seed of the workload generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Workloads to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "postmark,iozone,traces"
    )]
    pub workloads: Vec<Workload>,
    /// Postmark: files created before the transactions.
    #[arg(long, default_value_t = 20_000)]
    pub postmark_files: u64,
    /// Postmark: transactions (each a create or a delete).
    #[arg(long, default_value_t = 100_000)]
    pub postmark_transactions: u64,
    /// IOzone: MiB written in all.
    #[arg(long, default_value_t = 4096)]
    pub iozone_written_mib: u64,
    /// IOzone: files written at the same time, records interleaved.
    #[arg(long, default_value_t = 4)]
    pub iozone_writers: u64,
    /// IOzone: the oldest files are deleted to keep live data under this share of the
    /// device (percent).
    #[arg(long, default_value_t = 75)]
    pub iozone_fill_percent: u64,
    /// Block traces (SPC, MSR or DiskSim); default: the three public traces in
    /// --traces-dir.
    #[arg(long)]
    pub trace: Vec<PathBuf>,
    #[arg(long, default_value = "../shared/traces")]
    pub traces_dir: PathBuf,
    /// ReHypar thresholds v in blocks, one configuration each (the paper used 8 and 32).
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pub thresholds: Vec<u64>,
    /// Bucket size of the fixed-bucket allocator, in KiB.
    #[arg(long, default_value_t = 256)]
    pub bucket_kib: u64,
}

/// Hint for an allocation: where the caller would like it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Near {
    Nothing,
    /// Right after the last extent of this object, if it has one.
    EndOf(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// `bytes` more for object `obj` (a file, or a run of trace blocks).
    Alloc { obj: u64, bytes: u64, near: Near },
    /// Delete object `obj`: free all its extents.
    Free { obj: u64 },
}

struct WorkloadTrace {
    name: String,
    description: String,
    events: Vec<Event>,
}

fn postmark(files: u64, transactions: u64, seed: u64) -> WorkloadTrace {
    let mut rng = SplitMix64::new(seed ^ POSTMARK_SALT);
    let mut size = || POSTMARK_BYTES_MIN + rng.below(POSTMARK_BYTES_MAX - POSTMARK_BYTES_MIN + 1);
    let mut events = Vec::new();
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut create = |events: &mut Vec<Event>, live: &mut Vec<u64>, bytes: u64| {
        events.push(Event::Alloc {
            obj: next,
            bytes,
            near: Near::Nothing,
        });
        live.push(next);
        next += 1;
    };
    for _ in 0..files {
        let b = size();
        create(&mut events, &mut live, b);
    }
    let mut pick = SplitMix64::new(seed ^ POSTMARK_SALT ^ 1);
    for _ in 0..transactions {
        if live.is_empty() || pick.chance(1, 2) {
            let b = size();
            create(&mut events, &mut live, b);
        } else {
            let i = pick.below(live.len() as u64) as usize;
            events.push(Event::Free {
                obj: live.swap_remove(i),
            });
        }
    }
    WorkloadTrace {
        name: "postmark".into(),
        description: format!(
            "{files} files of {POSTMARK_BYTES_MIN}-{POSTMARK_BYTES_MAX} B, then \
             {transactions} create-or-delete transactions"
        ),
        events,
    }
}

fn iozone(
    device_bytes: u64,
    written_bytes: u64,
    writers: u64,
    fill_percent: u64,
    seed: u64,
) -> WorkloadTrace {
    let mut rng = SplitMix64::new(seed ^ IOZONE_SALT);
    let budget = device_bytes / 100 * fill_percent;
    // Sizes that fit the budget at all (on a small device the largest files are left out,
    // so that every file drawn can be written once older files are deleted).
    let shifts = (0..IOZONE_FILE_SHIFTS)
        .take_while(|&k| IOZONE_FILE_BYTES_MIN << k <= budget)
        .count()
        .max(1) as u64;
    let mut events = Vec::new();
    // Per writer: (file, bytes left to write, file size).
    let mut slots: Vec<Option<(u64, u64, u64)>> = vec![None; writers as usize];
    let mut done: VecDeque<(u64, u64)> = VecDeque::new();
    let (mut done_bytes, mut inflight_bytes, mut written, mut next) = (0u64, 0u64, 0u64, 0u64);
    while written < written_bytes {
        let mut progressed = false;
        for slot in slots.iter_mut() {
            if slot.is_none() && written + inflight_bytes < written_bytes {
                let size = IOZONE_FILE_BYTES_MIN << rng.below(shifts);
                while done_bytes + inflight_bytes + size > budget {
                    let Some((obj, bytes)) = done.pop_front() else {
                        break;
                    };
                    events.push(Event::Free { obj });
                    done_bytes -= bytes;
                }
                if done_bytes + inflight_bytes + size <= budget {
                    *slot = Some((next, size, size));
                    inflight_bytes += size;
                    next += 1;
                }
            }
            let Some((obj, left, size)) = *slot else {
                continue;
            };
            let bytes = left.min(IOZONE_RECORD_BYTES);
            events.push(Event::Alloc {
                obj,
                bytes,
                near: Near::EndOf(obj),
            });
            written += bytes;
            progressed = true;
            *slot = if left > bytes {
                Some((obj, left - bytes, size))
            } else {
                inflight_bytes -= size;
                done.push_back((obj, size));
                done_bytes += size;
                None
            };
        }
        if !progressed {
            // Cannot happen while every size drawn fits the budget (an idle device takes
            // any of them); stop rather than loop if it ever does.
            break;
        }
    }
    WorkloadTrace {
        name: "iozone".into(),
        description: format!(
            "{} MiB in 8 KiB records, {writers} writers, files of 1-{} MiB, live data kept \
             under {fill_percent}% of the device",
            written_bytes >> 20,
            IOZONE_FILE_BYTES_MIN << (shifts - 1) >> 20
        ),
        events,
    }
}

/// Allocation events from a block trace: each maximal run of trace blocks written for the
/// first time is one allocation.
fn from_block_trace(name: &str, path: &Path) -> Result<WorkloadTrace> {
    let f = File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
    let trace = parse_trace(
        BufReader::new(f),
        &path.display().to_string(),
        TraceFormat::Auto,
        false,
        None,
    )?;
    // Runs of trace blocks already allocated: start -> (end, object).
    let mut runs: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut events = Vec::new();
    let (mut writes, mut next) = (0u64, 0u64);
    for r in trace.records.iter().filter(|r| r.op == Op::Write) {
        writes += 1;
        let (mut a, z) = (
            r.offset / BLOCK_BYTES,
            (r.offset + r.len).div_ceil(BLOCK_BYTES),
        );
        while a < z {
            // Skip blocks covered by an existing run.
            if let Some((_, &(end, _))) = runs.range(..=a).next_back().filter(|(_, &(e, _))| e > a)
            {
                a = end;
                continue;
            }
            let stop = runs.range(a..z).next().map_or(z, |(&s, _)| s);
            let near = runs
                .range(..a)
                .next_back()
                .filter(|(_, &(e, _))| e == a)
                .map_or(Near::Nothing, |(_, &(_, obj))| Near::EndOf(obj));
            events.push(Event::Alloc {
                obj: next,
                bytes: (stop - a) * BLOCK_BYTES,
                near,
            });
            runs.insert(a, (stop, next));
            next += 1;
            a = stop;
        }
    }
    Ok(WorkloadTrace {
        name: format!("trace:{name}"),
        description: format!(
            "{} ({} records, {writes} writes, {} first-write runs)",
            path.display(),
            trace.records.len(),
            events.len()
        ),
        events,
    })
}

/// One allocator's run over one workload.
#[derive(Default)]
struct Outcome {
    allocations: u64,
    failures: u64,
    failed_bytes: u64,
    reused: u64,
    fresh: u64,
    at_hint: u64,
    live_bytes: u64,
    /// Utilisation, internal and external fragmentation at each sample with data held.
    samples: Vec<(f64, f64, f64)>,
    end: SpaceStats,
}

fn utilisation(live_bytes: u64, st: &SpaceStats) -> f64 {
    let held = st.held_blocks().0 * BLOCK_BYTES;
    if held == 0 {
        1.0
    } else {
        live_bytes as f64 / held as f64
    }
}

fn drive(a: &mut dyn SpaceAllocator, events: &[Event]) -> Result<Outcome> {
    let mut objs: HashMap<u64, (Vec<Extent>, u64)> = HashMap::new();
    let mut out = Outcome::default();
    let every = (events.len() / SAMPLES).max(1);
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { obj, bytes, near } => {
                out.allocations += 1;
                let hint = match near {
                    Near::Nothing => None,
                    Near::EndOf(o) => objs.get(&o).and_then(|(v, _)| v.last()).map(Extent::end),
                };
                let blocks = BlockCount(bytes.div_ceil(BLOCK_BYTES));
                match a.place(blocks, hint) {
                    AllocOutcome::Placed { extent, how } => {
                        match how {
                            Placement::Reused => out.reused += 1,
                            Placement::Fresh => out.fresh += 1,
                            Placement::AtHint => out.at_hint += 1,
                        }
                        let o = objs.entry(obj).or_default();
                        o.0.push(extent);
                        o.1 += bytes;
                        out.live_bytes += bytes;
                    }
                    AllocOutcome::NoSpace | AllocOutcome::Invalid => {
                        out.failures += 1;
                        out.failed_bytes += bytes;
                    }
                }
            }
            Event::Free { obj } => {
                if let Some((extents, bytes)) = objs.remove(&obj) {
                    for e in extents {
                        a.free(e)
                            .with_context(|| format!("{}: freeing {e}", a.name()))?;
                    }
                    out.live_bytes -= bytes;
                }
            }
        }
        if (i + 1) % every == 0 {
            let st = a.stats();
            if st.held_blocks().0 > 0 {
                out.samples.push((
                    utilisation(out.live_bytes, &st),
                    st.internal_fragmentation(),
                    st.external_fragmentation(),
                ));
            }
        }
    }
    out.end = a.stats();
    Ok(out)
}

/// The configurations compared, with their labels. ReHypar runs at each threshold with the
/// paper's behaviour on frees (`WholeExtent`) and with `RewindToLastLive`; "extent per
/// allocation" is ReHypar's sections with no reuse of remainders (every allocation gets
/// extents of its own), the layout chunk partitioning was designed to improve on.
fn allocators(
    args: &RehyparArgs,
    device_blocks: BlockCount,
) -> Result<Vec<(String, Box<dyn SpaceAllocator>)>> {
    let mut v: Vec<(String, Box<dyn SpaceAllocator>)> = Vec::new();
    for &t in &args.thresholds {
        for (policy, suffix) in [
            (FreePolicy::WholeExtent, ""),
            (FreePolicy::RewindToLastLive, " rewind"),
        ] {
            let mut c = ReHyparConfig::paper(device_blocks);
            c.threshold_blocks = BlockCount(t);
            c.free_policy = policy;
            let a = ReHypar::new(c).context("ReHypar configuration")?;
            v.push((format!("rehypar v={t}{suffix}"), Box::new(a)));
        }
    }
    let mut c = ReHyparConfig::paper(device_blocks);
    c.reuse_min_blocks = Some(BlockCount(u64::MAX));
    v.push(("extent per allocation".into(), Box::new(ReHypar::new(c)?)));
    for (p, name) in [
        (FitPolicy::FirstFit, FIRST_FIT),
        (FitPolicy::BestFit, "extent best-fit"),
    ] {
        v.push((
            name.into(),
            Box::new(ExtentAllocator::new(device_blocks, p)?),
        ));
    }
    let bucket = BlockCount(args.bucket_kib * 1024 / BLOCK_BYTES);
    v.push((
        format!("bucket {} KiB", args.bucket_kib),
        Box::new(BucketAllocator::new(device_blocks, bucket)?),
    ));
    Ok(v)
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (n, s) = xs.fold((0u64, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

fn result_json(label: &str, detail: &str, o: &Outcome) -> Value {
    let st = &o.end;
    json!({
        "allocator": label,
        "configuration": detail,
        "utilisation": r3(utilisation(o.live_bytes, st)),
        "utilisation_mean": r3(mean(o.samples.iter().map(|s| s.0))),
        "internal_fragmentation": r3(st.internal_fragmentation()),
        "internal_fragmentation_mean": r3(mean(o.samples.iter().map(|s| s.1))),
        "external_fragmentation": r3(st.external_fragmentation()),
        "external_fragmentation_mean": r3(mean(o.samples.iter().map(|s| s.2))),
        "allocations": o.allocations,
        "failures": o.failures,
        "failed_bytes": o.failed_bytes,
        "placed_reused": o.reused,
        "placed_fresh": o.fresh,
        "placed_at_hint": o.at_hint,
        "live_data_bytes": o.live_bytes,
        "live_blocks": st.live_blocks.0,
        "held_blocks": st.held_blocks().0,
        "free_blocks": st.free_blocks.0,
        "largest_free_blocks": st.largest_free_blocks.0,
        "managed_blocks": st.managed_blocks.0,
    })
}

fn workloads(args: &RehyparArgs, device_bytes: u64) -> Result<Vec<WorkloadTrace>> {
    let mut out = Vec::new();
    for w in &args.workloads {
        match w {
            Workload::Postmark => {
                if args.postmark_files + args.postmark_transactions > EVENTS_MAX {
                    bail!("postmark: more than {EVENTS_MAX} events");
                }
                out.push(postmark(
                    args.postmark_files,
                    args.postmark_transactions,
                    args.seed,
                ));
            }
            Workload::Iozone => {
                let written = args.iozone_written_mib << 20;
                if written / IOZONE_RECORD_BYTES > EVENTS_MAX {
                    bail!("iozone: more than {EVENTS_MAX} records");
                }
                if !(1..=WRITERS_MAX).contains(&args.iozone_writers)
                    || !(1..=100).contains(&args.iozone_fill_percent)
                {
                    bail!("iozone: writers must be 1-{WRITERS_MAX}, fill 1-100%");
                }
                if device_bytes / 100 * args.iozone_fill_percent < IOZONE_FILE_BYTES_MIN {
                    bail!("iozone: the fill share of the device is below one 1 MiB file");
                }
                out.push(iozone(
                    device_bytes,
                    written,
                    args.iozone_writers,
                    args.iozone_fill_percent,
                    args.seed,
                ));
            }
            Workload::Traces => {
                let files: Vec<(String, PathBuf)> = if args.trace.is_empty() {
                    DEFAULT_TRACES
                        .iter()
                        .map(|(n, p)| (n.to_string(), args.traces_dir.join(p)))
                        .collect()
                } else {
                    args.trace
                        .iter()
                        .map(|p| {
                            let n = p
                                .file_stem()
                                .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
                            (n, p.clone())
                        })
                        .collect()
                };
                for (n, p) in files {
                    out.push(from_block_trace(&n, &p)?);
                }
            }
        }
    }
    Ok(out)
}

pub fn run(args: RehyparArgs) -> Result<()> {
    if !(1..=DEVICE_MIB_MAX).contains(&args.device_mib) {
        bail!("--device-mib must be 1 to {DEVICE_MIB_MAX}");
    }
    if args.thresholds.is_empty() {
        bail!("--thresholds needs at least one value");
    }
    let device_bytes = args.device_mib << 20;
    let device_blocks = BlockCount(device_bytes / BLOCK_BYTES);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "device {} MiB in {BLOCK_BYTES}-byte blocks, seed {}",
        args.device_mib, args.seed
    );
    let mut results = Vec::new();
    for w in workloads(&args, device_bytes)? {
        let frees = w
            .events
            .iter()
            .filter(|e| matches!(e, Event::Free { .. }))
            .count();
        let _ = writeln!(table, "\n{}: {}", w.name, w.description);
        let _ = writeln!(
            table,
            "{:<22} {:>7} {:>7} {:>8} {:>8} {:>9} {:>8}",
            "allocator", "util", "mean", "int.frag", "ext.frag", "failures", "vs ff"
        );
        let mut rows = Vec::new();
        let mut outcomes = Vec::new();
        for (label, mut a) in allocators(&args, device_blocks)? {
            let o = drive(a.as_mut(), &w.events)?;
            a.check_invariants()
                .with_context(|| format!("{label} after {}", w.name))?;
            rows.push(result_json(&label, &a.name(), &o));
            outcomes.push((label, o));
        }
        let ff = outcomes
            .iter()
            .find(|(n, _)| n == FIRST_FIT)
            .map(|(_, o)| utilisation(o.live_bytes, &o.end));
        for (name, o) in &outcomes {
            let u = utilisation(o.live_bytes, &o.end);
            let _ = writeln!(
                table,
                "{:<22} {:>6.1}% {:>6.1}% {:>7.1}% {:>7.1}% {:>9} {:>7.2}x",
                name,
                100.0 * u,
                100.0 * mean(o.samples.iter().map(|s| s.0)),
                100.0 * o.end.internal_fragmentation(),
                100.0 * o.end.external_fragmentation(),
                o.failures,
                ff.map_or(f64::NAN, |f| u / f),
            );
        }
        results.push(json!({
            "workload": w.name,
            "description": w.description,
            "events": w.events.len(),
            "allocations": w.events.len() - frees,
            "frees": frees,
            "results": rows,
        }));
    }
    let out = json!({
        "bench": "rehypar",
        "block_bytes": BLOCK_BYTES,
        "device_bytes": device_bytes,
        "seed": args.seed,
        "thresholds_blocks": args.thresholds,
        "bucket_bytes": args.bucket_kib * 1024,
        "workloads": results,
    });
    emit(&out, table.trim_end())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn generators_reproduce_from_the_seed() {
        assert_eq!(postmark(50, 200, 7).events, postmark(50, 200, 7).events);
        assert_ne!(postmark(50, 200, 7).events, postmark(50, 200, 8).events);
        let a = iozone(64 << 20, 32 << 20, 3, 75, 7).events;
        assert_eq!(a, iozone(64 << 20, 32 << 20, 3, 75, 7).events);
    }

    #[test]
    fn iozone_keeps_live_data_under_the_budget() {
        let ev = iozone(256 << 20, 1 << 30, 4, 75, 3).events;
        let mut live: HashMap<u64, u64> = HashMap::new();
        let mut written = 0u64;
        for e in &ev {
            match *e {
                Event::Alloc { obj, bytes, .. } => {
                    *live.entry(obj).or_default() += bytes;
                    written += bytes;
                }
                Event::Free { obj } => {
                    live.remove(&obj).unwrap();
                }
            }
            assert!(live.values().sum::<u64>() <= (256 << 20) / 100 * 75);
        }
        assert_eq!(written, 1 << 30);
    }

    #[test]
    fn trace_writes_allocate_only_blocks_not_seen_before() {
        let dir = std::env::temp_dir().join(format!("dhrd-rehypar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.spc");
        let mut f = File::create(&p).unwrap();
        // SPC: ASU,LBA(512 B sectors),Size,Opcode,Timestamp
        writeln!(f, "0,0,4096,W,0.0").unwrap(); // blocks 0..4
        writeln!(f, "0,4,4096,W,0.1").unwrap(); // blocks 2..6: 4..6 new, after 0..4
        writeln!(f, "0,20,1024,R,0.2").unwrap(); // a read allocates nothing
        writeln!(f, "0,16,8192,W,0.3").unwrap(); // blocks 8..16: new, no neighbour
        writeln!(f, "0,0,16384,W,0.4").unwrap(); // blocks 0..16: only 6..8 is new
        drop(f);
        let w = from_block_trace("t", &p).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let k = BLOCK_BYTES;
        assert_eq!(
            w.events,
            vec![
                Event::Alloc {
                    obj: 0,
                    bytes: 4 * k,
                    near: Near::Nothing
                },
                Event::Alloc {
                    obj: 1,
                    bytes: 2 * k,
                    near: Near::EndOf(0)
                },
                Event::Alloc {
                    obj: 2,
                    bytes: 8 * k,
                    near: Near::Nothing
                },
                Event::Alloc {
                    obj: 3,
                    bytes: 2 * k,
                    near: Near::EndOf(1)
                },
            ]
        );
    }

    #[test]
    fn every_allocator_accounts_for_every_byte() {
        let args = RehyparArgs {
            device_mib: 256,
            seed: 1,
            workloads: vec![],
            postmark_files: 0,
            postmark_transactions: 0,
            iozone_written_mib: 0,
            iozone_writers: 1,
            iozone_fill_percent: 75,
            trace: vec![],
            traces_dir: PathBuf::new(),
            thresholds: vec![8, 32],
            bucket_kib: 64,
        };
        let w = postmark(1000, 3000, 5);
        let expect: u64 = {
            let mut live: HashMap<u64, u64> = HashMap::new();
            for e in &w.events {
                match *e {
                    Event::Alloc { obj, bytes, .. } => {
                        live.insert(obj, bytes);
                    }
                    Event::Free { obj } => {
                        live.remove(&obj);
                    }
                }
            }
            live.values().sum()
        };
        // Large enough for one allocation per 64 KiB extent: nothing may fail.
        for (label, mut a) in allocators(&args, BlockCount(256 << 10)).unwrap() {
            let o = drive(a.as_mut(), &w.events).unwrap();
            a.check_invariants().unwrap();
            assert_eq!(o.failures, 0, "{label} failed on a 256 MiB device");
            assert_eq!(o.live_bytes, expect, "{label}");
            assert!(o.end.live_blocks.0 * BLOCK_BYTES >= o.live_bytes);
            let u = utilisation(o.live_bytes, &o.end);
            assert!(u > 0.0 && u <= 1.0, "{label}: {u}");
        }
    }
}
