//! The one error type of the NBD crate.
//!
//! Invariant: every error that can reach a client as an NBD error value goes through
//! [`NbdError::errno`] and then [`crate::proto::wire_errno`], so the mapping from engine
//! failures (SPEC C4/C5) to protocol errors lives in one place.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("bad magic {found:#x}, expected {expected:#x}")]
    BadMagic { expected: u64, found: u64 },
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    PayloadTooLarge { len: u64, max: u64 },
    #[error("engine: {0}")]
    Engine(#[from] dhrd_engine::Error),
    #[error("operation failed with errno {0}")]
    Errno(i32),
    #[error("configuration: {0}")]
    Config(String),
    #[error("TLS: {0}")]
    Tls(String),
}

impl NbdError {
    /// Host errno describing this error, for an NBD error reply.
    pub fn errno(&self) -> i32 {
        match self {
            NbdError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            NbdError::Engine(e) => e.errno(),
            NbdError::Errno(n) => *n,
            NbdError::PayloadTooLarge { .. } => libc::EINVAL,
            NbdError::Protocol(_) | NbdError::BadMagic { .. } | NbdError::Config(_) => libc::EINVAL,
            NbdError::Tls(_) => libc::EACCES,
        }
    }
}
