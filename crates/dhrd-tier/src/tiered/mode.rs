//! How the tiered device is run: where writes go ([`TierMode`]) and when a write into a
//! slot is synced on the SSD ([`SlotSync`]).
//!
//! Invariants: none of their own; each variant says what it makes durable when.
//! Crash semantics: as each variant states; in every mode an acknowledged write survives
//! a power cut of both devices (the module header of `tiered`).

/// How writes reach the lower tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierMode {
    /// Durable on the SSD, written back later.
    #[default]
    WriteBack,
    /// Durable on the lower tier before the acknowledgement.
    WriteThrough,
}

impl std::str::FromStr for TierMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "writeback" => Ok(TierMode::WriteBack),
            "writethrough" => Ok(TierMode::WriteThrough),
            _ => Err(format!(
                "bad tier mode {s:?}: use writeback or writethrough"
            )),
        }
    }
}

impl std::fmt::Display for TierMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TierMode::WriteBack => "writeback",
            TierMode::WriteThrough => "writethrough",
        })
    }
}

/// When a write into a slot is synced on the SSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotSync {
    /// Before the write returns: every write is durable on return.
    #[default]
    EachWrite,
    /// At the next `sync` (a FLUSH): for an engine in `fsync` durability, whose writes
    /// need to be durable only at FLUSH. Only a write's last sync waits: the syncs that
    /// order a slot's bytes before the entry naming them, and a DIRTY entry before a
    /// CLEAN slot's bytes change, are made as always, so a power cut loses at most writes
    /// since the last sync and never leaves an entry naming bytes nobody wrote.
    AtFlush,
}
