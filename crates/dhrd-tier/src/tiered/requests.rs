//! Which tier served each request of the tiered device.
//!
//! Every call of `read_at` and `write_at` (a request of the engine above) is counted once,
//! as served by the SSD alone or as having reached the lower tier: a read miss, a read
//! needing a part the slot lacks, a write that read the edges of a part from the lower
//! tier or went there instead of to a slot. Background work (promotions' copies, the
//! write-back) is not a request and is not counted. These counts are the cache tier's hit
//! share as the device itself sees it; a latency threshold cannot tell a slow SSD write
//! from a fast miss.
//!
//! Invariants: each counted request adds exactly one to one counter, after it completed
//! successfully; the counters only grow.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where a request (or a piece of it) was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reached {
    /// The SSD alone.
    Ssd,
    /// The lower tier was read or written on the request's behalf.
    Lower,
}

impl Reached {
    /// The tier a request made of `self` and `other` reached: the lower one if either did.
    pub(super) fn and(self, other: Reached) -> Reached {
        if self == Reached::Lower || other == Reached::Lower {
            Reached::Lower
        } else {
            Reached::Ssd
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct RequestCounts {
    reads_ssd: AtomicU64,
    reads_lower: AtomicU64,
    writes_ssd: AtomicU64,
    writes_lower: AtomicU64,
}

/// A snapshot: (reads served by the SSD, reads that reached the lower tier, writes served
/// by the SSD, writes that reached the lower tier).
pub(super) type Counts = (u64, u64, u64, u64);

impl RequestCounts {
    pub(super) fn read(&self, r: Reached) {
        match r {
            Reached::Ssd => &self.reads_ssd,
            Reached::Lower => &self.reads_lower,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn write(&self, r: Reached) {
        match r {
            Reached::Ssd => &self.writes_ssd,
            Reached::Lower => &self.writes_lower,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Counts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (
            g(&self.reads_ssd),
            g(&self.reads_lower),
            g(&self.writes_ssd),
            g(&self.writes_lower),
        )
    }
}
