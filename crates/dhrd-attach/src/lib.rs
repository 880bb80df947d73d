//! dhrd-attach: `dhrd attach DIR`, the in-place mode. Applications use DIR itself and the
//! kernel serves every read, write and metadata call on it; the daemon keeps the files'
//! own page cache warm and pinned (the residency policy of `dhrd-pagecache`, the one the
//! FUSE mount uses), keeps the durability mode, and reports. It is never in the data
//! path: its death fails and blocks no application call, and a new daemon pins again
//! what the page cache still holds without reading the device (SPEC A1-A4).
//!
//! Layers, bottom up: `handle` (file handles, the warm-up's keys), `fanotify` (the event
//! group), `mountinfo`, `holders` (who else serves a directory), `record` (what dhrd
//! changed, on the directory), `syncmount` and `flags` (the two ways `sync` is kept),
//! `tree` (confined walks), `check` (everything checked before a change), `dirs` (the
//! tree's directories as the watch keeps them), `watch` (the events and what they
//! cause), `attached` (attach and detach), `status`, `control` (the socket and its
//! client), `daemon` (threads, signals). See docs/attach.md.

pub mod attached;
pub mod check;
pub mod control;
pub mod daemon;
pub mod dirs;
pub mod error;
pub mod fanotify;
pub mod flags;
pub mod handle;
pub mod holders;
pub mod mountinfo;
pub mod record;
pub mod status;
pub mod syncmount;
pub mod tree;
pub mod watch;

pub use attached::AttachConfig;
pub use control::{detach, is_attached, request};
pub use daemon::run;
pub use error::{AttachError, Result};

/// Physical memory in bytes (for the default budget: half of it, as the mount's).
pub fn default_mem_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64) / 2
}
