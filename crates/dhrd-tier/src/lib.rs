//! dhrd-tier: the fast tier of a tiered dhrd device (SPEC section 6).
//!
//! [`Tiered`] ([`tiered`]) is the tiered device of T1: an SSD cache tier of chunk slots in
//! front of a large slow lower tier, with promotion of hot chunks and write-back.
//! [`WriteBack`] ([`writeback`]) puts a non-volatile fast device in front of a slow
//! backing: writes are acknowledged once on the fast device and written back later (SPEC
//! M4, and the cache tier's write-back of T1).
//!
//! For now this crate holds the fast tier's space allocators, all over one block address
//! space and behind one trait, [`SpaceAllocator`], so that they can be compared on the same
//! allocation traces (`dhrd-bench rehypar`, docs/tiering.md):
//! - [`ReHypar`]: recursive hybrid chunk partitioning (T2), in [`rehypar`];
//! - [`ExtentAllocator`]: a plain first-fit or best-fit allocator over coalesced free
//!   extents, the baseline of T3;
//! - [`BucketAllocator`]: fixed buckets filled sequentially and reused only when wholly
//!   free, as bcache manages its cache device.
//!
//! Every allocator works in blocks ([`BlockAddr`], [`BlockCount`]), hands out one
//! contiguous [`Extent`] per request, reports running out of space as
//! [`AllocOutcome::NoSpace`] (expected: the data then goes to the slow tier), and refuses to
//! free what it did not hand out ([`Error::NotAllocated`]). None of them is thread-safe on
//! its own; the tier that owns one serialises access.

mod bucket;
mod error;
mod extent;
mod fastdev;
pub mod pairing;
pub mod rehypar;
mod space;
#[cfg(test)]
mod testutil;
pub mod tiered;
pub mod writeback;

pub use bucket::{BucketAllocator, BUCKETS_MAX};
pub use error::Error;
pub use extent::{ExtentAllocator, FitPolicy};
pub use pairing::LowerIdentity;
pub use rehypar::{FreePolicy, ReHypar, ReHyparConfig, SectionSpec};
pub use space::{
    AllocOutcome, BlockAddr, BlockCount, Extent, FreeOutcome, LiveSet, Placement, SpaceAllocator,
    SpaceStats,
};
pub use tiered::{open_ssd_file, ssd_bytes_for, SsdTier, TierMode, TierStats, Tiered};
pub use writeback::{WriteBack, WriteBackStats};
