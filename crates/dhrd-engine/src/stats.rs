//! Statistics: sharded counters (no shared cache line on the read hot path) and latency
//! histograms. RAM-hit read latency is sampled (1 in `READ_RAM_SAMPLE_EVERY` per thread)
//! because timing a 4 KiB memcpy would cost a visible fraction of it.

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const COUNTER_SHARDS: usize = 16;
pub(crate) const READ_RAM_SAMPLE_EVERY: u64 = 64;
/// Histogram range: 1 ns .. 100 s at 2 significant digits (1% resolution) with 32-bit
/// counts (saturating), about 16 KB each, allocated on first use: a file system may hold
/// thousands of objects.
const HIST_MAX_NS: u64 = 100_000_000_000;
const HIST_SIGFIG: u8 = 2;

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % COUNTER_SHARDS;
    static READ_TICK: Cell<u64> = const { Cell::new(0) };
}

/// True once every `READ_RAM_SAMPLE_EVERY` calls on this thread.
pub(crate) fn sample_read() -> bool {
    READ_TICK.with(|t| {
        let v = t.get().wrapping_add(1);
        t.set(v);
        v % READ_RAM_SAMPLE_EVERY == 0
    })
}

/// The object's counters. All counters of one shard share one cache line, so an object
/// costs a few KB however many counters it has, and a thread touches one line per update.
#[derive(Debug, Clone, Copy)]
pub(crate) enum C {
    ReadsRam,
    ReadsBacking,
    BytesReadRam,
    BytesReadBacking,
    Writes,
    WritePiecesBackingOnly,
    /// Unaligned writes sent to the backing as the whole blocks around them.
    WritesWidened,
    BytesWritten,
    WritesFailed,
    Syncs,
    SyncFailures,
    ZeroRanges,
    SetLens,
    Flushes,
    ChunksInvalidated,
    WriteWaitsOnLoad,
    /// Cache mode: chunks dropped from RAM to make room.
    Evictions,
    /// Cache mode: misses whose chunk was admitted (loaded).
    Admissions,
    /// Cache mode: misses served from the backing without loading (M3).
    Bypasses,
    /// Chunks loaded by read-ahead.
    AheadLoaded,
    /// Chunks loaded by read-ahead that a read then used.
    AheadUsed,
    /// Chunks loaded by read-ahead that left RAM unread.
    AheadWasted,
}

const COUNTERS: usize = C::AheadWasted as usize + 1;

pub(crate) struct Counters {
    shards: Box<[CachePadded<[AtomicU64; COUNTERS]>]>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            shards: (0..COUNTER_SHARDS)
                .map(|_| CachePadded::new(Default::default()))
                .collect(),
        }
    }
}

impl Counters {
    #[inline]
    pub(crate) fn add(&self, c: C, v: u64) {
        let i = SLOT.with(|s| *s);
        if let Some(cell) = self.shards.get(i).and_then(|s| s.get(c as usize)) {
            cell.fetch_add(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self, c: C) -> u64 {
        self.shards
            .iter()
            .filter_map(|s| s.get(c as usize))
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }
}

#[derive(Default)]
struct Hists {
    read_ram_ns: Option<Histogram<u32>>,
    read_backing_ns: Option<Histogram<u32>>,
    write_ns: Option<Histogram<u32>>,
    sync_ns: Option<Histogram<u32>>,
    commit_batch: Option<Histogram<u32>>,
}

fn record_into(slot: &mut Option<Histogram<u32>>, v: u64) {
    if slot.is_none() {
        // The bounds are valid constants; if hdrhistogram ever refused them we would only
        // lose latency reporting, never I/O.
        *slot = Histogram::new_with_bounds(1, HIST_MAX_NS, HIST_SIGFIG).ok();
    }
    if let Some(h) = slot {
        h.saturating_record(v);
    }
}

#[derive(Default)]
pub(crate) struct Stats {
    pub counters: Counters,
    hists: Mutex<Hists>,
}

pub(crate) enum Lat {
    ReadRam,
    ReadBacking,
    Write,
    Sync,
}

impl Stats {
    #[inline]
    pub(crate) fn add(&self, c: C, v: u64) {
        self.counters.add(c, v);
    }

    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn record(&self, which: Lat, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, HIST_MAX_NS);
        let mut h = self.hists.lock();
        let slot = match which {
            Lat::ReadRam => &mut h.read_ram_ns,
            Lat::ReadBacking => &mut h.read_backing_ns,
            Lat::Write => &mut h.write_ns,
            Lat::Sync => &mut h.sync_ns,
        };
        record_into(slot, ns);
    }

    pub(crate) fn record_batch(&self, writes: u64) {
        record_into(&mut self.hists.lock().commit_batch, writes.max(1));
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let g = self.hists.lock();
        let lat = |h: &Option<Histogram<u32>>| h.as_ref().map(Latency::of).unwrap_or_default();
        StatsSnapshot {
            reads_ram: self.counters.get(C::ReadsRam),
            reads_backing: self.counters.get(C::ReadsBacking),
            bytes_read_ram: self.counters.get(C::BytesReadRam),
            bytes_read_backing: self.counters.get(C::BytesReadBacking),
            writes: self.counters.get(C::Writes),
            write_pieces_backing_only: self.counters.get(C::WritePiecesBackingOnly),
            writes_widened: self.counters.get(C::WritesWidened),
            bytes_written: self.counters.get(C::BytesWritten),
            writes_failed: self.counters.get(C::WritesFailed),
            syncs: self.counters.get(C::Syncs),
            sync_failures: self.counters.get(C::SyncFailures),
            zero_ranges: self.counters.get(C::ZeroRanges),
            set_lens: self.counters.get(C::SetLens),
            flushes: self.counters.get(C::Flushes),
            chunks_invalidated: self.counters.get(C::ChunksInvalidated),
            write_waits_on_load: self.counters.get(C::WriteWaitsOnLoad),
            evictions: self.counters.get(C::Evictions),
            admissions: self.counters.get(C::Admissions),
            bypasses: self.counters.get(C::Bypasses),
            ahead_loaded: self.counters.get(C::AheadLoaded),
            ahead_used: self.counters.get(C::AheadUsed),
            ahead_wasted: self.counters.get(C::AheadWasted),
            read_ram: lat(&g.read_ram_ns),
            read_backing: lat(&g.read_backing_ns),
            write: lat(&g.write_ns),
            sync: lat(&g.sync_ns),
            commit_batch_writes_mean: g.commit_batch.as_ref().map_or(0.0, |h| h.mean()),
            commit_batch_writes_max: g.commit_batch.as_ref().map_or(0, |h| h.max()),
        }
    }
}

/// A duration as seconds, the unit status documents use.
pub(crate) fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// An optional duration as seconds, or null.
pub(crate) fn secs_if_known<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Latency percentiles in microseconds. Serialised under the short names that status
/// documents use (`p50_us`, ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    pub count: u64,
    #[serde(rename = "p50_us")]
    pub latency_us_p50: f64,
    #[serde(rename = "p99_us")]
    pub latency_us_p99: f64,
    #[serde(rename = "p999_us")]
    pub latency_us_p999: f64,
    #[serde(rename = "max_us")]
    pub latency_us_max: f64,
}

impl Latency {
    fn of(h: &Histogram<u32>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        Self {
            count: h.len(),
            latency_us_p50: us(h.value_at_quantile(0.5)),
            latency_us_p99: us(h.value_at_quantile(0.99)),
            latency_us_p999: us(h.value_at_quantile(0.999)),
            latency_us_max: us(h.max()),
        }
    }
}

/// A point-in-time copy of an object's statistics, serialised under its field names.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    pub reads_ram: u64,
    pub reads_backing: u64,
    pub bytes_read_ram: u64,
    pub bytes_read_backing: u64,
    pub writes: u64,
    /// Write pieces that went to the backing only (chunk not yet loaded, I3).
    pub write_pieces_backing_only: u64,
    /// Unaligned writes sent as the whole blocks around them, so that the backing makes
    /// them durable in one device operation (`Durable::durable_write_block_bytes`).
    pub writes_widened: u64,
    pub bytes_written: u64,
    pub writes_failed: u64,
    pub syncs: u64,
    pub sync_failures: u64,
    pub zero_ranges: u64,
    pub set_lens: u64,
    pub flushes: u64,
    /// Chunks that left Loaded because a request failed after reaching the backing.
    pub chunks_invalidated: u64,
    /// Writes that waited for a chunk being loaded (I1).
    pub write_waits_on_load: u64,
    /// Cache mode (M1-M3): chunks evicted to make room, misses admitted into RAM, misses
    /// served from the backing only.
    pub evictions: u64,
    pub admissions: u64,
    pub bypasses: u64,
    /// Read-ahead (M2, M5): chunks loaded ahead, used by a later read, evicted unread.
    pub ahead_loaded: u64,
    pub ahead_used: u64,
    pub ahead_wasted: u64,
    /// RAM-hit reads, sampled.
    pub read_ram: Latency,
    pub read_backing: Latency,
    pub write: Latency,
    pub sync: Latency,
    pub commit_batch_writes_mean: f64,
    pub commit_batch_writes_max: u64,
}

impl StatsSnapshot {
    /// Reads served from RAM over all reads (a read served partly from each counts in
    /// both); 0 before the first read.
    pub fn hit_ratio(&self) -> f64 {
        let n = self.reads_ram + self.reads_backing;
        if n == 0 {
            0.0
        } else {
            self.reads_ram as f64 / n as f64
        }
    }
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "reads from RAM      {:>12}  ({} bytes)",
            self.reads_ram, self.bytes_read_ram
        )?;
        writeln!(
            f,
            "reads from backing  {:>12}  ({} bytes)",
            self.reads_backing, self.bytes_read_backing
        )?;
        writeln!(f, "writes              {:>12}  ({} bytes, {} failed, {} backing-only pieces, {} waited for a load)",
            self.writes, self.bytes_written, self.writes_failed, self.write_pieces_backing_only, self.write_waits_on_load)?;
        writeln!(
            f,
            "backing syncs       {:>12}  ({} failed; group commit mean {:.2} max {} writes/sync)",
            self.syncs,
            self.sync_failures,
            self.commit_batch_writes_mean,
            self.commit_batch_writes_max
        )?;
        writeln!(
            f,
            "flushes {}  zero ranges {}  set_len {}  chunks invalidated {}",
            self.flushes, self.zero_ranges, self.set_lens, self.chunks_invalidated
        )?;
        writeln!(
            f,
            "RAM hit ratio       {:>12.3}  (evictions {}, admitted {}, bypassed {}; read ahead {} used {} wasted {})",
            self.hit_ratio(),
            self.evictions,
            self.admissions,
            self.bypasses,
            self.ahead_loaded,
            self.ahead_used,
            self.ahead_wasted
        )?;
        writeln!(
            f,
            "latency (us)        {:>10} {:>10} {:>10} {:>10} {:>10}",
            "count", "p50", "p99", "p99.9", "max"
        )?;
        for (name, l) in [
            ("read RAM (sampled)", &self.read_ram),
            ("read backing", &self.read_backing),
            ("write", &self.write),
            ("backing sync", &self.sync),
        ] {
            writeln!(
                f,
                "  {name:<18}{:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                l.count, l.latency_us_p50, l.latency_us_p99, l.latency_us_p999, l.latency_us_max
            )?;
        }
        Ok(())
    }
}
