//! The durable-I/O boundary of dhrd.
//!
//! Everything the engine knows about its backing store goes through [`Durable`]: five
//! operations (`read_at`, `write_at`, `sync`, `len`, `set_len`) plus a few optional hints
//! with safe defaults. The engine is generic over it, so the same engine code runs on a real
//! file or block device ([`FileBacking`]), on a deterministic simulated disk that loses
//! unsynced writes and tears sectors at a crash ([`SimBacking`]), and on either of those
//! slowed down to emulate another device ([`Timed`]).
//!
//! Crash semantics every implementation must honour:
//! - bytes passed to `write_at` are durable only once a later `sync` has returned `Ok`, or
//!   when `write_durably` returned `Persistence::Durable` for them;
//! - a `set_len` is durable under the same rule;
//! - after a crash, any write issued after the last successful `sync` may be absent, present,
//!   or torn at 512-byte sector granularity;
//! - a failed `sync` promises nothing about the writes it covered, and a later successful
//!   `sync` does not repair that promise (the engine treats it as sticky, see C4).

mod budget;
mod extent;
mod file;
mod lock;
pub mod replace;
mod rng;
mod sim;
mod timed;
pub mod xattr;

pub use budget::RamBudget;
pub use extent::{seek_extent, Allocation, Extent};
pub use file::{FileBacking, FileOptions, WriteSync, DIRECT_ALIGN_BYTES};
pub use rng::SplitMix64;
pub use sim::{CrashImage, Fault, FaultKind, SimBacking, SimStats};
pub use timed::{DeviceProfile, Timed, DEVICE_PROFILE_SYNTAX};

use std::io;

/// Sector size at which simulated crashes tear writes, and the unit device timing uses.
pub const SECTOR_BYTES: u64 = 512;

/// The memory page size every crate assumes (x86-64 and most arm64 kernels): the unit of
/// the RAM tier's mappings and of whole-page loads. The one definition in the workspace.
pub const PAGE_BYTES: u64 = 4096;

/// `b` bytes for people: "512 B", "4.0 KiB", "1.5 GiB" (binary units, one decimal), the
/// one form every status text uses.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

// Offsets and lengths are u64 and cast to usize for slices and system calls throughout the
// workspace; that is lossless only with 64-bit pointers.
const _: () = assert!(usize::BITS == 64, "dhrd needs a 64-bit target");

/// Whether a completed write is already durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// On stable storage already (O_DSYNC, O_DIRECT|O_DSYNC, non-volatile memory).
    Durable,
    /// Durable once a later `sync` succeeds.
    NeedsSync,
}

/// The narrow durable-storage interface the engine is generic over.
///
/// All methods take `&self` and must be safe to call from many threads at once; callers
/// order conflicting requests themselves.
#[allow(clippy::len_without_is_empty)] // `len` is a device size, not a collection
pub trait Durable: Send + Sync + 'static {
    /// Reads up to `buf.len()` bytes at `offset`. Short only at end of data.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the length if needed. Not durable until
    /// `sync` returns `Ok`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every completed `write_at` and `set_len` durable.
    fn sync(&self) -> io::Result<()>;

    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Truncates or extends (with zeros). Not durable until `sync` returns `Ok`.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Reads for bulk loading: the implementation should avoid filling the page cache
    /// (O_DIRECT or drop-behind). `buf` is page-aligned and `offset` is a multiple of the
    /// page size when the engine calls this.
    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at(buf, offset)
    }

    /// Tells the backing that the cached copy of a range is no longer needed (the RAM tier
    /// holds it). A hint: never fails the caller.
    fn drop_cache(&self, _offset: u64, _len: u64) {}

    /// Whether `[offset, offset+len)` is known to read as zeros without touching data
    /// (a hole). `false` when unknown.
    fn is_zero_range(&self, _offset: u64, _len: u64) -> bool {
        false
    }

    /// How `[offset, offset + max_len)` is allocated from `offset` on: the first extent,
    /// which may be shorter than `max_len` (`max_len > 0`). Used to answer block-status
    /// queries (sparse copies skip holes). It must never report a hole or zeros where
    /// reads could return anything else, so a backing whose reads may come from elsewhere
    /// (a cache in front of a lower tier) keeps the default: all data.
    fn extent_at(&self, _offset: u64, max_len: u64) -> io::Result<Extent> {
        Ok(Extent::data(max_len))
    }

    /// Zeroes a range, deallocating it where the backing can (punch hole). Not durable until
    /// `sync`. The default writes zeros.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zero_bytes(self, offset, len)
    }

    /// Whether a successful `write_at` is already durable (the backing writes with O_DSYNC
    /// or to non-volatile memory). The engine then does not wait for a `sync` after a
    /// write, so concurrent writers reach the device in parallel; other changes
    /// (`set_len`, `zero_range`) still need `sync`.
    fn writes_are_durable(&self) -> bool {
        false
    }

    /// `write_at`, saying whether this write is already durable. The default derives it
    /// from `writes_are_durable`; a backing that makes only some writes durable on return
    /// (e.g. aligned ones through O_DIRECT|O_DSYNC) says so per write.
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        self.write_at(buf, offset)?;
        Ok(if self.writes_are_durable() {
            Persistence::Durable
        } else {
            Persistence::NeedsSync
        })
    }

    /// The block size, when whole aligned blocks written with `write_durably` are durable
    /// on return by one device operation (O_DIRECT with RWF_DSYNC) while other writes need
    /// a `sync` (a buffered write plus a flush: two device operations). The engine then
    /// sends an unaligned write as the whole blocks around it, their other bytes taken
    /// from RAM. None (the default): no such path, every write costs the same.
    fn durable_write_block_bytes(&self) -> Option<u64> {
        None
    }

    /// Zeroes a range and keeps it allocated (NBD WRITE_ZEROES with NO_HOLE, fallocate
    /// FALLOC_FL_ZERO_RANGE). Not durable until `sync`. The default writes zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zero_bytes(self, offset, len)
    }

    /// Whether the RAM tier may serve reads now. A backing shared through a cluster says
    /// no when it cannot vouch that no other client has changed it (it lost, or could not
    /// recently confirm, its exclusive lock); the engine then fails reads rather than serve
    /// RAM that may be stale. A local file or device always may.
    fn reads_allowed(&self) -> io::Result<()> {
        Ok(())
    }

    /// Short human-readable description (path, device, profile) for status output.
    fn describe(&self) -> String {
        String::from("durable backing")
    }
}

/// Writes `len` zero bytes at `offset` in bounded pieces.
pub fn write_zero_bytes<D: Durable + ?Sized>(d: &D, offset: u64, len: u64) -> io::Result<()> {
    const ZERO_BUF_BYTES: u64 = 64 * 1024;
    let zeros = vec![0u8; ZERO_BUF_BYTES.min(len.max(1)) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        d.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

impl<D: Durable + ?Sized> Durable for std::sync::Arc<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn len(&self) -> io::Result<u64> {
        (**self).len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_bulk_at(buf, offset)
    }
    fn drop_cache(&self, offset: u64, len: u64) {
        (**self).drop_cache(offset, len)
    }
    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        (**self).is_zero_range(offset, len)
    }
    fn extent_at(&self, offset: u64, max_len: u64) -> io::Result<Extent> {
        (**self).extent_at(offset, max_len)
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).zero_range(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_zeroes(offset, len)
    }
    fn writes_are_durable(&self) -> bool {
        (**self).writes_are_durable()
    }
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        (**self).write_durably(buf, offset)
    }
    fn durable_write_block_bytes(&self) -> Option<u64> {
        (**self).durable_write_block_bytes()
    }
    fn reads_allowed(&self) -> io::Result<()> {
        (**self).reads_allowed()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Reads exactly `buf.len()` bytes unless the data ends first; returns the count read.
pub fn read_full<D: Durable + ?Sized>(d: &D, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = &mut buf[done..];
        match d.read_at(rest, offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
