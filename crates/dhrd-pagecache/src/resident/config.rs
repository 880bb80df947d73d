//! How a [`Resident`](super::Resident) runs and what it is handed: its bounds, its
//! configuration, the files the tree walk finds and how they are opened again.
//!
//! Invariants: none of its own; every bound the warm-up keeps is named here. Crash
//! semantics: none (configuration).

use super::mapcount::PinLimit;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Warm-up threads by default (measured: 4 threads read 4 GiB of files in 1.6 s, one
/// thread in 2.0-2.8 s, on a 2-vCPU VM with a virtio disk).
pub const RESIDENT_THREADS_DEFAULT: usize = 4;
/// Most warm-up threads.
pub const RESIDENT_THREADS_MAX: usize = 64;
/// Bytes one warm-up read asks for.
pub const WARM_READ_BYTES: usize = 1 << 20;
/// Bytes one populating call of a mapping asks for (`populate.rs`): one 2 MiB folio, the
/// size each fault of the advised mapping reads. Ranges this long or shorter are read.
pub const WARM_POPULATE_BYTES: u64 = 2 << 20;
/// A file is cut into segments of this size for the warm-up threads, so one large file is
/// read by all of them at once.
pub const WARM_SEGMENT_BYTES: u64 = 64 << 20;
/// Files the tree walk may have queued before `submit_walked` blocks (the walk runs ahead
/// of the warm-up by at most this many files, which bounds its memory).
pub const WALK_QUEUE_MAX: usize = 1024;
/// Demanded files queued at once. Each holds a descriptor until its turn, so a storm of
/// opens (a file server creating thousands of files a second) cannot exhaust the
/// process's descriptors; a demand past the bound is dropped and counted, and the file is
/// demanded again at its next open.
pub const DEMAND_QUEUE_MAX: usize = 1024;
/// Nice value of the warm-up threads: background work yields to foreground requests.
pub const RESIDENT_NICE: i32 = 10;
/// How long a file that changed size waits before it is warmed and pinned again. A file
/// written, appended to or deleted within this time is pinned once, or never: on two CPUs
/// an `mlock` per write-and-close of a small file cost the fileserver workload a third of
/// its rate. Its pages are in the page cache meanwhile (the writes went through it), only
/// not locked.
pub const REFRESH_DELAY: Duration = Duration::from_secs(5);

/// How many times a file whose warm-up read failed (EIO from the device) is read again
/// before it is left to the device: a device's read errors may pass (a path that failed
/// over, a transport reset), and a file left out after one would stay out of RAM until
/// it is written. The n-th retry waits `refresh_delay` x `READ_RETRY_BACKOFF`^(n-1):
/// 5, 20 and 80 s by default, so a bad block costs the device three more reads.
pub const READ_RETRIES_MAX: u32 = 3;
pub const READ_RETRY_BACKOFF: u32 = 4;

/// The size of the page-cache folios the warm-up's reads leave, which the kernel keeps for
/// the pages' life in the cache. Large folios (what sequential reads make, up to 2 MiB)
/// serve reads faster, but small synchronous buffered writes pay for them: the file system
/// walks every block of the folio when it prepares a write and when it writes the folio
/// back (docs/fuse.md, "Large folios"). Measured with the pin's mapping on them, eight
/// writers of one file under the sync flag ran at 0.4-0.56x raw O_DIRECT|O_DSYNC, and at
/// 2-3x that rate on the same pages once the daemon (and its mapping) was gone or with
/// order-0 pages pinned (docs/attach.md). Order-0 pages come from reading through a
/// descriptor advised `POSIX_FADV_RANDOM`, which keeps each read one large I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folios {
    /// Large folios, for read-mostly data or where writes reach the disk in bulk (at
    /// fsync, by writeback): 2 MiB ones from a mapping advised for huge pages for a range
    /// longer than one (`populate.rs`, which also keeps the warm-up's reads at the disk
    /// short), the kernel's choice for sequential reads below that.
    Large,
    /// One page per folio: where every small write is synchronous.
    Order0,
}

/// How a [`Resident`](super::handle::Resident) runs.
#[derive(Debug, Clone)]
pub struct ResidentConfig {
    pub threads: usize,
    /// `mlock` what is warmed (within the budget); without it files are only read in.
    pub pin: bool,
    /// Cap on the warm-up's read rate (bytes/s).
    pub rate_bytes_per_s: Option<u64>,
    /// Most files pinned at once (one mapping each): see [`PinLimit`].
    pub pin_limit: PinLimit,
    /// Most demanded files queued, and most refreshed files waiting (see
    /// [`DEMAND_QUEUE_MAX`]).
    pub demand_queue_max: usize,
    /// See [`REFRESH_DELAY`].
    pub refresh_delay: Duration,
    /// Where pins and descriptors of files that went are dropped (the last unmapping of a
    /// deleted file may free its inode synchronously); None: on the calling thread, after
    /// the queue lock is released.
    pub reaper: Option<crate::reaper::Reaper>,
    /// What folios the warm-up's reads leave (see [`Folios`]).
    pub folios: Folios,
}

impl Default for ResidentConfig {
    fn default() -> Self {
        Self {
            threads: RESIDENT_THREADS_DEFAULT,
            pin: true,
            rate_bytes_per_s: None,
            pin_limit: PinLimit::default(),
            demand_queue_max: DEMAND_QUEUE_MAX,
            refresh_delay: REFRESH_DELAY,
            reaper: None,
            folios: Folios::Large,
        }
    }
}

/// A file the tree walk found: an opaque key (the backing inode number) and how the
/// [`Opener`] finds it again.
#[derive(Debug, Clone)]
pub struct FileRef {
    pub key: u64,
    pub path: PathBuf,
}

/// Opens walked files for reading when their turn comes (the walk does not keep a
/// descriptor per queued file). Must check the file is still the one walked (`key`), and
/// open with O_NOATIME where allowed (`sys::open_noatime`): the warm-up's reads and the
/// pin's `mmap` go through the description it returns.
pub trait Opener: Send + Sync + 'static {
    fn open(&self, f: &FileRef) -> io::Result<File>;
}
