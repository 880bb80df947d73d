//! FUSE frontend of dhrd: presents a backing directory as a file system whose files are
//! served from RAM and written through to the backing directory before each write returns.
//!
//! Modules: `sys` (confined access to the backing directory), `config` (mount options),
//! `mount` (the state shared by the handlers, and the background walk), `meta` (namespace,
//! listings, xattrs, and the node table), `data` (open files, on one of two data paths:
//! `page`, the backing files' page cache served by the kernel through passthrough, the
//! default; `engine`, the engine's RAM copy per file over `dhrd_io::FileBacking`),
//! `durable` (group commit of metadata, sticky sync failures), `adapter` (the fuser
//! adapter), `killpriv` (which set-id bits a change must drop), `daemon` (mount, control
//! socket, signals), `status`, `stats`. See docs/fuse.md for the user-visible rules.

pub mod adapter;
pub mod config;
pub mod daemon;
pub mod data;
pub mod durable;
pub mod engine;
pub mod error;
pub mod kernel;
pub mod killpriv;
pub mod meta;
pub mod mount;
pub mod page;
pub mod stats;
pub mod status;
pub mod sys;

pub use config::{FsConfig, ReadPath, ReaddirPlus};
pub use daemon::{control_request, default_mem_bytes, run, umount, MountConfig};
pub use error::{FsError, Result};
