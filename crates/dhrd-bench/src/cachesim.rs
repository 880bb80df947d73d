//! `dhrd-bench cache-sim`: the engine's cache policies (the very code `dhrd-engine` runs,
//! `dhrd_engine::cache`) and Belady's offline optimum over one access trace, at chunk
//! granularity, as JSON on stdout.
//!
//! The trace is a fio I/O log (`--write_iolog`, versions 2 and 3: lines
//! `[time] file action offset length`) of the run being judged, or a synthetic zipf
//! trace. Each access touches every chunk its range covers, in order. The policies run
//! with instant loads (a real run loads in the background, so a chunk can miss again
//! while it loads); Belady's figures are upper bounds for any policy.

use anyhow::{bail, Context, Result};
use dhrd_engine::cache::{belady_hits, simulate, Admission, CachePolicy};
use dhrd_engine::parse_size;
use dhrd_io::SplitMix64;
use std::io::BufRead;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CacheSimArgs {
    /// fio I/O log of the run (`--write_iolog`); reads only unless --all-ops.
    #[arg(long, conflicts_with = "zipf")]
    pub iolog: Option<PathBuf>,
    /// Count writes as accesses too.
    #[arg(long)]
    pub all_ops: bool,
    /// A synthetic trace instead: zipf with this exponent over --items blocks of 4 KiB.
    #[arg(long)]
    pub zipf: Option<f64>,
    #[arg(long, default_value_t = 262_144)]
    pub items: u64,
    #[arg(long, default_value_t = 1_000_000)]
    pub accesses: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Chunk size of the RAM tier (e.g. 64K).
    #[arg(long, value_parser = parse_size)]
    pub chunk: u64,
    /// RAM for the cache (e.g. 256M).
    #[arg(long, value_parser = parse_size)]
    pub mem: u64,
}

const ZIPF_BLOCK_BYTES: u64 = 4096;

fn read_iolog(path: &PathBuf, all_ops: bool, chunk: u64) -> Result<Vec<u64>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        let w: Vec<&str> = line.split_whitespace().collect();
        // v3 puts a timestamp first; find the action word.
        let Some(i) = w
            .iter()
            .position(|x| matches!(*x, "read" | "write" | "trim" | "sync" | "datasync"))
        else {
            continue;
        };
        let (Some(off), Some(len)) = (w.get(i + 1), w.get(i + 2)) else {
            continue;
        };
        if w[i] != "read" && !(all_ops && w[i] == "write") {
            continue;
        }
        let (off, len): (u64, u64) = (off.parse()?, len.parse()?);
        if len == 0 {
            continue;
        }
        for c in off / chunk..=(off + len - 1) / chunk {
            out.push(c);
        }
    }
    if out.is_empty() {
        bail!("{}: no accesses found", path.display());
    }
    Ok(out)
}

fn zipf_trace(s: f64, items: u64, n: usize, seed: u64, chunk: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(items as usize);
    let mut acc = 0.0;
    for k in 1..=items {
        acc += 1.0 / (k as f64).powf(s);
        cdf.push(acc);
    }
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * acc;
            let rank = cdf.partition_point(|v| *v < u) as u64;
            // Ranks scattered over the blocks by a fixed odd multiplier.
            let block = rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % items;
            block * ZIPF_BLOCK_BYTES / chunk
        })
        .collect()
}

pub fn run(a: CacheSimArgs) -> Result<()> {
    if a.chunk == 0 || !a.chunk.is_power_of_two() {
        bail!("--chunk must be a power of two");
    }
    let trace = match (&a.iolog, a.zipf) {
        (Some(p), _) => read_iolog(p, a.all_ops, a.chunk)?,
        (None, Some(s)) => zipf_trace(s, a.items, a.accesses, a.seed, a.chunk),
        (None, None) => bail!("give --iolog or --zipf"),
    };
    let cap = a.mem / a.chunk;
    let n = trace.len() as f64;
    let mut policies = serde_json::Map::new();
    for policy in [CachePolicy::S3Fifo, CachePolicy::Clock] {
        for admission in [Admission::SecondAccess, Admission::Always] {
            let r = simulate(&trace, policy, admission, cap);
            policies.insert(
                format!("{policy}/{admission}"),
                serde_json::json!({"hit_ratio": r.hit_ratio(), "loads": r.loads,
                    "evictions": r.evictions}),
            );
        }
    }
    let opt = |bypass: bool| belady_hits(&trace, cap, bypass) as f64 / n;
    let distinct = {
        let mut v = trace.clone();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let out = serde_json::json!({
        "accesses": trace.len(),
        "distinct_chunks": distinct,
        "chunk_bytes": a.chunk,
        "capacity_chunks": cap,
        "belady_hit_ratio": opt(false),
        "belady_bypass_hit_ratio": opt(true),
        "policies": policies,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
