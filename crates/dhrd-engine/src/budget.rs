//! RAM budget shared by any number of objects (SPEC I11). A chunk may enter state Loaded
//! only after reserving its size here; leaving Loaded releases it. The budget counts
//! chunk-sized reservations, an upper bound on the memory the RAM tier can hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct RamBudget {
    limit_bytes: u64,
    used_bytes: AtomicU64,
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

    pub fn release(&self, bytes: u64) {
        let prev = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(prev >= bytes, "RAM budget released more than reserved");
    }
}
