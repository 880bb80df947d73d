//! dhrd-tier: the fast tier of a tiered dhrd device (SPEC section 6).
//!
//! [`Tiered`] ([`tiered`]) is the tiered device of T1: an SSD cache tier of chunk slots in
//! front of a large slow lower tier, with promotion of hot chunks and write-back.
//! [`WriteBack`] ([`writeback`]) puts a non-volatile fast device in front of a slow
//! backing: writes are acknowledged once on the fast device and written back later (SPEC
//! M4, and the cache tier's write-back of T1).
//!
//! The space allocators once studied for this tier (ReHypar and its baselines) are in
//! `dhrd-alloc`: the cache tier uses fixed chunk slots and needs none (docs/tiering.md).

mod fastdev;
pub mod pairing;
#[cfg(test)]
mod testutil;
pub mod tiered;
pub mod writeback;

pub use pairing::LowerIdentity;
pub use tiered::{open_ssd_file, ssd_bytes_for, SlotSync, SsdTier, TierMode, TierStats, Tiered};
pub use writeback::{WriteBack, WriteBackStats};
