//! What the server calls to serve requests: the [`Target`] trait (implemented for the
//! engine's hybrid object in `engine.rs`, and by test doubles).
//!
//! Invariants:
//! - the server has already checked every range against [`Target::size`] and every
//!   payload against the protocol limits, so implementations see only in-range requests;
//! - a method returns only when its effect is as durable as the export's durability mode
//!   promises (for the engine: `sync` = durable on return; `fsync`/`periodic` = durable
//!   after `flush`, and FUA requests are flushed before returning);
//! - implementations are shared by every connection and worker thread (`Send + Sync`).

use crate::NbdError;
pub use dhrd_io::{Allocation, Extent};

/// A block device as the NBD server sees it.
pub trait Target: Send + Sync + 'static {
    /// Export size in bytes (fixed while serving).
    fn size(&self) -> u64;
    /// True when writes are refused (configured read-only, or a sticky backing failure).
    fn is_read_only(&self) -> bool;
    /// Fills all of `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), NbdError>;
    /// Writes all of `buf` at `offset`; with `fua` the data is durable on return.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), NbdError>;
    /// Zeroes a range. `may_punch`: the backing may deallocate it (TRIM, or WRITE_ZEROES
    /// without NO_HOLE); otherwise zeros are written so the range stays allocated.
    fn zero(&self, offset: u64, len: u64, may_punch: bool, fua: bool) -> Result<(), NbdError>;
    /// Makes every completed write (from any connection) durable.
    fn flush(&self) -> Result<(), NbdError>;
    /// How `[offset, offset + len)` is allocated (NBD block status, `base:allocation`):
    /// consecutive extents from `offset`, at least one and at most `max_extents`, none
    /// past the range. An extent may be reported as zeros only if reads of it return
    /// zeros. The default, all data, is always true.
    fn extents(&self, offset: u64, len: u64, max_extents: usize) -> Result<Vec<Extent>, NbdError> {
        let _ = (offset, max_extents);
        Ok(vec![Extent::data(len)])
    }
    /// Hands the bytes of `[offset, offset + len)` to `send` without copying them, when
    /// the target holds them in memory. Returns `Ok(false)`, without calling `send`, when
    /// it cannot; the caller then uses [`Target::read_at`]. The memory may stay pinned
    /// (for the engine: a view that delays the reclaim of evicted RAM) until this returns,
    /// so `send` waits for a client only briefly (`BORROWED_WAIT_MAX`) and copies out
    /// what the client has not taken by then.
    fn read_borrowed(
        &self,
        offset: u64,
        len: usize,
        send: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, NbdError> {
        let _ = (offset, len, send);
        Ok(false)
    }
}

/// A shared target is a target, so callers can keep a handle (tests, status reporting).
impl<T: Target> Target for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), NbdError> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), NbdError> {
        (**self).write_at(buf, offset, fua)
    }
    fn zero(&self, offset: u64, len: u64, may_punch: bool, fua: bool) -> Result<(), NbdError> {
        (**self).zero(offset, len, may_punch, fua)
    }
    fn flush(&self) -> Result<(), NbdError> {
        (**self).flush()
    }
    fn extents(&self, offset: u64, len: u64, max_extents: usize) -> Result<Vec<Extent>, NbdError> {
        (**self).extents(offset, len, max_extents)
    }
    fn read_borrowed(
        &self,
        offset: u64,
        len: usize,
        send: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, NbdError> {
        (**self).read_borrowed(offset, len, send)
    }
}
