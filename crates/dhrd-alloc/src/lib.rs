//! dhrd-alloc: space allocators for a fast tier, ReHypar and the baselines it is compared
//! with (SPEC T2, T3).
//!
//! This is study code: no device of dhrd uses it. The SSD cache tier (`dhrd-tier`) caches
//! fixed chunk slots and needs no allocator (docs/tiering.md says why); these allocators
//! are measured against each other on allocation traces by `dhrd-bench rehypar`, and
//! ReHypar's write throughput against first-fit file writes by `dhrd-bench rehypar-io`.
//!
//! All of them work over one block address space and behind one trait,
//! [`SpaceAllocator`]:
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
//! its own; whoever owns one serialises access. Nothing here is durable: an allocator's
//! state lives in memory only, so a crash loses nothing but the study's run.

mod bucket;
mod error;
mod extent;
pub mod rehypar;
mod space;

pub use bucket::{BucketAllocator, BUCKETS_MAX};
pub use error::Error;
pub use extent::{ExtentAllocator, FitPolicy};
pub use rehypar::{FreePolicy, ReHypar, ReHyparConfig, SectionSpec};
pub use space::{
    AllocOutcome, BlockAddr, BlockCount, Extent, FreeOutcome, LiveSet, Placement, SpaceAllocator,
    SpaceStats,
};
