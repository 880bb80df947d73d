//! Result rows, the markdown table, and the output directory.

use crate::machine::Machine;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Experiment group, e.g. "read 4 KiB random".
    pub experiment: String,
    /// What ran: "dhrd", "memcpy baseline", ...
    pub config: String,
    pub threads: usize,
    /// Main figure and its unit (higher is better unless `lower_is_better`).
    pub value: f64,
    pub unit: String,
    pub lower_is_better: bool,
    pub latency_us_p50: Option<f64>,
    pub latency_us_p99: Option<f64>,
    /// dhrd's figure relative to the named baseline of the same run (> 1 is better).
    pub ratio: Option<f64>,
    pub ratio_vs: Option<String>,
    pub target: Option<String>,
    pub note: Option<String>,
}

impl Row {
    pub fn new(experiment: &str, config: &str, threads: usize, value: f64, unit: &str) -> Self {
        Self {
            experiment: experiment.into(),
            config: config.into(),
            threads,
            value,
            unit: unit.into(),
            lower_is_better: false,
            latency_us_p50: None,
            latency_us_p99: None,
            ratio: None,
            ratio_vs: None,
            target: None,
            note: None,
        }
    }

    pub fn lat(mut self, p50: f64, p99: f64) -> Self {
        self.latency_us_p50 = Some(p50);
        self.latency_us_p99 = Some(p99);
        self
    }

    pub fn lower(mut self) -> Self {
        self.lower_is_better = true;
        self
    }

    /// Sets the ratio against `base` (same unit), oriented so that > 1 means dhrd is better.
    pub fn vs(mut self, base: &Row, target: Option<&str>) -> Self {
        let r = if self.lower_is_better {
            base.value / self.value
        } else {
            self.value / base.value
        };
        self.ratio = Some(r);
        self.ratio_vs = Some(format!("{} ({} thr)", base.config, base.threads));
        self.target = target.map(String::from);
        self
    }

    pub fn note(mut self, n: &str) -> Self {
        self.note = Some(n.into());
        self
    }
}

#[derive(Serialize)]
pub struct Report {
    pub name: String,
    pub command: String,
    pub machine: Machine,
    pub rows: Vec<Row>,
    pub conclusions: Vec<String>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# {}\n", self.name);
        let _ = writeln!(s, "Command: `{}`\n", self.command);
        let _ = writeln!(s, "Machine: {}\n", self.machine.describe());
        let _ = writeln!(
            s,
            "| experiment | config | threads | value | unit | p50 us | p99 us | ratio | vs | target | note |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
                r.experiment,
                r.config,
                r.threads,
                r.value,
                r.unit,
                o(r.latency_us_p50),
                o(r.latency_us_p99),
                r.ratio.map_or(String::new(), |v| format!("{v:.2}x")),
                r.ratio_vs.clone().unwrap_or_default(),
                r.target.clone().unwrap_or_default(),
                r.note.clone().unwrap_or_default()
            );
        }
        if !self.conclusions.is_empty() {
            let _ = writeln!(s, "\n## Conclusions\n");
            for c in &self.conclusions {
                let _ = writeln!(s, "- {c}");
            }
        }
        s
    }

    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        std::fs::write(out.join("report.md"), self.markdown())?;
        Ok(())
    }
}

pub fn default_out(name: &str, quick: bool) -> PathBuf {
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| String::from("undated"));
    let profile = if quick { "quick" } else { "full" };
    PathBuf::from(format!("bench/results/{date}-{name}-{profile}"))
}
