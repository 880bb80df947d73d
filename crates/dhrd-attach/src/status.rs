//! What `dhrd status DIR` shows for an attached directory: text for people and JSON with
//! stable field names for machines (`--json`, and the Prometheus text the CLI derives from
//! it). The fields the FUSE mount also has keep its names (`load`, `warmup`, `ram`,
//! `read_only`); docs/attach.md lists them. Fields are only ever added.
//!
//! The page cache of the tree is surveyed when status is asked for: cachestat(2) of every
//! file (cached, dirty and under writeback pages), so in `sync` mode it shows that nothing
//! waits to be written. No state of its own and no crash semantics.

use crate::attached::Attached;
use crate::check::SyncBy;
use crate::flags::FlagStats;
use crate::tree::{self, Kind};
use crate::watch::Scope;
use dhrd_pagecache::CacheStat;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub use dhrd_io::human_bytes as human;

/// The page cache of every regular file of the tree, summed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Survey {
    pub files: u64,
    pub bytes: u64,
    pub cache: CacheStat,
}

/// Surveys the tree's page cache (cachestat of every file; opens each read-only).
pub fn survey(a: &Attached) -> Survey {
    let mut s = Survey::default();
    let stop = || a.stopping();
    tree::walk(
        a.root.as_fd(),
        Path::new(""),
        (),
        &stop,
        |_, _, _| {},
        |dir, _, e| match e.kind {
            Kind::Dir => Some(()),
            Kind::File => {
                if let Ok(f) = crate::flags::open_entry(dir, e.name, false) {
                    if let Ok((c, _)) = dhrd_pagecache::cachestat(f.as_fd(), 0, 0) {
                        s.files += 1;
                        s.bytes += e.size;
                        s.cache.cached_pages += c.cached_pages;
                        s.cache.dirty_pages += c.dirty_pages;
                        s.cache.writeback_pages += c.writeback_pages;
                        s.cache.evicted_pages += c.evicted_pages;
                        s.cache.recently_evicted_pages += c.recently_evicted_pages;
                    }
                }
                None
            }
            Kind::Other => None,
        },
    );
    s
}

/// Bytes in RAM (pinned) of the bytes found, and whether the warm-up is done.
pub struct Load {
    pub loaded: u64,
    pub total: u64,
    pub complete: bool,
}

impl Load {
    pub fn fraction(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            (self.loaded as f64 / self.total as f64).min(1.0)
        }
    }
}

pub fn load(a: &Attached) -> Load {
    let r = a.resident.stats();
    Load {
        loaded: r.bytes_pinned,
        total: r.bytes_seen,
        complete: r.complete,
    }
}

fn scope_text(a: &Attached) -> String {
    match a.scope {
        Scope::Filesystem => format!("{}, the root of its file system", a.fstype),
        Scope::Tree => format!("a directory on {}", a.fstype),
    }
}

fn sync_by_word(s: SyncBy) -> &'static str {
    match s {
        SyncBy::MountOption => "mount_option",
        SyncBy::InodeFlags => "inode_flags",
        SyncBy::Nothing => "none",
    }
}

fn durability_text(a: &Attached) -> String {
    match a.sync_by {
        SyncBy::MountOption => format!(
            "sync: every write and directory change durable on return ({}, {})",
            a.sync_by,
            if a.sync_option_before {
                "set before dhrd came"
            } else {
                "set by dhrd until detach"
            }
        ),
        SyncBy::InodeFlags => format!(
            "sync: every write and directory change durable on return ({}; windows: \
             docs/crash-model.md)",
            a.sync_by
        ),
        SyncBy::Nothing => format!(
            "{}: durable at fsync, fdatasync, msync, syncfs and at detach{}",
            a.cfg.durability,
            match a.cfg.durability {
                dhrd_engine::Durability::Periodic(p) => format!(", and every {} s", p.as_secs()),
                _ => String::new(),
            }
        ),
    }
}

fn g(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The file systems mounted inside DIR, which attach does not hold (neither warmed nor
/// kept durable): "" when there are none or mountinfo cannot be read.
pub fn mounts_inside_text(dir: &Path) -> String {
    let Ok(inside) = crate::mountinfo::mounts_inside(dir) else {
        return String::new();
    };
    if inside.is_empty() {
        return String::new();
    }
    let list: Vec<String> = inside
        .iter()
        .map(|m| format!("{} ({})", m.mount_point.display(), m.fstype))
        .collect();
    format!(
        "{} file system(s) mounted inside, whose files dhrd neither warms nor keeps durable: {}",
        inside.len(),
        list.join(", ")
    )
}

/// The text `dhrd status DIR` prints.
pub fn text(a: &Attached) -> String {
    let mut s = String::new();
    let r = a.resident.stats();
    let l = load(a);
    let _ = writeln!(
        s,
        "attached:        {} ({})",
        a.dir.display(),
        scope_text(a)
    );
    let _ = writeln!(s, "durability:      {}", durability_text(a));
    let not_held = mounts_inside_text(&a.dir);
    if !not_held.is_empty() {
        let _ = writeln!(s, "not held:        {not_held}");
    }
    let _ = writeln!(
        s,
        "data path:       the kernel serves every call on {} itself; the daemon warms, pins, keeps the mode and reports (ready after {:.3} s)",
        a.dir.display(),
        *a.ready_after_s.lock()
    );
    let _ = writeln!(s, "warm-up:         {}", r.warmup_text(l.loaded, l.total));
    let _ = write!(
        s,
        "RAM:             {}",
        r.ram_text(a.budget.limit_bytes(), false)
    );
    let sv = survey(a);
    let _ = writeln!(
        s,
        "page cache:      {} cached for {} files of {} (whole pages); dirty {}, under writeback {}",
        human(sv.cache.cached_bytes()),
        sv.files,
        human(sv.bytes),
        human(sv.cache.dirty_pages * dhrd_io::PAGE_BYTES),
        human(sv.cache.writeback_pages * dhrd_io::PAGE_BYTES)
    );
    activity_text(&mut s, a);
    s
}

/// The lines of `text` on what the daemon does: the watch, the sync flags, the periodic
/// syncs, and whether the directory turned read-only.
fn activity_text(s: &mut String, a: &Attached) {
    let w = &a.watch.stats;
    let _ = writeln!(
        s,
        "watch:           {} events; {} files followed ({} refused), {} opens demanded, {} written files handed on ({} waiting), {} files forgotten; {}",
        g(&w.events),
        g(&w.files_followed),
        g(&w.follow_failures),
        g(&w.demanded),
        g(&w.refreshed),
        a.watch.changed_waiting(),
        g(&w.forgotten),
        match a.scope {
            Scope::Filesystem => "one mark on the file system".to_string(),
            Scope::Tree => format!(
                "{} directories marked ({} refused, {} made ones waiting, {} times muted, {} rescans), {} moves in, {} out",
                a.watch.dirs_marked(),
                g(&w.mark_failures),
                a.watch.dirs_waiting(),
                g(&w.dirs_muted),
                g(&w.rescans),
                g(&w.moved_in),
                g(&w.moved_out)
            ),
        }
    );
    if a.sync_by == SyncBy::InodeFlags {
        let f = &a.flags;
        let _ = writeln!(
            s,
            "sync flags:      set {}, refused {}, repaired {} (moved in, linked in, or found cleared by the audit every {} s)",
            FlagStats::get(&f.set),
            FlagStats::get(&f.refused),
            FlagStats::get(&f.repaired),
            crate::attached::audit_interval().as_secs()
        );
    }
    if let dhrd_engine::Durability::Periodic(_) = a.cfg.durability {
        let _ = writeln!(s, "periodic syncs:  {}", g(&a.periodic_syncs));
    }
    match a.health() {
        None => {
            let _ = writeln!(s, "read-only:       no");
        }
        Some(c) => {
            let _ = writeln!(s, "read-only:       yes: {c}");
        }
    }
}

/// What `dhrd status DIR --json` prints.
pub fn json(a: &Attached) -> Value {
    let r = a.resident.stats();
    let l = load(a);
    let sv = survey(a);
    let w = &a.watch.stats;
    let health = a.health();
    let mut doc = json!({
        "dir": a.dir.display().to_string(),
        "fstype": a.fstype,
        "scope": match a.scope { Scope::Filesystem => "filesystem", Scope::Tree => "tree" },
        "durability": a.cfg.durability.to_string(),
        "sync_by": sync_by_word(a.sync_by),
        "sync_option_before": a.sync_option_before,
        "ready_after_s": *a.ready_after_s.lock(),
        "load": {
            "bytes_in_ram": l.loaded,
            "bytes_total": l.total,
            "fraction": l.fraction(),
            "complete": l.complete,
        },
        "tree_walk": {
            "done": a.walk_done.load(Ordering::Acquire),
            "files_seen": g(&a.walk_files),
            "bytes_seen": g(&a.walk_bytes),
        },
        "warmup": {
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
        },
        "ram": {
            "used_bytes": a.budget.used_bytes(),
            "budget_bytes": a.budget.limit_bytes(),
            "over_budget_bytes": r.bytes_over_budget,
            "pinned_bytes": r.bytes_pinned,
            "pinned_files": r.files_pinned,
            "unpinned_bytes": r.bytes_unpinned,
            "unpinned_files": r.files_unpinned,
            "pin_error": r.pin_error,
            "pins_max": r.pins_max,
            "max_map_count_raised_from": r.map_count.raised.map(|(f, _)| f),
        },
        "page_cache": {
            "files": sv.files,
            "bytes": sv.bytes,
            "cached_bytes": sv.cache.cached_bytes(),
            "dirty_bytes": sv.cache.dirty_pages * dhrd_io::PAGE_BYTES,
            "writeback_bytes": sv.cache.writeback_pages * dhrd_io::PAGE_BYTES,
        },
        "watch": {
            "events": g(&w.events),
            "demanded": g(&w.demanded),
            "refreshed": g(&w.refreshed),
            "changed_waiting": a.watch.changed_waiting(),
            "forgotten": g(&w.forgotten),
            "dirs_marked": a.watch.dirs_marked(),
            "dirs_waiting": a.watch.dirs_waiting(),
            "dirs_muted": g(&w.dirs_muted),
            "rescans": g(&w.rescans),
            "mark_failures": g(&w.mark_failures),
            "files_followed": g(&w.files_followed),
            "follow_failures": g(&w.follow_failures),
            "marks_limit_raised_from": match g(&w.marks_limit_raised_from) {
                0 => serde_json::Value::Null,
                n => n.into(),
            },
            "moved_in": g(&w.moved_in),
            "moved_out": g(&w.moved_out),
        },
        "periodic_syncs": g(&a.periodic_syncs),
        "mounts_inside": crate::mountinfo::mounts_inside(&a.dir)
            .unwrap_or_default()
            .iter()
            .map(|m| json!({"path": m.mount_point.display().to_string(), "fstype": m.fstype}))
            .collect::<Vec<_>>(),
        "read_only": health.is_some(),
        "read_only_cause": health,
    });
    if a.sync_by == SyncBy::InodeFlags {
        doc["sync_flags"] = json!({
            "set": FlagStats::get(&a.flags.set),
            "cleared": FlagStats::get(&a.flags.cleared),
            "refused": FlagStats::get(&a.flags.refused),
            "repaired": FlagStats::get(&a.flags.repaired),
        });
    }
    doc
}
