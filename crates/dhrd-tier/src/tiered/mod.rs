//! The tiered device (SPEC T1): an SSD cache tier in front of a large slow lower tier.
//!
//! [`Tiered`] is a [`Durable`] the engine sits on, so the whole is the paper's "DHRD +
//! HDD": the engine's RAM tier over an SSD cache over the disk. The SSD is divided into
//! slots of one chunk; a slot holds one chunk of the lower tier, clean or dirty, wholly or
//! in some of its parts (`parts.rs`). Hot chunks are promoted into the SSD on their second
//! miss (the engine's admission policy, `dhrd_engine::cache`, which also picks the slot to
//! reuse); writes go to the SSD and are written back to the lower tier in the background
//! (`writeback`), or, in `writethrough` mode, go to the lower tier with the SSD copy
//! dropped first. A write to a chunk the SSD does not hold fills only the parts it touches
//! (reading from the lower tier only the uncovered edges of a part it covers partly), so it
//! costs an SSD write, not a read of the slow tier; a read that needs a part the slot lacks
//! lays the slot's parts over the lower tier's bytes, and the write-back completes the slot
//! before it marks it clean (so a clean slot holds its whole chunk).
//!
//! SSD layout and its upgrade from the first format: `layout.rs`. Which lower tier the SSD
//! caches, and what happens when it is opened over another one: `pairing.rs`. The state
//! requests and write-back share, and the steps on it every path takes: `shared.rs`. The
//! write paths: `writes.rs`; the write-back: `clean.rs`. The device's reads, writes,
//! counters and close: `device.rs`; its opening and recovery: `open.rs`. Its modes:
//! `mode.rs`; its counters as reported: `stats.rs`. Each file imports only files before
//! it in this order: the leaves (`parts.rs`, `lower_writes.rs`, `requests.rs`, `mode.rs`,
//! `stats.rs`), `layout.rs`, `shared.rs`, `writes.rs` and `clean.rs`, `device.rs`,
//! `open.rs`.
//!
//! Invariants:
//! - A lower chunk is in at most one slot, on the device too: a slot is reused only after
//!   its entry says FREE durably.
//! - An entry names a chunk, or a part of it, only after the slot's bytes for it are
//!   durable, so a crash never pairs an entry with another chunk's bytes or with a part
//!   never written. A slot's newest entry is durable before the next change of it
//!   overwrites the other table copy, so a change that fails or is cut off leaves the
//!   newest entry, never an older one that may name the slot's previous chunk; and
//!   nothing is written to the SSD once a write or sync of it failed.
//! - The lower tier's bytes of a part the slot does not hold are current: every write to a
//!   cached chunk lands in its slot (or, in write-through, drops a clean slot first).
//! - Bytes read from the lower tier without a lock (a promotion, the edges of a write
//!   taking a new slot, the parts the write-back completes) go into a slot only if no
//!   write to the lower tier of the chunk was in flight when they were read or began
//!   since (`lower_writes.rs`); such a write counts itself before it looks for the slot,
//!   so it either spoils that check or finds the slot.
//! - A slot's entry says DIRTY durably before its data changes for a write (so a CLEAN
//!   slot's parts equal the lower tier's); it says CLEAN only after the parts it holds,
//!   read under the slot's lock and synced on the SSD, were written to the lower tier and
//!   synced, and no write into the slot began since (every write into a slot is counted
//!   first, whichever path it takes). The write-back makes a dirty slot whole first, so
//!   clean slots hold their whole chunk.
//! - Dirty slots are never evicted; when no clean slot is left, a write goes to the lower
//!   tier directly (write-through for that write). Such a write is acknowledged only once
//!   the FREE entry that dropped the chunk's last slot is durable, and never after the SSD
//!   failed: an entry that named the chunk could otherwise come back after a power cut
//!   with older bytes.
//! - Entries change under the state lock, so they change in the order memory sees.
//!
//! - SSD syncs run one at a time, and none succeeds once a write or sync of the SSD
//!   failed: a failed sync may drop writes of other requests that their own later syncs
//!   would report as done. Callers waiting meanwhile share the next sync
//!   (`fastdev::StickyFailure`).
//!
//! Crash semantics: every acknowledged write survives a power cut of both devices; after
//! a crash the slot table is read back and the parts it names are served from the SSD
//! (dirty ones are written back), everything else from the lower tier: nothing stale is
//! served. An unacknowledged write leaves each sector old or new.
//!
//! Why fixed slots and not ReHypar: the engine asks for whole chunks, so every allocation
//! has the same size and there is nothing for ReHypar's partitioning to do (it shines on a
//! file cache with varied sizes; `dhrd-bench rehypar` measures it there).
//!
//! [`Durable`]: dhrd_io::Durable

mod clean;
mod device;
mod layout;
mod lower_writes;
mod mode;
mod open;
mod parts;
mod requests;
mod shared;
mod stats;
mod writes;

pub use device::{SsdTier, Tiered};
pub use layout::{ENTRY_BYTES, HEADER_BYTES};
pub use mode::{SlotSync, TierMode};
pub use open::{open_ssd_file, ssd_bytes_for, SSD_TIER_THREADS};
pub use stats::TierStats;

#[cfg(test)]
mod pairing_tests;
#[cfg(test)]
mod races;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
