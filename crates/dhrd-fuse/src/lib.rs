//! FUSE frontend of dhrd: presents a backing directory as a file system whose files are
//! served from RAM and written through to the backing directory before each write returns.
//!
//! Layers: `sys` (confined access to the backing directory), `config` (mount options),
//! `fs` (state shared by the handlers, and what metadata and data requests share), `meta`
//! (namespace, listings, xattrs), `data` (open files, on one of two data paths:
//! `page_tier`, the backing files' page cache served by the kernel through passthrough,
//! the default; `engine_tier` with `objects`, the engine's RAM copy per file over
//! `dhrd_io::FileBacking`), `adapter` (the fuser adapter), `nodes` (inode table), `failures` (sticky sync failures), `killpriv` (which set-id
//! bits a change must drop), `walk` (background warm-up), `daemon` (mount, control
//! socket, signals), `status`, `stats`. See docs/fuse.md for the user-visible rules.

pub mod adapter;
pub mod commit;
pub mod config;
pub mod daemon;
pub mod data;
pub mod engine_tier;
pub mod error;
pub mod failures;
pub mod fs;
pub mod killpriv;
pub mod meta;
pub mod nodes;
pub mod objects;
pub mod page_tier;
pub mod stats;
pub mod status;
pub mod sys;
pub mod walk;

pub use config::{FsConfig, ReadPath, ReaddirPlus};
pub use daemon::{control_request, default_mem_bytes, run, umount, MountConfig};
pub use error::{FsError, Result};

#[cfg(test)]
mod core_tests;
