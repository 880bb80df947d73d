//! How many files may be pinned at once. Each pin is one mapping (`mlock` needs one), and
//! a process may hold at most `vm.max_map_count` mappings (65,530 by default): without
//! more, pinning stops near 49,000 files, whatever the budget allows.
//!
//! Why raise the limit rather than pin less (measured here, 2026-11-28, 131,072 files of
//! 4 KiB on ext4): a mapping costs the kernel one `vm_area_struct` (192 bytes) and a
//! share of a maple tree node and a page table, about 200 bytes per pinned file, 5% of a
//! 4 KiB file and less for larger ones; the file's own inode and dentry, which any way of
//! keeping its pages cached keeps in memory too, cost about 1.1 KiB. Pinning all 131,072
//! took 17 s with the limit raised. A cgroup v2 `memory.min` would protect page cache
//! without a mapping per file, but only pages charged to that cgroup (pages written by
//! applications are charged to theirs) and only under the v2 memory controller, which this
//! machine does not run; warming without pinning leaves the files evictable, which is what
//! pinning is for. So, as root, the limit is raised when the pins reach it (logged once,
//! with the old value, never lowered: other processes may rely on it by then), up to what
//! the RAM budget could ever pin plus the reserve for the rest of the process.
//!
//! Invariants: `max` only grows; it is `vm.max_map_count - MAP_COUNT_RESERVE` of the
//! moment (or the configured fixed limit, never raised). A raise writes the sysctl once
//! per doubling, under its own lock, never under the warm-up's queue lock.
//!
//! Crash semantics: the sysctl stays raised after the process exits.

use crate::sys::SysctlRaise;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Mappings left to the rest of the process when the pin limit is derived from
/// `vm.max_map_count`.
pub const MAP_COUNT_RESERVE: usize = 16 * 1024;
/// `vm.max_map_count` assumed when /proc cannot be read (the kernel's default).
pub const MAX_MAP_COUNT_DEFAULT: usize = 65_530;

/// The sysctl of the per-process mapping limit.
pub const MAX_MAP_COUNT_SYSCTL: &str = "/proc/sys/vm/max_map_count";
/// Highest value dhrd raises `vm.max_map_count` to (about 800 MiB of kernel memory if every
/// mapping were used).
pub const MAX_MAP_COUNT_RAISE_MAX: usize = 1 << 22;

/// Where the limit on pins comes from.
#[derive(Debug, Clone)]
pub enum PinLimit {
    /// A fixed number of pins (tests, or a caller that chose one).
    Fixed(usize),
    /// The sysctl at `path`, less the reserve; `raise`: write a higher value when the pins
    /// reach it (needs root).
    Sysctl { path: PathBuf, raise: bool },
}

impl Default for PinLimit {
    fn default() -> Self {
        PinLimit::Sysctl {
            path: PathBuf::from(MAX_MAP_COUNT_SYSCTL),
            raise: true,
        }
    }
}

/// What happened to the sysctl, for status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapCountNote {
    /// The value before dhrd first raised it, and now.
    pub raised: Option<(u64, u64)>,
    /// Why a raise was refused (first cause only).
    pub refused: Option<String>,
}

pub(super) struct MapCount {
    limit: PinLimit,
    max: AtomicUsize,
    note: Mutex<MapCountNote>,
}

impl MapCount {
    pub(super) fn new(limit: PinLimit) -> Self {
        let max = match &limit {
            PinLimit::Fixed(n) => *n,
            PinLimit::Sysctl { path, .. } => crate::sys::read_sysctl(path)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(MAX_MAP_COUNT_DEFAULT)
                .saturating_sub(MAP_COUNT_RESERVE),
        };
        Self {
            limit,
            max: AtomicUsize::new(max),
            note: Mutex::new(MapCountNote::default()),
        }
    }

    /// Pins allowed now.
    pub(super) fn max(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    pub(super) fn note(&self) -> MapCountNote {
        self.note.lock().clone()
    }

    /// `pinned` pins are held and one more is wanted: raises the limit if it is reached
    /// and may be raised. `pins_possible`: the most pins the budget could ever need (one
    /// page each), so the sysctl never grows past what could be used.
    pub(super) fn make_room(&self, pinned: usize, pins_possible: usize) {
        if pinned < self.max() {
            return;
        }
        let PinLimit::Sysctl { path, raise: true } = &self.limit else {
            return;
        };
        let mut note = self.note.lock();
        if note.refused.is_some() || pinned < self.max() {
            return;
        }
        let ceiling = pins_possible
            .saturating_add(MAP_COUNT_RESERVE)
            .min(MAX_MAP_COUNT_RAISE_MAX);
        let room = |n: u64| {
            usize::try_from(n)
                .unwrap_or(usize::MAX)
                .saturating_sub(MAP_COUNT_RESERVE)
        };
        match crate::sys::double_sysctl(path, u64::try_from(ceiling).unwrap_or(u64::MAX)) {
            Ok(SysctlRaise::AtCeiling { now }) => {
                // Someone raised it meanwhile, or the ceiling is reached: take what it is.
                self.max.fetch_max(room(now), Ordering::AcqRel);
            }
            Ok(SysctlRaise::Raised {
                from: current,
                to: want,
            }) => {
                let from = note.raised.map_or(current, |(from, _)| from);
                note.raised = Some((from, want));
                eprintln!(
                    "dhrd: raised vm.max_map_count from {current} to {want}: each pinned file \
                     takes a mapping (about 200 bytes of kernel memory); the value before dhrd \
                     raised it was {from}"
                );
                self.max.fetch_max(room(want), Ordering::AcqRel);
            }
            Err(e) => {
                note.refused = Some(format!(
                    "vm.max_map_count could not be raised (ceiling {ceiling}): {e}"
                ));
            }
        }
    }
}
