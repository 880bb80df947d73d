//! Page-cache residency: the RAM tier when it is the kernel's page cache of the backing
//! files themselves (the FUSE mount's default data path), not memory of our own.
//!
//! A [`Resident`] warms files into the page cache in the background, files that
//! applications open first ("demand"), then the files a walk of the tree hands in, and pins
//! what it warmed within a RAM budget: each pinned file is mapped read-only and `mlock`ed,
//! so the kernel cannot evict its pages. Files, or the part of a file, past the budget are
//! neither read nor pinned and are served from the device (SPEC I11, reported). Large
//! files are cut into segments that several threads read at once.
//!
//! Why the page cache and why these mechanisms (measured, docs/fuse.md): reads through the
//! kernel from the backing file's page cache need no daemon and keep one copy of the data;
//! plain `pread` of 1 MiB into a scratch buffer by 4 threads warmed 4 GiB in 1.6 s against
//! 2.2-3.1 s for `vmtouch -t`; `mlock` of a mapping of cached pages pins them without
//! reading again. A mapping per pinned file costs one entry of the process's map count:
//! as root the limit is raised when the pins reach it (`mapcount.rs`, which says why);
//! past it, files stay warm but evictable (reported).
//!
//! The files, each importing only those listed before it: `changed.rs` (written files
//! waiting for their pin, and the rate they are handed on at), `pin.rs` (one pinned mapping),
//! `mapcount.rs` (how many pins may exist), `stats.rs` (the counters as reported),
//! `config.rs` (bounds and configuration), `state.rs` (entries, queues, counters),
//! `finish.rs` (pinning and recording a warmed file), `warmup.rs` (the threads reading
//! files in), `handle.rs` (the [`Resident`] and its life), `demand.rs` (demand, refresh
//! and forget of single files).
//!
//! Invariants:
//! - Every byte counted as pinned is reserved in the [`RamBudget`]; a file's reservation
//!   is released when it is forgotten (unlinked), shrinks or the `Resident` is dropped.
//! - A file is warmed at most once unless it changes size (`refresh`); its entry stays
//!   until `forget`, so the walk reaching a file an application already opened reads
//!   nothing again, and a demand of a file the walk queued but has not started moves that
//!   job to the demand queue (the same file, warmed once).
//! - The warm-up is complete only when no file is queued, being opened, read, or being
//!   pinned and recorded: after `wait_complete` every file has its final entry.
//! - An empty file is recorded at once, without a worker; it is warmed when it grows.
//! - A file is never warmed or pinned after it lost its last name: a demand (or refresh)
//!   that races the unlink and its `forget` looks at the link count after its entry is in
//!   (or leaves that to its caller, `demand_unchecked`) and forgets the file itself if the
//!   count is 0.
//! - A file that changed size (`refresh`) gives back its reservation and pin at once and
//!   is warmed and pinned again after `refresh_delay` ([`REFRESH_DELAY`]), unless it is
//!   forgotten first; its entry is `Busy` meanwhile. A file that changes size while it is
//!   being warmed (refreshed while `Busy`, or found shorter than it was sized when its
//!   warm-up ends) is not pinned or recorded at the old size: its reservation goes back
//!   and it is warmed again, the same way. Nothing stops a truncate between that check
//!   and the `mlock`; an mlock that then fails because the mapping reaches past EOF is
//!   told from a memlock limit by the file's size, and only the limit stops pinning.
//! - `files_warmed` counts files whose current entry is a finished warm-up: a refresh
//!   takes a file out of it until it is warmed again, so it never exceeds `files_seen`.
//! - This module only ever reads files; warming never changes what a reader sees, since the
//!   page cache is the one copy every reader and writer goes through (D3 by construction).
//!   Writes racing a warm-up are the page cache's business: a warm-up read sees old or new
//!   bytes and throws them away.
//!
//! Crash semantics: none of its own. After the process dies its pins vanish with its
//! mappings, but the pages stay cached until the kernel needs the memory, so a new
//! instance finds them warm and pins them again without reading the device.
//!
//! [`RamBudget`]: dhrd_io::RamBudget

mod changed;
mod config;
mod demand;
mod finish;
mod handle;
mod mapcount;
mod pin;
mod populate;
mod state;
mod stats;
mod warmup;

pub use changed::{
    Changed, CHANGED_DELAY, CHANGED_HANDOFFS_PER_S, CHANGED_HANDOFF_BURST, CHANGED_MAX,
};
pub use config::{
    FileRef, Folios, Opener, ResidentConfig, DEMAND_QUEUE_MAX, REFRESH_DELAY, RESIDENT_NICE,
    RESIDENT_THREADS_DEFAULT, RESIDENT_THREADS_MAX, WALK_QUEUE_MAX, WARM_READ_BYTES,
    WARM_SEGMENT_BYTES,
};
pub use handle::Resident;
pub use mapcount::{
    MapCountNote, PinLimit, MAP_COUNT_RESERVE, MAX_MAP_COUNT_DEFAULT, MAX_MAP_COUNT_RAISE_MAX,
    MAX_MAP_COUNT_SYSCTL,
};
pub use stats::ResidentStats;

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

/// Bytes of `file` the page cache holds (for tests and status of single files).
pub fn cached_bytes(file: &File) -> io::Result<u64> {
    let (st, _) = crate::sys::cachestat(file.as_fd(), 0, 0)?;
    Ok(st.cached_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests;
