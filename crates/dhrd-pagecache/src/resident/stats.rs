//! The warm-up's counters as `Resident::stats` reports them.
//!
//! Invariants: a snapshot; `files_warmed <= files_seen` (a refreshed file leaves the
//! warmed count until it is warmed again). Crash semantics: none.

/// Progress and residency counters (a snapshot).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResidentStats {
    /// Files and bytes handed in (walked or demanded).
    pub files_seen: u64,
    pub bytes_seen: u64,
    /// Files whose warm-up finished, and the bytes read in for them.
    pub files_warmed: u64,
    pub bytes_warmed: u64,
    /// Files (or prefixes) pinned now, and their bytes.
    pub files_pinned: u64,
    pub bytes_pinned: u64,
    /// Warmed but not pinned: no mapping left (map count), or mlock refused.
    pub files_unpinned: u64,
    pub bytes_unpinned: u64,
    /// Bytes left on the device because the budget was full (I11).
    pub bytes_over_budget: u64,
    pub files_over_budget: u64,
    /// Files that could not be opened, or read within `READ_RETRIES_MAX` retries (served
    /// from the device).
    pub files_failed: u64,
    /// Failed warm-up reads of a file, each retried or counted in `files_failed`.
    pub read_errors: u64,
    /// Warm-up reads issued by applications opening files, ahead of the walk.
    pub files_demanded: u64,
    /// Demands dropped because the demand queue was full.
    pub demands_dropped: u64,
    /// Walk finished and nothing is queued or being read.
    pub complete: bool,
    /// Seconds since the warm-up started, and since it completed (if it did).
    pub elapsed_s: f64,
    pub complete_after_s: Option<f64>,
    /// Why pinning stopped, if it did (first cause only).
    pub pin_error: Option<String>,
    /// Most files pinned at once now (one mapping each), and what was done to
    /// `vm.max_map_count` to allow them.
    pub pins_max: u64,
    pub map_count: super::mapcount::MapCountNote,
}

impl ResidentStats {
    /// What status texts add to the warm-up's line when reads failed: "" when none did.
    pub fn failures_text(&self) -> String {
        if self.read_errors == 0 && self.files_failed == 0 {
            return String::new();
        }
        format!(
            "; {} failed reads (each retried up to {} times), {} files left to the device",
            self.read_errors,
            super::config::READ_RETRIES_MAX,
            self.files_failed
        )
    }

    /// The warm-up's line of a status text, after its label, for `in_ram` bytes of the
    /// `found` bytes of the files seen. Pins and warmed files take whole pages, so small
    /// files hold more RAM than they have bytes: the line then shows the found bytes as
    /// in RAM and the pages apart, never more in RAM than found.
    pub fn warmup_text(&self, in_ram: u64, found: u64) -> String {
        use dhrd_io::human_bytes as human;
        let data = in_ram.min(found);
        let pct = if found == 0 {
            100.0
        } else {
            data as f64 * 100.0 / found as f64
        };
        let pages = if in_ram > found {
            format!(", in {} of whole pages", human(in_ram))
        } else {
            String::new()
        };
        let complete = match self.complete_after_s {
            Some(t) if self.complete => format!(", complete after {t:.1} s"),
            _ => String::new(),
        };
        format!(
            "{pct:.1}% in RAM ({} of {} found{pages}, {} of {} files{}), {}/s{complete}",
            human(data),
            human(found),
            self.files_warmed,
            self.files_seen,
            self.failures_text(),
            human(self.rate_bytes_per_s() as u64),
        )
    }

    /// The RAM lines of a status text, the first after its label: what is pinned of the
    /// `budget_bytes`, what is warm without a pin (and why, `pinning_off` when the user
    /// asked for it), what the budget left on the device, and what happened to the
    /// mapping limit. Each line ends with a newline.
    pub fn ram_text(&self, budget_bytes: u64, pinning_off: bool) -> String {
        use dhrd_io::human_bytes as human;
        let why = match &self.pin_error {
            Some(e) => format!(" ({e})"),
            None if pinning_off => " (pinning off)".to_string(),
            None => String::new(),
        };
        let mut s = format!(
            "pinned {} in {} files of a {} budget; warm but not pinned {} in {} files{why}; over the budget {} (served from the device)\n",
            human(self.bytes_pinned),
            self.files_pinned,
            human(budget_bytes),
            human(self.bytes_unpinned),
            self.files_unpinned,
            human(self.bytes_over_budget)
        );
        if let Some((from, to)) = self.map_count.raised {
            s += &format!(
                "                 vm.max_map_count raised from {from} to {to} (a mapping per pinned file)\n"
            );
        }
        if let Some(why) = &self.map_count.refused {
            s += &format!(
                "                 pins limited to {}: {why}\n",
                self.pins_max
            );
        }
        s
    }

    /// Warm-up rate over its whole run so far, bytes per second.
    pub fn rate_bytes_per_s(&self) -> f64 {
        let secs = self.complete_after_s.unwrap_or(self.elapsed_s).max(1e-3);
        self.bytes_warmed as f64 / secs
    }
}

#[cfg(test)]
mod tests {
    use super::ResidentStats;

    #[test]
    fn the_warm_up_line_never_shows_more_in_ram_than_found() {
        let r = ResidentStats {
            files_seen: 1,
            files_warmed: 1,
            complete: true,
            complete_after_s: Some(0.0),
            ..Default::default()
        };
        let t = r.warmup_text(4096, 2);
        assert!(
            t.starts_with(
                "100.0% in RAM (2 B of 2 B found, in 4.0 KiB of whole pages, 1 of 1 files)"
            ),
            "{t}"
        );
        let t = r.warmup_text(1 << 20, 4 << 20);
        assert!(
            t.starts_with("25.0% in RAM (1.0 MiB of 4.0 MiB found, 1 of 1"),
            "{t}"
        );
        assert!(r
            .warmup_text(0, 0)
            .starts_with("100.0% in RAM (0 B of 0 B found,"));
    }
}
