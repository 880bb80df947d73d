//! Result rows, the markdown table, and the output directory (a new run folder, named
//! by the scheme of docs/benchmarks.md, "Run folders").

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

/// Where runs go unless `--out` says otherwise (relative: dhrd-bench runs from the checkout).
const RESULTS_DIR: &str = "bench/results";
/// Bound on runs of one name on one day, so a folder that cannot be told apart from a
/// taken name (say, a file in its place) ends in an error instead of a long search.
const RUNS_PER_DAY_MAX: u32 = 1000;

/// A new run folder `bench/results/YYYY-MM-DD-<subject>`, named by the scheme of
/// docs/benchmarks.md ("Run folders", the same as `bench/new-run-dir.sh`): the UTC date the
/// run starts, then `-2`, `-3`, ... when a run of that name exists already that day. The
/// folder is created here (`create_dir` claims a name atomically), so two runs never write
/// into one.
pub fn new_run_dir(subject: &str) -> std::io::Result<PathBuf> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(std::io::Error::other)?;
    new_run_dir_in(Path::new(RESULTS_DIR), subject, &utc_date(now.as_secs()))
}

fn new_run_dir_in(results: &Path, subject: &str, date: &str) -> std::io::Result<PathBuf> {
    assert!(
        !subject.is_empty()
            && subject
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'+'),
        "run subject {subject:?}: lowercase letters, digits, '-' and '+' only"
    );
    std::fs::create_dir_all(results)?;
    let base = format!("{date}-{subject}");
    for n in 1..=RUNS_PER_DAY_MAX {
        let dir = match n {
            1 => results.join(&base),
            n => results.join(format!("{base}-{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "{RUNS_PER_DAY_MAX} runs named {base} exist in {} already",
        results.display()
    )))
}

/// `YYYY-MM-DD` (UTC) of a time in seconds since the Unix epoch: days to the civil
/// calendar (Howard Hinnant's `civil_from_days`, for days since 1970-01-01).
fn utc_date(unix_secs: u64) -> String {
    let z = unix_secs / 86_400 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(86_399), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31");
        assert_eq!(utc_date(1_798_761_600), "2027-01-01");
    }

    #[test]
    fn a_taken_name_gets_the_next_number() {
        let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let results = t.path().join("results");
        let run = |s| new_run_dir_in(&results, s, "2026-11-28").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run("tier-quick"), results.join("2026-11-28-tier-quick"));
        assert_eq!(run("tier-quick"), results.join("2026-11-28-tier-quick-2"));
        assert_eq!(run("tier-quick"), results.join("2026-11-28-tier-quick-3"));
        assert_eq!(run("tier-full"), results.join("2026-11-28-tier-full"));
        assert!(results.join("2026-11-28-tier-quick-2").is_dir());
    }
}
