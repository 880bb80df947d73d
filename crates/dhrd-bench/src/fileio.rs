//! Helpers shared by the file-level workloads (`fileserver`, `video`): size parsing, a
//! checked close, full reads, a cheap checksum, latency histograms, and the output
//! convention (one JSON object on stdout, one summary line on stderr).
//!
//! These workloads run on whatever file system the caller points them at (a dhrd FUSE
//! mount, tmpfs, ext4, ...), so they use only portable POSIX calls: no O_DIRECT, no
//! fallocate, no assumption about what close or syncfs can return. Every error is
//! reported with the operation and the path it happened on.

use anyhow::Context;
pub use dhrd_engine::parse_size;
use hdrhistogram::Histogram;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::Path;

pub const MIB: u64 = 1 << 20;

/// Largest latency a histogram records, in ns (an op slower than a minute is clamped).
const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Significant figures of the latency histograms (1% resolution; a 3-figure histogram is
/// 200 KiB, and fileserver keeps 11 per thread).
const LATENCY_SIGFIG: u8 = 2;

/// A latency histogram in ns, 1 ns to a minute.
pub fn latency_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts; failure is impossible.
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, LATENCY_SIGFIG).unwrap_or_else(|_| unreachable!())
}

/// Records `ns` (clamped into the histogram's range).
pub fn record_ns(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
}

/// Closes `f` and returns close's error, which `drop` would swallow. On FUSE and network
/// file systems close is where a flush failure shows up.
pub fn close_checked(f: File, path: &Path, op: &str) -> anyhow::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just released by the File, so we own it and close it exactly once.
    let rc = unsafe { libc::close(fd) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // EINTR on close: the descriptor is gone on Linux, and retrying could close a
        // descriptor another thread just opened. Anything else is a real error.
        if e.kind() != ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("{op}: close {}", path.display()));
        }
    }
    Ok(())
}

/// Reads until `buf` is full or end of file; returns the bytes read (short only at EOF).
pub fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(buf.get_mut(got..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// fsync(2) on `f` with the path in the error.
pub fn fsync(f: &File, path: &Path, op: &str) -> anyhow::Result<()> {
    f.sync_all()
        .with_context(|| format!("{op}: fsync {}", path.display()))
}

/// syncfs(2) on the file system holding `dir`, so writes of an untimed setup phase do not
/// drain during the timed phase.
pub fn syncfs(dir: &Path) -> anyhow::Result<()> {
    let d = File::open(dir).with_context(|| format!("syncfs: open {}", dir.display()))?;
    // SAFETY: syncfs on a descriptor we own for the duration of the call.
    let rc = unsafe { libc::syncfs(d.as_raw_fd()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("syncfs {}", dir.display()));
    }
    close_checked(d, dir, "syncfs")
}

/// Lanes of the checksum: independent multiply chains so it runs at several GB/s.
const SUM_LANES: usize = 4;
const SUM_PRIME: u64 = 0x9E37_79B9_7F4A_7C15;

/// A cheap streaming checksum (not cryptographic): four lanes of xor-multiply over
/// little-endian u64 words, then the byte count. The result depends only on the byte
/// sequence, not on how it was split into `update` calls, as long as every call but the
/// last passes a multiple of 32 bytes (the workloads feed whole blocks).
#[derive(Debug, Clone)]
pub struct Checksum {
    lanes: [u64; SUM_LANES],
    tail: u64,
    len: u64,
}

impl Default for Checksum {
    fn default() -> Self {
        Self {
            lanes: [1, 2, 3, 4],
            tail: 0,
            len: 0,
        }
    }
}

impl Checksum {
    pub fn update(&mut self, data: &[u8]) {
        debug_assert!(
            self.len.is_multiple_of(8 * SUM_LANES as u64),
            "split mid-stride"
        );
        let mut strides = data.chunks_exact(8 * SUM_LANES);
        for s in &mut strides {
            for (lane, w) in self.lanes.iter_mut().zip(s.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                *lane = (*lane ^ u64::from_le_bytes(b)).wrapping_mul(SUM_PRIME);
            }
        }
        for &b in strides.remainder() {
            self.tail = (self.tail ^ u64::from(b)).wrapping_mul(SUM_PRIME);
        }
        self.len += data.len() as u64;
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.len;
        for &l in self.lanes.iter().chain(std::iter::once(&self.tail)) {
            h = (h ^ l).wrapping_mul(SUM_PRIME).rotate_left(29);
        }
        h
    }
}

/// Prints the result object as one line of JSON on stdout and `summary` on stderr.
pub fn emit(json: &serde_json::Value, summary: &str) -> anyhow::Result<()> {
    let s = serde_json::to_string(json).context("encoding the result as JSON")?;
    println!("{s}");
    eprintln!("{summary}");
    Ok(())
}

/// Rounds a rate or a latency in us to 3 decimals for the JSON: the machines are noisy far
/// above that.
pub fn r3(v: f64) -> f64 {
    (v * 1e3).round() / 1e3
}

/// Rounds seconds to the microsecond for the JSON.
pub fn r6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_split_independent_and_sensitive() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut a = Checksum::default();
        a.update(&data);
        let mut b = Checksum::default();
        b.update(&data[..4096]);
        b.update(&data[4096..]);
        assert_eq!(a.finish(), b.finish());
        let mut changed = data.clone();
        changed[5000] ^= 1;
        let mut c = Checksum::default();
        c.update(&changed);
        assert_ne!(a.finish(), c.finish());
        let mut d = Checksum::default();
        d.update(&data[..9999]);
        assert_ne!(a.finish(), d.finish());
    }
}
