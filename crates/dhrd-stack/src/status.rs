//! The status document of a stack: what `dhrd nbd --status-file` writes (the frontend adds
//! its own parts, such as connections) and what the C API's `dhrd_get_status_json`
//! returns. Field names are stable (docs/nbd.md): fields are only ever added.
//!
//! Every value comes from a serialised snapshot (`StatsSnapshot`, `LoadProgress`,
//! `WriteBackStats`, `TierStats`, all `serde::Serialize`); the engine's counters are
//! grouped by one table, [`ENGINE_FIELDS`], which a test keeps complete: a counter added to
//! the engine must be given its place there.

use crate::LayerStats;
use dhrd_engine::HybridObject;
use dhrd_io::Durable;
use serde_json::{json, Map, Value};

/// Where each statistic of the engine's `StatsSnapshot` appears: (group, name in the
/// group, field of the snapshot).
pub const ENGINE_FIELDS: [(&str, &str, &str); 28] = [
    ("reads", "ram", "reads_ram"),
    ("reads", "backing", "reads_backing"),
    ("reads", "bytes_ram", "bytes_read_ram"),
    ("reads", "bytes_backing", "bytes_read_backing"),
    ("writes", "count", "writes"),
    ("writes", "bytes", "bytes_written"),
    ("writes", "failed", "writes_failed"),
    ("writes", "waits_on_load", "write_waits_on_load"),
    ("writes", "pieces_backing_only", "write_pieces_backing_only"),
    ("writes", "widened", "writes_widened"),
    ("writes", "zero_ranges", "zero_ranges"),
    ("writes", "set_lens", "set_lens"),
    ("writes", "chunks_invalidated", "chunks_invalidated"),
    ("syncs", "count", "syncs"),
    ("syncs", "failed", "sync_failures"),
    ("syncs", "flushes", "flushes"),
    ("syncs", "batch_writes_mean", "commit_batch_writes_mean"),
    ("syncs", "batch_writes_max", "commit_batch_writes_max"),
    ("cache", "evictions", "evictions"),
    ("cache", "admitted", "admissions"),
    ("cache", "bypassed", "bypasses"),
    ("cache", "read_ahead_loaded", "ahead_loaded"),
    ("cache", "read_ahead_used", "ahead_used"),
    ("cache", "read_ahead_wasted", "ahead_wasted"),
    ("latency", "read_ram", "read_ram"),
    ("latency", "read_backing", "read_backing"),
    ("latency", "write", "write"),
    ("latency", "sync", "sync"),
];

/// A snapshot serialised as a JSON object (a derived `Serialize` of a struct never fails
/// to be one).
fn object_of<T: serde::Serialize>(v: &T) -> Map<String, Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m,
        other => unreachable!("a snapshot serialised as {other:?}"),
    }
}

/// The status of `obj` and the `layers` under it.
pub fn status<D: Durable>(obj: &HybridObject<D>, layers: &LayerStats) -> Map<String, Value> {
    let s = obj.stats();
    let p = obj.progress();
    let mut doc = Map::new();
    doc.insert("durability".into(), json!(obj.durability().to_string()));
    doc.insert("size_bytes".into(), json!(obj.len()));
    let mut load = object_of(&p);
    load.insert("fraction".into(), json!(p.fraction()));
    load.insert("complete".into(), json!(obj.is_fully_loaded()));
    doc.insert("load".into(), Value::Object(load));
    let engine = object_of(&s);
    for (group, name, field) in ENGINE_FIELDS {
        let value = engine[field].clone();
        let group = doc.entry(group).or_insert_with(|| json!({}));
        group[name] = value;
    }
    let reads = s.reads_ram + s.reads_backing;
    let ram_share = if reads == 0 {
        1.0
    } else {
        s.reads_ram as f64 / reads as f64
    };
    doc["reads"]["ram_share"] = json!(ram_share);
    doc["cache"]["hit_ratio"] = json!(s.hit_ratio());
    doc["cache"]["bytes_in_ram"] = json!(p.ram_resident_bytes);
    doc.insert("read_only".into(), json!(obj.is_read_only()));
    let cause = obj.failure().map(|c| c.to_string());
    doc.insert("read_only_cause".into(), json!(cause));
    doc.extend(object_of(layers));
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_statistic_has_its_place_in_the_document() {
        let engine = object_of(&dhrd_engine::StatsSnapshot::default());
        let placed: Vec<&str> = ENGINE_FIELDS.iter().map(|(_, _, f)| *f).collect();
        for field in engine.keys() {
            assert!(
                placed.contains(&field.as_str()),
                "StatsSnapshot.{field} is missing from ENGINE_FIELDS"
            );
        }
        for f in placed {
            assert!(
                engine.contains_key(f),
                "ENGINE_FIELDS names {f}, which is gone"
            );
        }
    }
}
