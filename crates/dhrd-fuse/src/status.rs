//! What `dhrd status` shows: text for people and JSON with stable field names for
//! machines (`--json`, and the Prometheus text the CLI derives from it). Field names are
//! documented in docs/fuse.md and only ever added to.
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
use dhrd_pagecache::resident::ResidentStats;
use dhrd_pagecache::{self as pagecache, CacheStat};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;

pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

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
fn open_files_cache(sh: &Mount) -> Option<CacheStat> {
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
fn data_path(sh: &Mount) -> &'static str {
    match sh.tier_if_set() {
        Some(Tier::Page(_)) => "pagecache",
        Some(Tier::Engine(_)) => "engine",
        None => "starting",
    }
}

/// Files (or the whole backing) that take no more writes, with the cause.
fn read_only_causes(sh: &Mount) -> Vec<(String, String)> {
    // A sync that failed (failures.rs): files or the whole backing take no more syncs.
    let failed = sh.committer().failures().first();
    let mut causes: Vec<(String, String)> = match sh.tier_if_set() {
        Some(Tier::Page(t)) => failed
            .clone()
            .or_else(|| t.health(sh.dir().root_fd()))
            .map(|c| vec![("the backing file system".to_string(), c)])
            .unwrap_or_default(),
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
        if let Some(f) = failed {
            causes.push(("the backing file system".to_string(), f));
        }
    }
    causes
}

/// The text `dhrd status` prints.
pub fn status_text(sh: &Mount, mountpoint: &Path, backing: &Path) -> String {
    let mut s = String::new();
    let l = load_totals(sh);
    // Pinned bytes count whole pages, found bytes do not: capped at 100%.
    let pct = (l.fraction() * 100.0).min(100.0);
    let _ = writeln!(
        s,
        "mount:           {} (backing {})",
        mountpoint.display(),
        backing.display()
    );
    let _ = writeln!(s, "durability:      {}", sh.cfg().durability);
    let path_line = match sh.tier_if_set() {
        Some(Tier::Page(t)) => {
            let ps = t.stats();
            format!(
                "page cache of the backing files, served by the kernel (passthrough); sync flags set {}, cleared {}, refused {}",
                ps.sync_flags_set.load(Ordering::Relaxed),
                ps.sync_flags_cleared.load(Ordering::Relaxed),
                ps.sync_flag_failures.load(Ordering::Relaxed),
            )
        }
        Some(Tier::Engine(t)) => format!("engine RAM copy per file, read path {}", t.path()),
        None => "not chosen yet".to_string(),
    };
    let _ = writeln!(s, "data path:       {path_line}");
    if let Some(why) = sh.fallback().as_deref() {
        let _ = writeln!(s, "fallback:        not on the page cache: {why}");
    }
    let _ = writeln!(
        s,
        "negotiated:      passthrough: {}, mmap on direct opens: {}, killpriv_v2: {}, atomic O_TRUNC: {}",
        yes(sh.negotiated().passthrough),
        yes(sh.negotiated().mmap_on_direct),
        yes(sh.negotiated().killpriv_v2),
        yes(sh.negotiated().atomic_o_trunc)
    );
    match sh.tier_if_set() {
        Some(Tier::Page(t)) => {
            let r = t.resident().stats();
            let _ = writeln!(
                s,
                "warm-up:         {pct:.1}% in RAM ({} of {} found, {} of {} files), {}/s{}",
                human(l.loaded),
                human(l.total),
                r.files_warmed,
                r.files_seen,
                human(r.rate_bytes_per_s() as u64),
                match r.complete_after_s {
                    Some(t) if r.complete => format!(", complete after {t:.1} s"),
                    _ => String::new(),
                }
            );
            render_ram(&mut s, sh, &r);
            if let Some(c) = open_files_cache(sh) {
                let _ = writeln!(
                    s,
                    "open files:      {} inodes; page cache {}, dirty {}, under writeback {}",
                    t.open_inodes(),
                    human(c.cached_bytes()),
                    human(c.dirty_pages * dhrd_io::PAGE_BYTES),
                    human(c.writeback_pages * dhrd_io::PAGE_BYTES)
                );
            }
        }
        _ => {
            let n = match sh.tier_if_set() {
                Some(Tier::Engine(t)) => t.objects().len(),
                _ => 0,
            };
            let _ = writeln!(
                s,
                "load:            {pct:.1}% of cached files in RAM ({} of {}, {n} objects){}",
                human(l.loaded),
                human(l.total),
                if l.complete { ", complete" } else { "" }
            );
            let _ = writeln!(
                s,
                "RAM:             {} in RAM of a {} budget; {} over the budget, served from the backing",
                human(sh.budget().used_bytes()),
                human(sh.budget().limit_bytes()),
                human(l.over_budget)
            );
        }
    }
    let pre = sh.preload();
    let _ = writeln!(
        s,
        "tree walk:       {} ({} files, {} found)",
        if pre.done.load(Ordering::Acquire) {
            "done"
        } else if sh.cfg().preload {
            "running"
        } else {
            "off"
        },
        pre.files_seen.load(Ordering::Relaxed),
        human(pre.bytes_seen.load(Ordering::Relaxed)),
    );
    let c = sh.committer().counts();
    let _ = writeln!(
        s,
        "metadata sync:   {} changes made durable in {} rounds, {} fsync/syncfs calls ({})",
        c.sets,
        c.rounds,
        c.syncs,
        sh.committer().policy_name()
    );
    let failed = read_only_causes(sh);
    if failed.is_empty() {
        let _ = writeln!(s, "read-only:       no");
    } else {
        let _ = writeln!(
            s,
            "read-only:       {} file(s) after backing failures:",
            failed.len()
        );
        for (f, c) in failed {
            let _ = writeln!(s, "  {f}: {c}");
        }
    }
    sh.stats().render(&mut s);
    s
}

fn render_ram(s: &mut String, sh: &Mount, r: &ResidentStats) {
    let _ = writeln!(
        s,
        "RAM:             pinned {} in {} files of a {} budget; warm but not pinned {} in {} files{}; over the budget {} (served from the device)",
        human(r.bytes_pinned),
        r.files_pinned,
        human(sh.budget().limit_bytes()),
        human(r.bytes_unpinned),
        r.files_unpinned,
        match &r.pin_error {
            Some(e) => format!(" ({e})"),
            None if !sh.cfg().pin => " (pinning off)".to_string(),
            None => String::new(),
        },
        human(r.bytes_over_budget)
    );
    if let Some((from, to)) = r.map_count.raised {
        let _ = writeln!(
            s,
            "                 vm.max_map_count raised from {from} to {to} (a mapping per pinned file)"
        );
    }
    if let Some(why) = &r.map_count.refused {
        let _ = writeln!(s, "                 pins limited to {}: {why}", r.pins_max);
    }
}

/// What `dhrd status --json` prints: the same facts as [`status_text`] under stable field
/// names (documented in docs/fuse.md; fields are only ever added).
pub fn status_json(sh: &Mount, mountpoint: &Path, backing: &Path) -> Value {
    let l = load_totals(sh);
    let pre = sh.preload();
    let walk_done = pre.done.load(Ordering::Acquire);
    let read_only: Vec<Value> = read_only_causes(sh)
        .into_iter()
        .map(|(f, c)| json!({"file": f, "cause": c}))
        .collect();
    let counters: Map<String, Value> = sh
        .stats()
        .counters()
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let latency: Map<String, Value> = sh
        .stats()
        .latency_quantiles_us()
        .iter()
        .map(|(op, qs)| {
            let m: Map<String, Value> = qs
                .iter()
                .map(|(q, v)| (format!("{q}_le_us"), json!(v)))
                .collect();
            ((*op).to_owned(), Value::Object(m))
        })
        .collect();
    let engine_objects = match sh.tier_if_set() {
        Some(Tier::Engine(t)) => t.objects().len(),
        _ => 0,
    };
    let commits = sh.committer().counts();
    let mut doc = json!({
        "mountpoint": mountpoint.display().to_string(),
        "backing": backing.display().to_string(),
        "durability": sh.cfg().durability.to_string(),
        "read_path": match sh.tier_if_set() {
            Some(Tier::Engine(t)) => t.path().to_string(),
            Some(Tier::Page(_)) => "pagecache".to_string(),
            None => sh.cfg().read_path.to_string(),
        },
        "data_path": data_path(sh),
        "fallback": sh.fallback(),
        "passthrough_negotiated": sh.negotiated().passthrough,
        "load": {
            "bytes_in_ram": l.loaded,
            "bytes_total": l.total,
            "fraction": l.fraction(),
            "complete": l.complete,
            "objects": engine_objects,
        },
        "tree_walk": {
            "done": walk_done,
            "files_seen": pre.files_seen.load(Ordering::Relaxed),
            "bytes_seen": pre.bytes_seen.load(Ordering::Relaxed),
            "files_preloaded": pre.files_preloaded.load(Ordering::Relaxed),
        },
        "ram": {
            "used_bytes": sh.budget().used_bytes(),
            "budget_bytes": sh.budget().limit_bytes(),
            "over_budget_bytes": l.over_budget,
        },
        "read_only": !read_only.is_empty(),
        "read_only_files": read_only,
        "counters": counters,
        "latency": latency,
        "metadata_commit": {
            "changes": commits.sets,
            "rounds": commits.rounds,
            "syncs": commits.syncs,
            "policy": sh.committer().policy_name(),
        },
    });
    if let Some(Tier::Engine(t)) = sh.tier_if_set() {
        // Cache mode (SPEC M1-M3) and read-ahead, summed over the files' objects.
        let (mut ram, mut backing) = (0u64, 0u64);
        let mut c = [0u64; 6];
        for o in t.objects().snapshot() {
            let st = o.stats();
            ram += st.reads_ram;
            backing += st.reads_backing;
            for (acc, v) in c.iter_mut().zip([
                st.evictions,
                st.admissions,
                st.bypasses,
                st.ahead_loaded,
                st.ahead_used,
                st.ahead_wasted,
            ]) {
                *acc += v;
            }
        }
        doc["cache"] = json!({
            "hit_ratio": if ram + backing == 0 { 0.0 } else { ram as f64 / (ram + backing) as f64 },
            "evictions": c[0],
            "admitted": c[1],
            "bypassed": c[2],
            "read_ahead_loaded": c[3],
            "read_ahead_used": c[4],
            "read_ahead_wasted": c[5],
        });
    }
    if let Some(Tier::Page(t)) = sh.tier_if_set() {
        let r = t.resident().stats();
        let ps = t.stats();
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        doc["warmup"] = json!({
            "files_seen": r.files_seen,
            "bytes_seen": r.bytes_seen,
            "files_warmed": r.files_warmed,
            "bytes_warmed": r.bytes_warmed,
            "files_demanded": r.files_demanded,
            "demands_dropped": r.demands_dropped,
            "files_failed": r.files_failed,
            "rate_bytes_per_s": r.rate_bytes_per_s(),
            "complete": r.complete,
            "complete_after_s": r.complete_after_s,
        });
        doc["ram"]["pinned_bytes"] = json!(r.bytes_pinned);
        doc["ram"]["pinned_files"] = json!(r.files_pinned);
        doc["ram"]["unpinned_bytes"] = json!(r.bytes_unpinned);
        doc["ram"]["unpinned_files"] = json!(r.files_unpinned);
        doc["ram"]["pin_error"] = json!(r.pin_error);
        doc["ram"]["pins_max"] = json!(r.pins_max);
        doc["ram"]["max_map_count_raised_from"] = json!(r.map_count.raised.map(|(f, _)| f));
        doc["page_cache"] = json!({
            "open_inodes": t.open_inodes(),
            "sync_flags_set": g(&ps.sync_flags_set),
            "sync_flags_cleared": g(&ps.sync_flags_cleared),
            "sync_flag_failures": g(&ps.sync_flag_failures),
        });
        if let Some(c) = open_files_cache(sh) {
            doc["page_cache"]["open_files_cached_bytes"] = json!(c.cached_bytes());
            doc["page_cache"]["open_files_dirty_bytes"] =
                json!(c.dirty_pages * dhrd_io::PAGE_BYTES);
            doc["page_cache"]["open_files_writeback_bytes"] =
                json!(c.writeback_pages * dhrd_io::PAGE_BYTES);
        }
    }
    doc
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
