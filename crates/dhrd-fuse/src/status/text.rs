//! The text `dhrd status` prints, section by section.
//!
//! No state of its own and no crash semantics.

use super::facts::{human, load_totals, open_files_cache, read_only_causes, yes, LoadTotals};
use crate::data::Tier;
use crate::mount::Mount;
use crate::page::PageTier;
use dhrd_pagecache::resident::ResidentStats;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;

/// The text `dhrd status` prints.
pub fn status_text(sh: &Mount, mountpoint: &Path, backing: &Path) -> String {
    let mut s = String::new();
    let l = load_totals(sh);
    let _ = writeln!(
        s,
        "mount:           {} (backing {})",
        mountpoint.display(),
        backing.display()
    );
    let _ = writeln!(s, "durability:      {}", sh.cfg().durability);
    render_path(&mut s, sh);
    match sh.tier_if_set() {
        Some(Tier::Page(t)) => render_page(&mut s, sh, t, &l),
        _ => render_engine(&mut s, sh, &l),
    }
    render_walk_and_sync(&mut s, sh);
    render_read_only(&mut s, sh);
    sh.stats().render(&mut s);
    s
}

/// The data path, why it is not the default, and what INIT negotiated.
fn render_path(s: &mut String, sh: &Mount) {
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
}

/// The walk's progress and the committer's rounds.
fn render_walk_and_sync(s: &mut String, sh: &Mount) {
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
    if sh.cfg().durability != dhrd_engine::Durability::Sync {
        let (dirs, entries) = sh.unsynced();
        let _ = writeln!(
            s,
            "names to sync:   {dirs} directories with changes not yet durable ({entries} new entries)"
        );
    }
    if let dhrd_engine::Durability::Periodic(p) = sh.cfg().durability {
        let _ = writeln!(
            s,
            "periodic flush:  every {} s, {} completed",
            p.as_secs(),
            sh.stats().periodic_flushes.load(Ordering::Relaxed)
        );
    }
}

/// What takes no more writes, and why.
fn render_read_only(s: &mut String, sh: &Mount) {
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
}

/// Warm-up, RAM and open files of the page cache path.
fn render_page(s: &mut String, sh: &Mount, t: &PageTier, l: &LoadTotals) {
    let r = t.resident().stats();
    let _ = writeln!(s, "warm-up:         {}", r.warmup_text(l.loaded, l.total));
    render_ram(s, sh, &r);
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
    // Descriptors of closed, written files not yet asked for a writeback error (kept.rs).
    let _ = writeln!(
        s,
        "kept unchecked:  {} descriptors of written files closed before any sync asked them",
        t.kept_files()
    );
}

/// Load and RAM of the engine path.
fn render_engine(s: &mut String, sh: &Mount, l: &LoadTotals) {
    // Pinned bytes count whole pages, found bytes do not: capped at 100%.
    let pct = (l.fraction() * 100.0).min(100.0);
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

fn render_ram(s: &mut String, sh: &Mount, r: &ResidentStats) {
    let ram = r.ram_text(sh.budget().limit_bytes(), !sh.cfg().pin);
    let _ = write!(s, "RAM:             {ram}");
}
