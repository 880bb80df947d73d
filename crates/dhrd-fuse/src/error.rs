//! The one error type of the FUSE frontend.
//!
//! Invariant: every failure that reaches a FUSE reply is turned into an errno by
//! [`FsError::errno`]; no I/O error is ever swallowed or replaced by success. Errors that
//! happen while setting up a mount carry a human-readable message for the command line.

use std::io;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// A system call on the backing directory failed.
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: io::Error,
    },
    /// The engine refused or failed a data operation.
    #[error(transparent)]
    Engine(#[from] dhrd_engine::Error),
    /// The inode's backing entry is gone or was replaced behind the daemon's back.
    #[error("stale inode: the backing entry was removed or replaced")]
    Stale,
    /// Bad command-line input or an unusable environment; the message says what to fix.
    #[error("{0}")]
    Setup(String),
    /// A plain errno without more context (e.g. an operation this file type lacks).
    #[error("errno {0}")]
    Errno(i32),
}

pub type Result<T> = std::result::Result<T, FsError>;

impl FsError {
    /// The errno reported to the kernel for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            FsError::Engine(e) => e.errno(),
            FsError::Stale => libc::ESTALE,
            FsError::Setup(_) => libc::EINVAL,
            FsError::Errno(e) => *e,
        }
    }

    pub(crate) fn io(context: &'static str, source: io::Error) -> Self {
        FsError::Io { context, source }
    }
}

impl From<rustix::io::Errno> for FsError {
    fn from(e: rustix::io::Errno) -> Self {
        FsError::Io {
            context: "backing",
            source: e.into(),
        }
    }
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> Self {
        FsError::Io {
            context: "backing",
            source: e,
        }
    }
}
