//! The one error type of the stack builder: which layer failed to open, and why, with the
//! errno a C caller gets for it.

use std::io;

/// Why a stack did not open. Each variant names the layer; nothing above it was opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backing's name is not a valid `rbd:` spec.
    #[error("{0}")]
    RbdName(#[source] dhrd_rbd::RbdError),
    /// A file or block device backing could not be opened, sized or identified.
    #[error("{what} backing {name}: {source}")]
    File {
        what: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
    /// An RBD image could not be opened or sized.
    #[error("opening backing {spec}: {source}")]
    Rbd {
        spec: String,
        #[source]
        source: dhrd_rbd::RbdError,
    },
    /// A fixed-size object over an empty backing would serve nothing.
    #[error("{name} is empty")]
    Empty { name: String },
    /// The backing is marked as lacking data a cache this stack does not have holds, or
    /// the mark could not be read or removed (`dhrd_tier::pairing`).
    #[error("{0}")]
    Marked(#[source] io::Error),
    /// A fast layer takes writes: it cannot sit under a read-only object.
    #[error("{layer} takes writes; it cannot be combined with a read-only open")]
    ReadOnlyCache { layer: &'static str },
    /// The NVM file is on a file system held in RAM only, where an acknowledged write
    /// would not survive a power cut.
    #[error(
        "{path} is on tmpfs/ramfs, which loses its contents at power off: writes \
         acknowledged there would not be durable. Put it on persistent memory (a DAX mount)"
    )]
    Volatile { path: String },
    /// The NVM write-back layer or the SSD tier could not be opened.
    #[error("opening the {layer} on {path}: {source}")]
    Cache {
        layer: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The hybrid object could not be opened.
    #[error("opening the hybrid object: {0}")]
    Object(#[source] dhrd_engine::Error),
}

/// The stack builder's result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno value this error stands for (what the C API returns).
    pub fn errno(&self) -> i32 {
        match self {
            Error::RbdName(e) | Error::Rbd { source: e, .. } => e.errno(),
            Error::File { source, .. } | Error::Marked(source) => errno_of_io(source),
            Error::Empty { .. } | Error::ReadOnlyCache { .. } | Error::Volatile { .. } => {
                libc::EINVAL
            }
            // A cache that refuses its backing (another one's, dirty) says so without an
            // OS error: the caller's options are what is wrong.
            Error::Cache { source, .. } => match source.raw_os_error() {
                Some(n) => n,
                None if errno_of_io(source) == libc::EIO => libc::EINVAL,
                None => errno_of_io(source),
            },
            Error::Object(e) => e.errno(),
        }
    }
}

/// The errno of an I/O error: its OS error, or what its kind stands for (a backing in use
/// is `EBUSY`).
fn errno_of_io(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::ResourceBusy => libc::EBUSY,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => libc::EINVAL,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        _ => libc::EIO,
    })
}
