//! The facts both forms of `dhrd status` show: load progress, the page cache of open
//! files, the data path's name, what takes no more writes.
//!
//! RAM on the page cache path: pinned bytes are exact (locked pages cannot be evicted);
//! the page cache of open files is sampled with cachestat(2) (mincore on older kernels)
//! when status is asked for. Reads served by passthrough never reach the daemon, so hits
//! are not counted per read.
//!
//! No state of its own and no crash semantics.

use crate::data::Tier;
use crate::mount::Mount;
use dhrd_io::Durable as _;
use dhrd_pagecache::{self as pagecache, CacheStat};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

pub use dhrd_io::human_bytes as human;

/// Load progress over the whole mount, either data path.
#[derive(Debug, Clone, Default)]
pub struct LoadTotals {
    /// Bytes in RAM (pinned, or warmed without pinning; engine: loaded chunks).
    pub loaded: u64,
    /// Bytes of the files found so far (engine: of the objects in the cache).
    pub total: u64,
    /// Nothing more will load by itself.
    pub complete: bool,
    /// Bytes left on the device because the budget is full (I11).
    pub over_budget: u64,
}

impl LoadTotals {
    /// Share of the found bytes in RAM, at most 1 (pinned bytes are whole pages).
    pub fn fraction(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            (self.loaded as f64 / self.total as f64).min(1.0)
        }
    }
}

pub fn load_totals(sh: &Mount) -> LoadTotals {
    match sh.tier_if_set() {
        Some(Tier::Page(t)) => {
            let r = t.resident().stats();
            LoadTotals {
                loaded: if sh.cfg().pin {
                    r.bytes_pinned
                } else {
                    r.bytes_warmed
                },
                total: r.bytes_seen,
                complete: r.complete,
                over_budget: r.bytes_over_budget,
            }
        }
        Some(Tier::Engine(t)) => {
            let mut l = LoadTotals {
                complete: true,
                ..LoadTotals::default()
            };
            for o in t.objects().snapshot() {
                let p = o.progress();
                l.over_budget += p.chunks_over_budget.saturating_mul(p.chunk_bytes);
                // Chunks in RAM, not bytes copied by the loader: writes also fill chunks.
                l.loaded += ((p.fraction() * p.bytes_total as f64) as u64).min(p.bytes_total);
                l.total += p.bytes_total;
                // Settled: every chunk is loaded, or left on the backing for good (over the
                // RAM budget, or failed every retry); nothing more will load by itself.
                let settled =
                    p.chunks_loaded + p.chunks_over_budget + p.chunks_failed >= p.chunks_total;
                if !(o.is_fully_loaded() || settled) {
                    l.complete = false;
                }
            }
            // Complete only once the walk has found every file too.
            l.complete &= sh.preload().done.load(Ordering::Acquire) || !sh.cfg().preload;
            l
        }
        None => LoadTotals::default(),
    }
}

/// Page cache of the open files, summed (cachestat).
pub fn open_files_cache(sh: &Mount) -> Option<CacheStat> {
    let Some(Tier::Page(t)) = sh.tier_if_set() else {
        return None;
    };
    let mut sum = CacheStat::default();
    for f in t.open_files() {
        if let Ok((c, _)) = pagecache::cachestat(f.as_fd(), 0, 0) {
            sum.cached_pages += c.cached_pages;
            sum.dirty_pages += c.dirty_pages;
            sum.writeback_pages += c.writeback_pages;
            sum.evicted_pages += c.evicted_pages;
            sum.recently_evicted_pages += c.recently_evicted_pages;
        }
    }
    Some(sum)
}

/// The data path as one word for JSON and the read path line.
pub fn data_path(sh: &Mount) -> &'static str {
    match sh.tier_if_set() {
        Some(Tier::Page(_)) => "pagecache",
        Some(Tier::Engine(_)) => "engine",
        None => "starting",
    }
}

/// Files (or the whole backing) that take no more writes, with the cause.
pub fn read_only_causes(sh: &Mount) -> Vec<(String, String)> {
    // A sync that failed (failures.rs): files or the whole backing take no more syncs.
    let recorded = sh
        .committer()
        .failures()
        .first_failure()
        .map(|(f, inodes)| (failed_where(f.inode, inodes), f.what));
    let mut causes: Vec<(String, String)> = match sh.tier_if_set() {
        Some(Tier::Page(t)) => recorded
            .clone()
            .or_else(|| {
                t.health(sh.dir().root_fd())
                    .map(|c| (WHOLE_BACKING.to_string(), c))
            })
            .into_iter()
            .collect(),
        Some(Tier::Engine(t)) => t
            .objects()
            .snapshot()
            .iter()
            .filter_map(|o| {
                o.failure()
                    .map(|c| (o.backing().describe().to_string(), c.to_string()))
            })
            .collect(),
        None => Vec::new(),
    };
    if causes.is_empty() {
        causes.extend(recorded);
    }
    causes
}

/// Where a failure holds when it is the whole backing's.
const WHOLE_BACKING: &str = "the backing file system";

/// What a recorded failure stops: one file (the backing's inode number, which `find -inum`
/// turns into a path; the record keeps none), or the whole backing.
fn failed_where(inode: Option<(u64, u64)>, inodes: usize) -> String {
    match inode {
        Some((_, ino)) if inodes > 1 => {
            format!("backing inode {ino} and {} other file(s)", inodes - 1)
        }
        Some((_, ino)) => format!("backing inode {ino} (that file only)"),
        None => WHOLE_BACKING.to_string(),
    }
}

pub fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
