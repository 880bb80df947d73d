//! Trace files for the replay tests: small synthetic traces in the three formats the
//! replayer reads, generated from a fixed seed into a directory the test owns, and the
//! location of the public traces in `../shared/traces/`.
//!
//! Shared through `#[path]` by the parser's unit tests (`src/replay/tests.rs`) and the
//! `dhrd-bench replay` integration tests (`replay_cli.rs`): the crate is a binary, so the
//! integration tests cannot reach code under `src/`.
//!
//! The synthetic traces exist so that every replay test checks something on every
//! machine: the public traces are not part of the repository. Each generated trace comes
//! with the records the parser must return (times relative to the first kept record), so
//! a test can compare every record, not only counts. The generator guarantees:
//! - exactly `Spec::records` kept records, `Spec::writes` of them writes, and
//!   `Spec::zero_size` zero-size lines (which the parser skips and counts);
//! - every request lies inside one aligned `WINDOW_BYTES` window of the trace's address
//!   space, so folding into any span that is a multiple of the window (aligned to 512 or
//!   4096) never clips, and the bytes a replay moves are known exactly;
//! - byte addresses reach beyond 4 GiB, so an offset cut to 32 bits shows;
//! - about half the reads re-read the range of an earlier write, so `--verify` has bytes
//!   to check at any span.
#![allow(dead_code)] // Each of the two test crates including this uses part of it.

use dhrd_io::SplitMix64;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const WEBSEARCH: &str = "websearch/WebSearch1.first24783.spc";
pub const HM0: &str = "msr_cambridge/hm_0.first1000.csv";
pub const TPCC: &str = "oltp_tpcc/tpcc-small.trace";

/// The public traces (`DHRD_TRACES_DIR`, else `../shared/traces` beside the workspace), or
/// None when that directory does not exist. Every None is reported as a skipped check
/// (`dhrd_testkit::skip`, counted by scripts/test-all.sh): the synthetic traces are tested
/// regardless, but the checks on the public ones did not run.
pub fn traces_dir() -> Option<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let d = DIR.get_or_init(|| {
        std::env::var_os("DHRD_TRACES_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../../shared/traces"
                ))
            })
    });
    if d.is_dir() {
        return Some(d.clone());
    }
    dhrd_testkit::skip(format!(
        "public trace directory {} not found (set DHRD_TRACES_DIR): the checks on the \
         public traces did not run",
        d.display()
    ));
    None
}

/// Every synthetic request lies inside one window of this size at a multiple of it.
pub const WINDOW_BYTES: u64 = 16 << 20;
/// Windows the addresses are drawn from: a 64 GiB trace address space.
const WINDOWS: u64 = 4096;
/// Trace sectors (SPC LBAs, DiskSim LBAs and sizes).
const SECTOR_BYTES: u64 = 512;
/// Request sizes in sectors, 512 B to 64 KiB.
const SIZES_SECTORS: [u64; 6] = [1, 8, 16, 32, 64, 128];
/// Mean gap between requests; 0 to twice this, in whole microseconds (SPC's resolution).
const MEAN_GAP_US: u64 = 20_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Spc,
    Msr,
    Disksim,
}

impl Kind {
    /// The name `dhrd-bench replay` reports (`--format`, JSON `format`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Spc => "spc",
            Kind::Msr => "msr",
            Kind::Disksim => "disksim",
        }
    }
}

/// What a synthetic trace holds: the tests assert these numbers exactly.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub kind: Kind,
    pub seed: u64,
    /// Kept (non-zero-size) records.
    pub records: usize,
    pub writes: usize,
    /// Zero-size lines besides the records.
    pub zero_size: usize,
}

/// 30% writes over six ASUs.
pub const SPC: Spec = Spec {
    kind: Kind::Spc,
    seed: 0x5350_4301,
    records: 700,
    writes: 210,
    zero_size: 5,
};
/// 49% writes like hm_0, with some requests at byte (not sector) offsets and sizes.
pub const MSR: Spec = Spec {
    kind: Kind::Msr,
    seed: 0x4d53_5201,
    records: 500,
    writes: 245,
    zero_size: 3,
};
/// 37% writes over 16 devices like the TPC-C excerpt.
pub const DISKSIM: Spec = Spec {
    kind: Kind::Disksim,
    seed: 0x4453_4d01,
    records: 800,
    writes: 296,
    zero_size: 2,
};
pub const ALL: [Spec; 3] = [SPC, MSR, DISKSIM];

/// One request as the parser must return it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    /// Relative to the first kept record.
    pub time_ns: u64,
    pub offset: u64,
    pub len: u64,
    pub write: bool,
}

pub struct Synthetic {
    pub spec: Spec,
    pub path: PathBuf,
    /// The kept records in file order.
    pub reqs: Vec<Req>,
}

impl Synthetic {
    pub fn min_offset(&self) -> u64 {
        self.reqs.iter().map(|r| r.offset).min().unwrap_or(0)
    }
    pub fn max_end(&self) -> u64 {
        self.reqs
            .iter()
            .map(|r| r.offset + r.len)
            .max()
            .unwrap_or(0)
    }
    /// Bytes read and bytes written with every length rounded up to `round_to`: 1 for a
    /// buffered replay, which keeps lengths; 4096 for O_DIRECT and NBD.
    pub fn bytes(&self, round_to: u64) -> (u64, u64) {
        let (mut r, mut w) = (0, 0);
        for q in &self.reqs {
            let len = q.len.div_ceil(round_to) * round_to;
            if q.write {
                w += len;
            } else {
                r += len;
            }
        }
        (r, w)
    }
}

/// Writes the synthetic trace of `spec` into `dir` and returns it with its records.
pub fn write(spec: Spec, dir: &Path) -> std::io::Result<Synthetic> {
    let (text, reqs) = render(spec);
    let path = dir.join(format!("synthetic.{}", spec.kind.name()));
    std::fs::write(&path, text)?;
    Ok(Synthetic { spec, path, reqs })
}

/// The trace text and its kept records. Deterministic in `spec`.
fn render(spec: Spec) -> (String, Vec<Req>) {
    assert!(spec.writes <= spec.records && spec.zero_size < spec.records);
    let mut rng = SplitMix64::new(spec.seed);
    let writes = pick(&mut rng, spec.records, spec.writes);
    // Zero-size lines go before some record other than the first, so the first line is a
    // record and the times stay relative to it.
    let zero_before: Vec<bool> = std::iter::once(false)
        .chain(pick(&mut rng, spec.records - 1, spec.zero_size))
        .collect();

    let mut text = format!(
        "# synthetic {} trace, seed {:#x}: {} records, {} writes, {} zero-size\n",
        spec.kind.name(),
        spec.seed,
        spec.records,
        spec.writes,
        spec.zero_size
    );
    let mut reqs = Vec::with_capacity(spec.records);
    let mut written: Vec<(u64, u64)> = Vec::new();
    let mut time_us = 0u64;
    for (i, &write) in writes.iter().enumerate() {
        if i > 0 {
            time_us += rng.below(2 * MEAN_GAP_US + 1);
        }
        let reread = !write && !written.is_empty() && rng.chance(1, 2);
        let (offset, len) = if reread {
            written[rng.below(written.len() as u64) as usize]
        } else {
            address(&mut rng, spec.kind)
        };
        if write {
            written.push((offset, len));
        }
        if zero_before[i] {
            line(&mut text, &mut rng, spec.kind, time_us, offset, 0, write);
        }
        line(&mut text, &mut rng, spec.kind, time_us, offset, len, write);
        reqs.push(Req {
            time_ns: time_us * 1000,
            offset,
            len,
            write,
        });
    }
    assert!(
        reqs.iter().any(|r| r.offset >= 1 << 32),
        "seed {:#x} left every address below 4 GiB",
        spec.seed
    );
    (text, reqs)
}

/// `n` flags, exactly `k` of them set, in a seeded order (Fisher-Yates).
fn pick(rng: &mut SplitMix64, n: usize, k: usize) -> Vec<bool> {
    let mut v: Vec<bool> = (0..n).map(|i| i < k).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

/// A request inside one window; a quarter in window 0, so not every request wraps.
fn address(rng: &mut SplitMix64, kind: Kind) -> (u64, u64) {
    let window = if rng.chance(1, 4) {
        0
    } else {
        rng.below(WINDOWS)
    };
    let byte_granular = kind == Kind::Msr && rng.chance(1, 8);
    let (inner, len) = if byte_granular {
        let len = 1 + rng.below(64 << 10);
        (rng.below(WINDOW_BYTES - len + 1), len)
    } else {
        let sectors = SIZES_SECTORS[rng.below(SIZES_SECTORS.len() as u64) as usize];
        let len = sectors * SECTOR_BYTES;
        let inner_sectors = rng.below((WINDOW_BYTES - len) / SECTOR_BYTES + 1);
        (inner_sectors * SECTOR_BYTES, len)
    };
    assert!(inner + len <= WINDOW_BYTES);
    (window * WINDOW_BYTES + inner, len)
}

/// Appends one trace line in the format's own units, with absolute times offset the way
/// the public traces' are (the parser must make them relative).
fn line(
    text: &mut String,
    rng: &mut SplitMix64,
    kind: Kind,
    time_us: u64,
    offset: u64,
    len: u64,
    write: bool,
) {
    use std::fmt::Write as _;
    let _ = match kind {
        Kind::Spc => {
            let t_us = 11_413 + time_us;
            let asu = rng.below(6);
            let lba = offset / SECTOR_BYTES;
            let op = if write { 'W' } else { 'R' };
            writeln!(
                text,
                "{asu},{lba},{len},{op},{}.{:06}",
                t_us / 1_000_000,
                t_us % 1_000_000
            )
        }
        Kind::Msr => {
            // Windows filetime: 100 ns ticks.
            let ticks = 128_166_385_295_514_663 + time_us * 10;
            let disk = rng.below(3);
            let op = if write { "Write" } else { "Read" };
            let response_ticks = 100 + rng.below(50_000);
            writeln!(
                text,
                "{ticks},synth,{disk},{op},{offset},{len},{response_ticks}"
            )
        }
        Kind::Disksim => {
            let ns = 938_513_000 + time_us * 1000;
            let device = rng.below(16);
            let lba = offset / SECTOR_BYTES;
            let sectors = len / SECTOR_BYTES;
            let op = if write { 0 } else { 1 };
            // Some DiskSim writers print times as floats; the parser takes both.
            if rng.chance(1, 10) {
                writeln!(text, "{ns}.0 {device} {lba} {sectors} {op}")
            } else {
                writeln!(text, "{ns} {device} {lba} {sectors} {op}")
            }
        }
    };
}
