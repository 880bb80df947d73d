//! The engine's one error type. Every variant maps to an errno for the frontends.

use std::fmt;
use std::io;
use std::time::SystemTime;

/// Which backing operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackingOp {
    Read,
    Write,
    Sync,
    SetLen,
    Zero,
    Len,
}

impl fmt::Display for BackingOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackingOp::Read => "read",
            BackingOp::Write => "write",
            BackingOp::Sync => "sync",
            BackingOp::SetLen => "set_len",
            BackingOp::Zero => "zero_range",
            BackingOp::Len => "len",
        })
    }
}

/// Why an object turned read-only (C4). Kept for status output forever after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureCause {
    pub op: BackingOp,
    pub errno: Option<i32>,
    pub message: String,
    pub at: SystemTime,
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        write!(
            f,
            "backing {} failed: {} (unix time {secs})",
            self.op, self.message
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Sticky: a backing write or sync failed earlier; writes are refused from then on.
    #[error("read-only after a backing failure: {0}")]
    ReadOnly(FailureCause),
    /// The backing is full (C5). This request failed; the object stays writable.
    #[error("backing is full (ENOSPC)")]
    NoSpace,
    /// A backing operation failed for this request.
    #[error("backing {op} failed: {source}")]
    Backing {
        op: BackingOp,
        #[source]
        source: io::Error,
    },
    #[error("request at offset {offset} length {len} is outside the object of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("size {requested} exceeds the maximum of {max} bytes")]
    TooLarge { requested: u64, max: u64 },
    /// Creating or growing the RAM tier failed (memfd, mmap, mlock).
    #[error("RAM tier: {0}")]
    Ram(#[source] io::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The object was opened read-only.
    #[error("object is opened read-only")]
    ReadOnlyOpen,
}

impl Error {
    /// The errno a frontend should return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::ReadOnly(_) => libc::EIO,
            Error::NoSpace => libc::ENOSPC,
            Error::Backing { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::OutOfRange { .. } => libc::EINVAL,
            Error::TooLarge { .. } => libc::EFBIG,
            Error::Ram(e) => e.raw_os_error().unwrap_or(libc::ENOMEM),
            Error::Config(_) => libc::EINVAL,
            Error::ReadOnlyOpen => libc::EROFS,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}
