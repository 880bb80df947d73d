//! dhrd-pagecache: the RAM tier when it is the kernel's page cache of plain files, not
//! memory dhrd owns. Both frontends that keep files in RAM this way use it: the FUSE
//! mount's page cache path (the backing files) and `dhrd attach` (the files of a directory
//! in place).
//!
//! - `sys`: single system calls on the kernel's state of one file: what its page cache
//!   holds (`cachestat`), its size and link count, the inode's sync flag (`FS_SYNC_FL`).
//! - `resident`: the residency policy, in one place for every frontend (SPEC A4): warm
//!   files into the page cache in the background, demanded files first, and pin what was
//!   warmed within a `RamBudget`.
//! - `reaper`: drops whose last reference may free a deleted inode (a journal commit with
//!   the sync flag), off the threads that serve requests.
//!
//! It knows nothing of FUSE or of the engine's objects; the engine knows nothing of page
//! caches it does not own. Both charge one `dhrd_io::RamBudget`.

pub mod reaper;
pub mod resident;
pub mod sys;

pub use sys::{
    cachestat, double_sysctl, file_size, inode_flags, link_count, probe_sync_flag, read_sysctl,
    set_inode_flags, set_sync_flag, sync_flag, CacheStat, CacheStatSource, SysctlRaise,
    FS_DIRSYNC_FL, FS_SYNC_FL, SYNC_MARK_XATTR,
};
