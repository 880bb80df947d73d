//! Device-timing emulation (E1): wraps any [`Durable`] and makes each operation take at
//! least a fixed latency plus its transfer time at a bandwidth cap.
//!
//! Bandwidth is modelled as one shared channel: an operation's transfer starts when the
//! previous one's ends (`busy_until`), so concurrent requests queue as on a real device,
//! while per-request latency overlaps between requests (as with a device's internal
//! parallelism). Timing never changes results or crash semantics; it only delays.

use crate::Durable;
use parking_lot::Mutex;
use std::io;
use std::time::{Duration, Instant};

/// Waits shorter than this are spun, since `sleep` overshoots by tens of microseconds.
const SPIN_BELOW: Duration = Duration::from_micros(200);

/// Per-operation timing of an emulated device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceProfile {
    pub read_latency_ns: u64,
    pub write_latency_ns: u64,
    pub sync_latency_ns: u64,
    /// Shared transfer bandwidth; `None` means unlimited.
    pub bandwidth_bytes_per_s: Option<u64>,
}

impl DeviceProfile {
    /// A SATA-class SSD: 80 us reads, 25 us buffered writes, 1 ms flush, 500 MB/s.
    pub fn ssd() -> Self {
        Self {
            read_latency_ns: 80_000,
            write_latency_ns: 25_000,
            sync_latency_ns: 1_000_000,
            bandwidth_bytes_per_s: Some(500_000_000),
        }
    }

    /// A 7200 rpm disk: ~8 ms random access, 150 MB/s sequential.
    pub fn hdd() -> Self {
        Self {
            read_latency_ns: 8_000_000,
            write_latency_ns: 8_000_000,
            sync_latency_ns: 10_000_000,
            bandwidth_bytes_per_s: Some(150_000_000),
        }
    }

    /// Byte-addressable NVM relative to DRAM as seed 004 assumes: 4.4x DRAM read latency
    /// and 10x DRAM write latency, taking DRAM as 100 ns per access.
    pub fn nvm() -> Self {
        Self {
            read_latency_ns: 440,
            write_latency_ns: 1_000,
            sync_latency_ns: 1_000,
            bandwidth_bytes_per_s: Some(8_000_000_000),
        }
    }

    /// Parses `ssd`, `hdd`, `nvm` or `read_us,write_us,sync_us,MBps` (MBps 0 = unlimited).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ssd" => return Some(Self::ssd()),
            "hdd" => return Some(Self::hdd()),
            "nvm" => return Some(Self::nvm()),
            _ => {}
        }
        let v: Vec<u64> = s
            .split(',')
            .map(|p| p.trim().parse().ok())
            .collect::<Option<_>>()?;
        let [r, w, sy, mbps] = v.as_slice() else {
            return None;
        };
        Some(Self {
            read_latency_ns: r * 1000,
            write_latency_ns: w * 1000,
            sync_latency_ns: sy * 1000,
            bandwidth_bytes_per_s: if *mbps == 0 {
                None
            } else {
                Some(mbps * 1_000_000)
            },
        })
    }
}

/// A [`Durable`] slowed down to a [`DeviceProfile`].
#[derive(Debug)]
pub struct Timed<D> {
    inner: D,
    profile: DeviceProfile,
    busy_until: Mutex<Instant>,
}

fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_BELOW {
            std::thread::sleep(left - SPIN_BELOW / 2);
        } else {
            std::hint::spin_loop();
        }
    }
}

impl<D: Durable> Timed<D> {
    pub fn new(inner: D, profile: DeviceProfile) -> Self {
        Self {
            inner,
            profile,
            busy_until: Mutex::new(Instant::now()),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn delay(&self, start: Instant, latency_ns: u64, bytes: u64) {
        let mut done = start + Duration::from_nanos(latency_ns);
        if let Some(bw) = self.profile.bandwidth_bytes_per_s {
            let transfer = Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / bw.max(1));
            let mut busy = self.busy_until.lock();
            let begin = (*busy).max(start);
            *busy = begin + transfer;
            done = done.max(*busy);
        }
        wait_until(done);
    }
}

impl<D: Durable> Durable for Timed<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let t = Instant::now();
        let r = self.inner.read_at(buf, offset);
        self.delay(t, self.profile.read_latency_ns, buf.len() as u64);
        r
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let t = Instant::now();
        let r = self.inner.write_at(buf, offset);
        self.delay(t, self.profile.write_latency_ns, buf.len() as u64);
        r
    }
    fn sync(&self) -> io::Result<()> {
        let t = Instant::now();
        let r = self.inner.sync();
        self.delay(t, self.profile.sync_latency_ns, 0);
        r
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let t = Instant::now();
        let r = self.inner.read_bulk_at(buf, offset);
        self.delay(t, self.profile.read_latency_ns, buf.len() as u64);
        r
    }
    fn drop_cache(&self, offset: u64, len: u64) {
        self.inner.drop_cache(offset, len)
    }
    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        self.inner.is_zero_range(offset, len)
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let t = Instant::now();
        let r = self.inner.zero_range(offset, len);
        self.delay(t, self.profile.write_latency_ns, 0);
        r
    }
    fn writes_are_durable(&self) -> bool {
        self.inner.writes_are_durable()
    }
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<crate::Persistence> {
        let t = Instant::now();
        let r = self.inner.write_durably(buf, offset);
        self.delay(t, self.profile.write_latency_ns, buf.len() as u64);
        r
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let t = Instant::now();
        let r = self.inner.write_zeroes(offset, len);
        self.delay(t, self.profile.write_latency_ns, len);
        r
    }
    fn describe(&self) -> String {
        format!("{} (timed {:?})", self.inner.describe(), self.profile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimBacking;

    #[test]
    fn adds_latency_and_parses() -> io::Result<()> {
        let p = DeviceProfile::parse("300,300,300,0").ok_or(io::ErrorKind::InvalidInput)?;
        let t = Timed::new(SimBacking::new(0), p);
        let start = Instant::now();
        t.write_at(b"abc", 0)?;
        assert!(start.elapsed() >= Duration::from_micros(300));
        assert_eq!(DeviceProfile::parse("hdd"), Some(DeviceProfile::hdd()));
        assert_eq!(DeviceProfile::parse("1,2"), None);
        Ok(())
    }
}
