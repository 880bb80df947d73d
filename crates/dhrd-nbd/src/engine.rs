//! [`Target`] for the engine's [`HybridObject`]: each NBD command becomes one engine call.
//!
//! Invariants:
//! - the object is opened with `fixed_len`, so the export size never changes;
//! - in `sync` durability every engine write is durable on return, so FUA costs nothing;
//!   in `fsync`/`periodic` a FUA request is followed by `flush` before the reply;
//! - reads of Loaded ranges may be sent straight from the RAM tier (a borrowed view, no
//!   copy); the view waits for a slow client for at most `BORROWED_WAIT_MAX`, then the
//!   rest is copied out and the view ends (see `reply.rs`);
//! - block status comes from the engine (`HybridObject::extents`): backing holes and RAM
//!   pages known to be zero, never a read of data;
//! - WRITE_ZEROES with NO_HOLE keeps the range allocated (`write_zeroes`: the backing
//!   zeroes it in place), without a buffer of the client's length.

use crate::target::Target;
use crate::NbdError;
use dhrd_engine::{Durability, HybridObject, View};
use dhrd_io::Durable;

/// The engine's hybrid object as an NBD target.
pub struct EngineTarget<D: Durable> {
    obj: HybridObject<D>,
    /// Whether every engine write is already durable on return (`sync` mode); if not, a
    /// FUA request needs an explicit flush.
    writes_are_durable: bool,
    read_only: bool,
}

impl<D: Durable> EngineTarget<D> {
    /// Serves `obj`; `read_only` refuses writes at the protocol level (advertised as
    /// NBD_FLAG_READ_ONLY) in addition to whatever the object itself refuses.
    pub fn new(obj: HybridObject<D>, read_only: bool) -> Self {
        // The server checks ranges against the size it advertised at negotiation.
        assert!(
            obj.is_fixed_len(),
            "an NBD export needs a fixed-length object"
        );
        Self {
            writes_are_durable: matches!(obj.durability(), Durability::Sync),
            obj,
            read_only,
        }
    }

    pub fn object(&self) -> &HybridObject<D> {
        &self.obj
    }

    /// The server validated every range against `size()`, which never changes (`target.rs`).
    fn debug_check_range(&self, offset: u64, len: u64) {
        debug_assert!(
            len > 0 && offset.checked_add(len).is_some_and(|e| e <= self.obj.len()),
            "request [{offset}, +{len}) reached the target unvalidated"
        );
    }

    fn after_write(&self, fua: bool) -> Result<(), NbdError> {
        if fua && !self.writes_are_durable {
            self.obj.flush()?;
        }
        Ok(())
    }
}

impl<D: Durable> Target for EngineTarget<D> {
    fn size(&self) -> u64 {
        self.obj.len()
    }

    fn is_read_only(&self) -> bool {
        self.read_only || self.obj.is_read_only()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), NbdError> {
        self.debug_check_range(offset, buf.len() as u64);
        let out = self.obj.read_at(buf, offset)?;
        if out.bytes < buf.len() {
            // The range was checked against size(), so a short read means the backing
            // shrank underneath us; report it rather than return stale buffer bytes.
            return Err(NbdError::Errno(libc::EIO));
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), NbdError> {
        self.debug_check_range(offset, buf.len() as u64);
        self.obj.write_at(buf, offset)?;
        self.after_write(fua)
    }

    fn zero(&self, offset: u64, len: u64, may_punch: bool, fua: bool) -> Result<(), NbdError> {
        self.debug_check_range(offset, len);
        if may_punch {
            self.obj.zero_range(offset, len)?;
        } else {
            // NO_HOLE: the range must stay allocated (FALLOC_FL_ZERO_RANGE on the backing).
            self.obj.write_zeroes(offset, len)?;
        }
        self.after_write(fua)
    }

    fn flush(&self) -> Result<(), NbdError> {
        Ok(self.obj.flush()?)
    }

    fn extents(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<crate::target::Extent>, NbdError> {
        self.debug_check_range(offset, len);
        // Holes of the backing and zeros the RAM tier knows of; nothing is read.
        Ok(self.obj.extents(offset, len, max_extents)?)
    }

    fn read_borrowed(
        &self,
        offset: u64,
        len: usize,
        send: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, NbdError> {
        self.debug_check_range(offset, len as u64);
        // Only Loaded chunks have a view (C2: served from RAM); anything else falls back
        // to read_at, which follows I5 (Unloaded/Loading ranges come from the backing).
        match self.obj.view(offset, len)? {
            View::Ram(v) if v.len() == len => {
                send(&v);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
