//! RAM budget shared by any number of users of RAM (I11): both RAM tiers charge it, so one
//! `--mem` bounds whichever tier a frontend runs on, or both at once.
//!
//! - The engine (`dhrd-engine`): a chunk may enter state Loaded only after reserving its
//!   size here; leaving Loaded releases it. It counts chunk-sized reservations, an upper
//!   bound on the memory its RAM tier can hold, except for the last chunk of a file that
//!   ends inside it: that one is charged by the pages the file occupies in it (the
//!   engine's "rebate"), so a 1 KiB file costs a page, not a chunk. While such a file
//!   grows, its last chunk's charge grows with it even past the limit
//!   ([`RamBudget::charge`]): the bytes are in RAM already.
//! - The page cache tier (`dhrd-pagecache`): the pages it pins.
//!
//! Why here, at the bottom: the two tiers are peers, neither depends on the other, and
//! the budget has no dependency of its own.
//!
//! Invariants: `used_bytes` is the sum of live reservations and charges; a release of
//! more than is held is a bug and stops the process. Crash semantics: none (RAM only).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct RamBudget {
    limit_bytes: u64,
    used_bytes: AtomicU64,
}

impl std::fmt::Debug for RamBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamBudget")
            .field("limit_bytes", &self.limit_bytes)
            .field("used_bytes", &self.used_bytes())
            .finish()
    }
}

impl RamBudget {
    pub fn new(limit_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            limit_bytes,
            used_bytes: AtomicU64::new(0),
        })
    }

    pub fn unlimited() -> Arc<Self> {
        Self::new(u64::MAX)
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`; `false` when that would exceed the limit.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        let mut cur = self.used_bytes.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes).filter(|n| *n <= self.limit_bytes) else {
                return false;
            };
            match self.used_bytes.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Charges `bytes` whether or not the limit allows it: for memory that is in use
    /// already and cannot be refused (a Loaded chunk that grows with its file). Later
    /// reservations fail until enough is released.
    pub fn charge(&self, bytes: u64) {
        self.used_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn release(&self, bytes: u64) {
        let prev = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(prev >= bytes, "RAM budget released more than reserved");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit_and_charges_do_not() {
        let b = RamBudget::new(10);
        assert!(b.try_reserve(8));
        assert!(!b.try_reserve(5));
        assert!(b.try_reserve(2));
        b.charge(4);
        assert_eq!(b.used_bytes(), 14);
        assert!(!b.try_reserve(1), "over the limit after a charge");
        b.release(6);
        assert!(b.try_reserve(2));
        assert_eq!(b.used_bytes(), 10);
    }
}
