//! The one error type of `dhrd-attach`.
//!
//! `Refused` is what the checks before any change return: the input, the file system or
//! the system cannot have the directory attached in the mode asked for, and nothing was
//! changed. `Io` is a failure after attach began (or while detaching): the message says
//! what was being done. No state and no crash semantics of its own.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Refused before anything was changed; the message names what is missing and what
    /// to use instead.
    #[error("{0}")]
    Refused(String),
    /// A system call failed while attaching, serving or detaching.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl AttachError {
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        AttachError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, AttachError>;

/// Adds what was being done to an `io::Result`.
pub(crate) trait Context<T> {
    fn during(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for io::Result<T> {
    fn during(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| AttachError::io(what(), e))
    }
}
