//! FUSE frontend of dhrd: presents a backing directory as a file system whose regular files
//! are hybrid objects of the engine (RAM tier for reads, the backing file as durable copy).
//!
//! Layers: `sys` (confined access to the backing directory), `backing` (one backing file as
//! a `Durable`), `objects` (the per-file object cache), `nodes` (inode table), `fs` (the
//! request handlers), `killpriv` (which set-id bits a change must drop), `daemon` (mount,
//! control socket, signals), `stats`.
//! See docs/fuse.md for the user-visible rules.

pub mod backing;
pub mod daemon;
pub mod error;
pub mod fs;
pub mod killpriv;
pub mod nodes;
pub mod objects;
pub mod stats;
pub mod sys;

pub use daemon::{control_request, default_mem_bytes, run, umount, MountConfig};
pub use error::{FsError, Result};
pub use fs::{FsConfig, ReadPath};
