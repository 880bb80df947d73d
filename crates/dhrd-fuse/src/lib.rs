//! FUSE frontend of dhrd: presents a backing directory as a file system whose files are
//! served from RAM and written through to the backing directory before each write returns.
//! See docs/fuse.md for the user-visible rules.
//!
//! The layers, top down. A module imports only modules on lower floors, and files of its
//! own folder without a circle among them (`tests/layers.rs` checks both from the `use`
//! lines; fuser is named only in `adapter`):
//!
//! | floor | units | what |
//! |---|---|---|
//! | 9 | `daemon` | running a mount: checks, lock, control socket, signals, threads |
//! | 8 | `adapter`, `status` | the transport over /dev/fuse (fuser); what `dhrd status` shows |
//! | 7 | `mount` | the owner of a mount's state: requests in, replies out; the walk |
//! | 6 | `meta` | the namespace: nodes, names, attributes, listings, xattrs |
//! | 5 | `data` | the open files and the data path that serves them |
//! | 4 | `page`, `engine` | the page cache path (the default) and the engine path |
//! | 3 | `durable` | when a change is durable: the group commit, sticky failures |
//! | 2 | `sys` | confined access to the backing directory |
//! | 1 | `kernel`, `config`, `killpriv`, `error`, `stats` | request and reply types, options, set-id rules, the error, counters |
//!
//! A transport other than fuser goes beside `adapter`: it turns the kernel's requests into
//! calls on `mount::Mount` and its replies into the kernel's, in the types of `kernel`.

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
