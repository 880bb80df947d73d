//! What machine a benchmark ran on, for every report.

use serde::Serialize;
use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub ram_bytes: u64,
    pub kernel: String,
    pub disk: String,
    pub filesystem: String,
    pub rustc: String,
    pub date_utc: String,
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

impl Machine {
    pub fn probe(dir: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let ram_kib: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let d = dir.to_string_lossy();
        let df = Command::new("df")
            .args(["--output=source,fstype", &d])
            .output()
            .ok()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .nth(1)
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default();
        let mut parts = df.split_whitespace();
        let source = parts.next().unwrap_or("?").to_string();
        let fstype = parts.next().unwrap_or("?").to_string();
        let dev = source.trim_start_matches("/dev/").to_string();
        let rota = std::fs::read_to_string(format!("/sys/block/{dev}/queue/rotational"))
            .map(|s| {
                if s.trim() == "1" {
                    "rotational flag set"
                } else {
                    "non-rotational"
                }
            })
            .unwrap_or("unknown type");
        Self {
            cpu,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            ram_bytes: ram_kib * 1024,
            kernel: first_line("uname", &["-r"]),
            disk: format!("{source} ({rota}; a virtio disk reports rotational even on SSD)"),
            filesystem: fstype,
            rustc: first_line("rustc", &["--version"]),
            date_utc: first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "CPU {} x{} cores, RAM {:.1} GiB, kernel {}, disk {}, fs {}, {}, {}",
            self.cpu,
            self.cores,
            self.ram_bytes as f64 / (1u64 << 30) as f64,
            self.kernel,
            self.disk,
            self.filesystem,
            self.rustc,
            self.date_utc
        )
    }
}
