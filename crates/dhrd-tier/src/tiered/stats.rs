//! The tiered device's counters as `Tiered::stats` reports them.
//!
//! Invariants: a snapshot, serialised under the names of `dhrd nbd`'s status file.
//! Crash semantics: none; the counters live in memory and start again at open.

/// Tier statistics, serialised under the names of `dhrd nbd`'s status file (docs/nbd.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    pub slots: u64,
    pub slots_used: u64,
    pub slots_dirty: u64,
    /// Chunk reads served by the SSD and by the lower tier.
    #[serde(rename = "chunk_reads_ssd")]
    pub reads_ssd: u64,
    #[serde(rename = "chunk_reads_lower")]
    pub reads_lower: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub written_back: u64,
    pub writeback_failures: u64,
    /// Writes sent to the lower tier because no clean slot could be had.
    pub writes_bypassed: u64,
    pub dirty_at_open: u64,
    /// Writes that took a slot without reading the rest of the chunk from the lower tier.
    pub partial_fills: u64,
    /// Slots holding some parts that the write-back completed from the lower tier.
    pub completions: u64,
    /// Dirty chunks of a first-format SSD written back when it was upgraded at open.
    pub upgraded_dirty: u64,
    /// Clean chunks dropped at open because the SSD was made for another lower tier, or
    /// the lower tier changed while the SSD was detached (`pairing.rs`).
    pub dropped_at_open: u64,
    /// Dirty chunks kept at open in such a case because the opener adopted them.
    pub adopted_dirty: u64,
    /// Read requests served by the SSD alone, and those that read the lower tier
    /// (`requests.rs`): the cache tier's hit share as the device sees it.
    pub read_requests_ssd: u64,
    pub read_requests_lower: u64,
    /// Write requests served by the SSD alone, and those that read or wrote the lower
    /// tier (edges of a part filled from there, a bypass, write-through).
    pub write_requests_ssd: u64,
    pub write_requests_lower: u64,
}
