//! What `dhrd status --json` prints: the same facts as the text under stable field names
//! (documented in docs/fuse.md; fields are only ever added).
//!
//! No state of its own and no crash semantics.

use super::facts::{data_path, load_totals, open_files_cache, read_only_causes};
use crate::data::Tier;
use crate::engine::EngineTier;
use crate::mount::Mount;
use crate::page::PageTier;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::Ordering;

/// What `dhrd status --json` prints: the same facts as the text under stable field
/// names (documented in docs/fuse.md; fields are only ever added).
pub fn status_json(sh: &Mount, mountpoint: &Path, backing: &Path) -> Value {
    let mut doc = common(sh, mountpoint, backing);
    match sh.tier_if_set() {
        Some(Tier::Engine(t)) => doc["cache"] = engine_cache(t),
        Some(Tier::Page(t)) => add_page(&mut doc, sh, t),
        None => {}
    }
    doc
}

/// Counters by their stable names, and latency quantiles by operation.
fn counters_and_latency(sh: &Mount) -> (Map<String, Value>, Map<String, Value>) {
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
    (counters, latency)
}

/// The fields of either data path.
fn common(sh: &Mount, mountpoint: &Path, backing: &Path) -> Value {
    let l = load_totals(sh);
    let pre = sh.preload();
    let walk_done = pre.done.load(Ordering::Acquire);
    let read_only: Vec<Value> = read_only_causes(sh)
        .into_iter()
        .map(|(f, c)| json!({"file": f, "cause": c}))
        .collect();
    let (counters, latency) = counters_and_latency(sh);
    let engine_objects = match sh.tier_if_set() {
        Some(Tier::Engine(t)) => t.objects().len(),
        _ => 0,
    };
    let commits = sh.committer().counts();
    json!({
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
            "unsynced_directories": sh.unsynced().0,
            "unsynced_entries": sh.unsynced().1,
        },
    })
}

/// Cache mode (SPEC M1-M3) and read-ahead of the engine, summed over the files' objects.
fn engine_cache(t: &EngineTier) -> Value {
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
    json!({
        "hit_ratio": if ram + backing == 0 { 0.0 } else { ram as f64 / (ram + backing) as f64 },
        "evictions": c[0],
        "admitted": c[1],
        "bypassed": c[2],
        "read_ahead_loaded": c[3],
        "read_ahead_used": c[4],
        "read_ahead_wasted": c[5],
    })
}

/// Warm-up, pinning and the page cache of open files, of the page cache path.
fn add_page(doc: &mut Value, sh: &Mount, t: &PageTier) {
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
        "read_errors": r.read_errors,
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
        "kept_unchecked_fds": t.kept_files(),
        "sync_flags_set": g(&ps.sync_flags_set),
        "sync_flags_cleared": g(&ps.sync_flags_cleared),
        "sync_flag_failures": g(&ps.sync_flag_failures),
    });
    if let Some(c) = open_files_cache(sh) {
        doc["page_cache"]["open_files_cached_bytes"] = json!(c.cached_bytes());
        doc["page_cache"]["open_files_dirty_bytes"] = json!(c.dirty_pages * dhrd_io::PAGE_BYTES);
        doc["page_cache"]["open_files_writeback_bytes"] =
            json!(c.writeback_pages * dhrd_io::PAGE_BYTES);
    }
}
