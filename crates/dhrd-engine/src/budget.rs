//! RAM budget shared by any number of objects (I11). A chunk may enter state Loaded
//! only after reserving its size here; leaving Loaded releases it. The budget counts
//! chunk-sized reservations, an upper bound on the memory the RAM tier can hold, except
//! for the last chunk of a file that ends inside it: that one is charged by the pages the
//! file occupies in it (see `object.rs`, "rebate"), so a 1 KiB file costs a page, not a
//! chunk. While such a file grows, its last chunk's charge grows with it even past the
//! limit ([`RamBudget::charge`]): the bytes are in RAM already.
//!
//! A user of the budget may register a reclaimer: memory it holds only as a cache (a
//! file system's copies of closed files) and gives back when a reservation would
//! otherwise fail. The reclaimer runs on the reserving thread, possibly under a chunk
//! lock, so it must not call into objects; it only releases reservations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Frees at least the given number of reserved bytes if it can (by calling
/// [`RamBudget::release`]); returns the bytes it released.
pub type Reclaimer = Box<dyn Fn(u64) -> u64 + Send + Sync>;

pub struct RamBudget {
    limit_bytes: u64,
    used_bytes: AtomicU64,
    reclaimer: OnceLock<Reclaimer>,
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
            reclaimer: OnceLock::new(),
        })
    }

    /// Registers the reclaimer (once; later calls are ignored).
    pub fn set_reclaimer(&self, r: Reclaimer) {
        let _ = self.reclaimer.set(r);
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

    /// Reserves `bytes`; `false` when that would exceed the limit even after the reclaimer
    /// (if any) gave back what it could.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        loop {
            if self.try_reserve_now(bytes) {
                return true;
            }
            let Some(r) = self.reclaimer.get() else {
                return false;
            };
            // Another thread may take what was reclaimed before we retry: ask again until
            // the reclaimer has nothing left.
            let short = self
                .used_bytes()
                .saturating_add(bytes)
                .saturating_sub(self.limit_bytes)
                .max(1);
            if r(short) == 0 {
                return self.try_reserve_now(bytes);
            }
        }
    }

    /// Reserves `bytes` without asking the reclaimer (for the reclaimer's own users, whose
    /// cache must not evict itself).
    pub fn try_reserve_now(&self, bytes: u64) -> bool {
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
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_full_budget_asks_the_reclaimer_and_try_reserve_now_does_not() {
        let b = RamBudget::new(10);
        assert!(b.try_reserve(8));
        assert!(!b.try_reserve(5), "no reclaimer yet");
        let cached = Arc::new(AtomicU64::new(8));
        let asked = Arc::new(AtomicU64::new(0));
        let weak = Arc::downgrade(&b);
        let (c2, a2) = (cached.clone(), asked.clone());
        b.set_reclaimer(Box::new(move |need| {
            a2.store(need, Ordering::Relaxed);
            let give = c2.swap(0, Ordering::Relaxed);
            if let Some(b) = weak.upgrade() {
                b.release(give);
            }
            give
        }));
        assert!(!b.try_reserve_now(5));
        assert_eq!(asked.load(Ordering::Relaxed), 0);
        assert!(b.try_reserve(5));
        assert_eq!(asked.load(Ordering::Relaxed), 3, "asked for the shortfall");
        assert_eq!(b.used_bytes(), 5);
        assert!(!b.try_reserve(6), "nothing left to reclaim");
    }
}
