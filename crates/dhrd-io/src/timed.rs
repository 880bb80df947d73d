//! Device-timing emulation (E1): wraps any [`Durable`] and makes each operation take at
//! least a fixed latency plus its transfer time at a bandwidth cap.
//!
//! Bandwidth is modelled as one shared channel: an operation's transfer starts once its
//! latency has passed and the previous transfer has ended (`busy_until`), so concurrent
//! requests queue for bandwidth as on a real device, while per-request latency overlaps
//! between requests (as with a device's internal parallelism). The real operation runs
//! first and its time counts towards the emulated one: the emulation is a floor, never
//! added on top of a slower real device. Timing never changes results or crash semantics;
//! it only delays.

use crate::Durable;
use parking_lot::Mutex;
use std::fmt;
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

    /// Parses `ssd`, `hdd`, `nvm` or `read_us,write_us,sync_us,MBps` (MBps 0 = unlimited;
    /// MB is 10^6 bytes). `None` for anything else, including values that overflow.
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
            read_latency_ns: r.checked_mul(1000)?,
            write_latency_ns: w.checked_mul(1000)?,
            sync_latency_ns: sy.checked_mul(1000)?,
            bandwidth_bytes_per_s: if *mbps == 0 {
                None
            } else {
                Some(mbps.checked_mul(1_000_000)?)
            },
        })
    }
}

/// What [`DeviceProfile::parse`] accepts, for error messages of the programs that take a
/// profile from their user.
pub const DEVICE_PROFILE_SYNTAX: &str = "ssd, hdd, nvm or READ_US,WRITE_US,SYNC_US,MBPS \
     (latencies in microseconds, bandwidth in MB/s, 0 for unlimited)";

/// Nanoseconds as microseconds, with the fraction only when there is one (NVM latencies
/// are below a microsecond).
fn fmt_us(f: &mut fmt::Formatter<'_>, ns: u64) -> fmt::Result {
    let (us, frac) = (ns / 1000, ns % 1000);
    if frac == 0 {
        write!(f, "{us} us")
    } else {
        let frac = format!("{frac:03}");
        write!(f, "{us}.{} us", frac.trim_end_matches('0'))
    }
}

/// One line for startup messages and status, e.g. `read 8000 us, write 8000 us, sync
/// 10000 us, 150 MB/s`.
impl fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("read ")?;
        fmt_us(f, self.read_latency_ns)?;
        f.write_str(", write ")?;
        fmt_us(f, self.write_latency_ns)?;
        f.write_str(", sync ")?;
        fmt_us(f, self.sync_latency_ns)?;
        match self.bandwidth_bytes_per_s {
            None => f.write_str(", unlimited bandwidth"),
            Some(b) if b % 1_000_000 == 0 => write!(f, ", {} MB/s", b / 1_000_000),
            Some(b) => write!(f, ", {b} bytes/s"),
        }
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

    pub fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// Waits until the operation begun at `start` is done on the emulated device: its
    /// latency, then its transfer on the shared channel (queued behind transfers reserved
    /// before it). Transfers are reserved in arrival order, so a request with a shorter
    /// latency does not overtake one already queued.
    fn delay(&self, start: Instant, latency_ns: u64, bytes: u64) {
        let mut done = start + Duration::from_nanos(latency_ns);
        if let Some(bw) = self.profile.bandwidth_bytes_per_s {
            let transfer = Duration::from_nanos(
                u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(bw.max(1)))
                    .unwrap_or(u64::MAX),
            );
            let mut busy = self.busy_until.lock();
            let begin = (*busy).max(done);
            *busy = begin + transfer;
            done = *busy;
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
    // Metadata, not a device transfer: untimed, like `is_zero_range`.
    fn extent_at(&self, offset: u64, max_len: u64) -> io::Result<crate::Extent> {
        self.inner.extent_at(offset, max_len)
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
    // A check of the backing's own state (an RBD image's lock), not a device operation:
    // forwarded untimed, and forwarded at all so that timing never loosens it.
    fn reads_allowed(&self) -> io::Result<()> {
        self.inner.reads_allowed()
    }
    fn durable_write_block_bytes(&self) -> Option<u64> {
        self.inner.durable_write_block_bytes()
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
        format!("{} (timed: {})", self.inner.describe(), self.profile)
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
        assert_eq!(DeviceProfile::parse("18446744073709551615,0,0,0"), None);
        Ok(())
    }

    #[test]
    fn transfer_follows_latency() -> io::Result<()> {
        // 1 ms latency, then 1000 bytes at 1 MB/s: 1 ms more. Lower bound only.
        let p = DeviceProfile::parse("1000,1000,1000,1").ok_or(io::ErrorKind::InvalidInput)?;
        let t = Timed::new(SimBacking::new(0), p);
        t.write_at(&[7u8; 1000], 0)?;
        let start = Instant::now();
        let mut buf = [0u8; 1000];
        assert_eq!(t.read_at(&mut buf, 0)?, 1000);
        assert!(start.elapsed() >= Duration::from_micros(2000));
        assert_eq!(buf, [7u8; 1000]);
        Ok(())
    }

    #[test]
    fn describes_its_profile() {
        assert_eq!(
            DeviceProfile::hdd().to_string(),
            "read 8000 us, write 8000 us, sync 10000 us, 150 MB/s"
        );
        assert_eq!(
            DeviceProfile::nvm().to_string(),
            "read 0.44 us, write 1 us, sync 1 us, 8000 MB/s"
        );
        assert_eq!(
            DeviceProfile::parse("2000,3,4,0").map(|p| p.to_string()),
            Some("read 2000 us, write 3 us, sync 4 us, unlimited bandwidth".to_string())
        );
    }

    /// A backing that refuses reads, as an RBD image does once its lock is in doubt.
    struct Fenced;
    impl Durable for Fenced {
        fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<usize> {
            Ok(0)
        }
        fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(0)
        }
        fn set_len(&self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn reads_allowed(&self) -> io::Result<()> {
            Err(io::ErrorKind::PermissionDenied.into())
        }
    }

    #[test]
    fn keeps_the_inner_read_fence() {
        let t = Timed::new(Fenced, DeviceProfile::ssd());
        assert!(t.reads_allowed().is_err());
    }
}
