//! The crate's one error type. Allocation failures are not errors: they are
//! [`crate::AllocOutcome`] values, because running out of fast-tier space is an expected
//! outcome the caller handles by going to the slow tier.

use crate::space::{BlockAddr, BlockCount};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    /// `free` was given something that is not a live allocation (never allocated, freed
    /// already, or a different length). Nothing changed.
    #[error("{len} at {start} is not a live allocation")]
    NotAllocated { start: BlockAddr, len: BlockCount },
    /// A consistency check failed; the allocator's state is wrong (a bug).
    #[error("invariant violated: {0}")]
    Invariant(String),
}

impl Error {
    pub(crate) fn invariant(what: String) -> Self {
        Error::Invariant(what)
    }
}
