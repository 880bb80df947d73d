//! Prometheus text exposition of a status document (`dhrd status --prometheus`).
//!
//! The daemon answers with JSON (`status-json` on its control socket); this module turns
//! any such document into metrics by one rule, so a field added to the JSON appears here
//! without a change: a number becomes a sample named after its path
//! (`dhrd_mount_ram_used_bytes`), a boolean a 0/1 sample, every top-level string a label
//! of one `<prefix>_info` sample, an array its length (`<path>_count`); nulls (a latency
//! quantile with no sample yet) are left out. Every sample carries the `labels` given
//! (the mount point), so several mounts can be scraped into one series set.

use serde_json::Value;
use std::fmt::Write as _;

/// Renders `doc` as Prometheus text format, every name starting with `prefix`.
pub fn prometheus_text(prefix: &str, labels: &[(&str, &str)], doc: &Value) -> String {
    let mut out = String::new();
    let base = label_set(labels, &[]);
    if let Value::Object(top) = doc {
        let info: Vec<(&str, &str)> = top
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.as_str(), s)))
            .collect();
        let _ = writeln!(out, "# TYPE {prefix}_info gauge");
        let _ = writeln!(out, "{prefix}_info{} 1", label_set(labels, &info));
    }
    flatten(prefix, doc, &base, &mut out);
    out
}

fn flatten(name: &str, v: &Value, labels: &str, out: &mut String) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                flatten(&format!("{name}_{}", sanitize(k)), child, labels, out);
            }
        }
        Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                let _ = writeln!(out, "# TYPE {name} gauge");
                let _ = writeln!(out, "{name}{labels} {x}");
            }
        }
        Value::Bool(b) => {
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name}{labels} {}", u8::from(*b));
        }
        Value::Array(a) => {
            let _ = writeln!(out, "# TYPE {name}_count gauge");
            let _ = writeln!(out, "{name}_count{labels} {}", a.len());
        }
        // Strings are labels of the info sample (top level) or not metrics at all.
        Value::String(_) | Value::Null => {}
    }
}

/// A metric name part: `[a-zA-Z0-9_]` only.
fn sanitize(k: &str) -> String {
    k.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn label_set(fixed: &[(&str, &str)], more: &[(&str, &str)]) -> String {
    let all: Vec<String> = fixed
        .iter()
        .chain(more)
        .map(|(k, v)| format!("{}=\"{}\"", sanitize(k), escape(v)))
        .collect();
    if all.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", all.join(","))
    }
}

/// Label value escaping of the text format: backslash, double quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_bools_strings_arrays_and_nulls() {
        let doc = json!({
            "mountpoint": "/m \"x\"",
            "durability": "sync",
            "read_only": false,
            "ram": {"used_bytes": 4096, "budget_bytes": 8192},
            "read_only_files": [],
            "latency": {"read": {"p99_le_us": 16, "p999_le_us": null}},
        });
        let t = prometheus_text("dhrd_mount", &[("mountpoint", "/m \"x\"")], &doc);
        let l = "{mountpoint=\"/m \\\"x\\\"\"}";
        assert!(
            t.contains(&format!("dhrd_mount_ram_used_bytes{l} 4096\n")),
            "{t}"
        );
        assert!(t.contains(&format!("dhrd_mount_read_only{l} 0\n")), "{t}");
        assert!(t.contains(&format!("dhrd_mount_read_only_files_count{l} 0\n")));
        assert!(t.contains(&format!("dhrd_mount_latency_read_p99_le_us{l} 16\n")));
        assert!(!t.contains("p999"), "a null became a sample: {t}");
        assert!(t.contains("durability=\"sync\""), "{t}");
        // Every sample line is `name{labels} value`.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let (name, _) = line.split_once('{').unwrap_or(("", ""));
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        }
    }
}
