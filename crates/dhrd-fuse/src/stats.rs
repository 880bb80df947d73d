//! Mount-wide counters kept by the FUSE layer (objects come and go with the cache, so
//! per-object engine statistics alone would lose history).
//!
//! Invariant: counters only grow; latency is kept in power-of-two microsecond buckets, so
//! percentiles are upper bounds within a factor of two. No disk state, no crash semantics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Number of power-of-two latency buckets (bucket i holds latencies < 2^i microseconds;
/// the last one everything longer, about 9 minutes).
pub const LATENCY_BUCKETS: usize = 30;

#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let idx = (64 - us.leading_zeros()) as usize;
        if let Some(b) = self.buckets.get(idx.min(LATENCY_BUCKETS - 1)) {
            b.fetch_add(1, Relaxed);
        }
    }

    /// Upper bound of the `q` quantile in microseconds; None when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(1u64 << i);
            }
        }
        None
    }

    fn line(&self) -> String {
        match (
            self.quantile_us(0.5),
            self.quantile_us(0.99),
            self.quantile_us(0.999),
        ) {
            (Some(a), Some(b), Some(c)) => format!("p50 <= {a} us, p99 <= {b} us, p99.9 <= {c} us"),
            _ => String::from("-"),
        }
    }
}

/// One request counted in progress by `now` while it lives; `max` keeps the most there
/// ever were at once (a high-water mark, so it only grows like the counters) and `sum`
/// adds up how many each request found on arrival, itself included (divided by the
/// number of requests: how many were in progress at once on average, as requests saw it).
pub struct InFlight<'a> {
    now: &'a AtomicU64,
}

impl<'a> InFlight<'a> {
    pub fn enter(now: &'a AtomicU64, max: &AtomicU64, sum: &AtomicU64) -> Self {
        let n = now.fetch_add(1, Relaxed) + 1;
        max.fetch_max(n, Relaxed);
        sum.fetch_add(n, Relaxed);
        Self { now }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let before = self.now.fetch_sub(1, Relaxed);
        debug_assert!(before > 0, "more requests left than entered");
    }
}

/// Named latency quantiles (upper bounds in microseconds; None without samples).
pub type Quantiles = [(&'static str, Option<u64>); 3];

#[derive(Default)]
pub struct FsStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub reads_ram: AtomicU64,
    pub reads_backing: AtomicU64,
    pub reads_mixed: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// COPY_FILE_RANGE requests done in the daemon and the bytes they copied (not counted
    /// in `writes`).
    pub copies: AtomicU64,
    pub copy_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub metadata_syncs: AtomicU64,
    pub errors: AtomicU64,
    pub opens_passthrough: AtomicU64,
    pub opens_direct: AtomicU64,
    pub opens_cached: AtomicU64,
    /// Opens with O_TRUNC that truncated the file themselves (FUSE_ATOMIC_O_TRUNC).
    pub open_truncates: AtomicU64,
    /// LOOKUP requests, and entries handed out with attributes by READDIRPLUS (each one
    /// a LOOKUP the kernel need not send).
    pub lookups: AtomicU64,
    pub readdirplus_entries: AtomicU64,
    /// READLINK requests (the kernel keeps symlink targets once read, FUSE_CACHE_SYMLINKS).
    pub readlinks: AtomicU64,
    /// SETATTR requests (chmod, chown, utimens, truncate; not open(O_TRUNC), see
    /// `open_truncates`).
    pub setattrs: AtomicU64,
    /// WRITE requests in the daemon now (from the handle's lookup to the reply's data
    /// being ready), the most there ever were at once, and the sum of what each found on
    /// arrival: how many writers the mount lets reach the data path together (`InFlight`).
    pub writes_in_flight: AtomicU64,
    pub writes_in_flight_max: AtomicU64,
    pub writes_in_flight_sum: AtomicU64,
    /// `periodic:N`: flushes of the whole mount the timer completed without an error.
    /// One that ends after a write returned made it durable only if it also began after
    /// that (the next one always does).
    pub periodic_flushes: AtomicU64,
    pub read_latency: Histogram,
    pub write_latency: Histogram,
    pub fsync_latency: Histogram,
}

impl FsStats {
    /// Every counter with its stable name (`dhrd status --json`, `--prometheus`; the
    /// names are documented in docs/fuse.md and only ever added to).
    pub fn counters(&self) -> [(&'static str, u64); 23] {
        let g = |a: &AtomicU64| a.load(Relaxed);
        [
            ("reads", g(&self.reads)),
            ("read_bytes", g(&self.read_bytes)),
            ("reads_ram", g(&self.reads_ram)),
            ("reads_backing", g(&self.reads_backing)),
            ("reads_mixed", g(&self.reads_mixed)),
            ("writes", g(&self.writes)),
            ("write_bytes", g(&self.write_bytes)),
            ("copies", g(&self.copies)),
            ("copy_bytes", g(&self.copy_bytes)),
            ("fsyncs", g(&self.fsyncs)),
            ("metadata_syncs", g(&self.metadata_syncs)),
            ("errors", g(&self.errors)),
            ("opens_passthrough", g(&self.opens_passthrough)),
            ("opens_direct", g(&self.opens_direct)),
            ("opens_cached", g(&self.opens_cached)),
            ("open_truncates", g(&self.open_truncates)),
            ("lookups", g(&self.lookups)),
            ("readdirplus_entries", g(&self.readdirplus_entries)),
            ("readlinks", g(&self.readlinks)),
            ("setattrs", g(&self.setattrs)),
            ("writes_in_flight_max", g(&self.writes_in_flight_max)),
            ("writes_in_flight_sum", g(&self.writes_in_flight_sum)),
            ("periodic_flushes", g(&self.periodic_flushes)),
        ]
    }

    /// Latency quantiles by operation, as upper bounds in microseconds (the histogram's
    /// buckets are powers of two); absent where nothing was timed.
    pub fn latency_quantiles_us(&self) -> [(&'static str, Quantiles); 3] {
        let q = |h: &Histogram| {
            [
                ("p50", h.quantile_us(0.5)),
                ("p99", h.quantile_us(0.99)),
                ("p999", h.quantile_us(0.999)),
            ]
        };
        [
            ("read", q(&self.read_latency)),
            ("write", q(&self.write_latency)),
            ("fsync", q(&self.fsync_latency)),
        ]
    }

    pub fn render(&self, out: &mut String) {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let _ = writeln!(
            out,
            "reads (daemon):  {} ({} bytes): RAM {}, backing {}, mixed {}",
            g(&self.reads),
            g(&self.read_bytes),
            g(&self.reads_ram),
            g(&self.reads_backing),
            g(&self.reads_mixed)
        );
        let _ = writeln!(
            out,
            "opens:           passthrough {}, direct {}, cached {} (passthrough reads and writes never reach the daemon); with O_TRUNC {}",
            g(&self.opens_passthrough),
            g(&self.opens_direct),
            g(&self.opens_cached),
            g(&self.open_truncates)
        );
        let writes = g(&self.writes);
        let _ = writeln!(
            out,
            "writes:          {writes} ({} bytes), in the daemon at once: at most {}, mean {:.1}",
            g(&self.write_bytes),
            g(&self.writes_in_flight_max),
            g(&self.writes_in_flight_sum) as f64 / writes.max(1) as f64
        );
        let _ = writeln!(
            out,
            "copies:          {} ({} bytes, copy_file_range done in the daemon)",
            g(&self.copies),
            g(&self.copy_bytes)
        );
        let _ = writeln!(
            out,
            "syncs:           fsync {}, metadata {}",
            g(&self.fsyncs),
            g(&self.metadata_syncs)
        );
        let _ = writeln!(
            out,
            "lookups:         {}; entries with attributes from readdirplus {}",
            g(&self.lookups),
            g(&self.readdirplus_entries)
        );
        let _ = writeln!(out, "readlinks:       {}", g(&self.readlinks));
        let _ = writeln!(out, "setattrs:        {}", g(&self.setattrs));
        let _ = writeln!(out, "errors:          {}", g(&self.errors));
        let _ = writeln!(out, "read latency:    {}", self.read_latency.line());
        let _ = writeln!(out, "write latency:   {}", self.write_latency.line());
        let _ = writeln!(out, "fsync latency:   {}", self.fsync_latency.line());
    }
}

#[cfg(test)]
mod tests {
    use super::{FsStats, InFlight};
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn in_flight_keeps_the_high_water_mark_and_what_each_request_found() {
        let s = FsStats::default();
        let enter = || {
            InFlight::enter(
                &s.writes_in_flight,
                &s.writes_in_flight_max,
                &s.writes_in_flight_sum,
            )
        };
        let a = enter();
        let b = enter();
        drop(a);
        let c = enter();
        assert_eq!(s.writes_in_flight.load(Relaxed), 2);
        drop((b, c));
        let d = enter();
        drop(d);
        assert_eq!(s.writes_in_flight.load(Relaxed), 0, "every request left");
        assert_eq!(
            s.writes_in_flight_max.load(Relaxed),
            2,
            "never more than two"
        );
        // Found on arrival: 1, 2, 2 and 1.
        assert_eq!(s.writes_in_flight_sum.load(Relaxed), 6);
    }
}
