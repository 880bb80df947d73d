//! Holding the backing's writes without timing: the backing is an ext4 on a loop device
//! (`LoopFs`) that a test freezes with `fsfreeze` (FIFREEZE). Every write to it then blocks
//! until the thaw, so the writes pile up in the daemon, and `dhrd status` counts how many
//! got there at once (`writes: ..., in the daemon at once: at most N`).

use super::Mount;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a test waits for writes to pile up before it counts them. Not a timing
/// assertion: a slow machine only makes the writes arrive later, and a count that fails a
/// test (a fixed worker pool, a kernel that sends one request at a time) stays where it is
/// however long one waits.
pub const PILE_UP_WAIT: Duration = Duration::from_secs(30);

fn fsfreeze(flag: &str, fs: &Path) -> bool {
    Command::new("fsfreeze")
        .arg(flag)
        .arg(fs)
        .status()
        .expect("fsfreeze (util-linux) is required")
        .success()
}

/// A frozen file system, thawed when dropped: a failing test must not leave the daemon's
/// writes (and the loop device's unmount) hanging.
pub struct Frozen<'a>(&'a Path);

impl<'a> Frozen<'a> {
    pub fn new(fs: &'a Path) -> Self {
        assert!(
            fsfreeze("--freeze", fs),
            "fsfreeze --freeze {}",
            fs.display()
        );
        Self(fs)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let thawed = fsfreeze("--unfreeze", self.0);
        if !std::thread::panicking() {
            assert!(thawed, "fsfreeze --unfreeze {}", self.0.display());
        }
    }
}

/// The most writes the daemon served at once, from the `writes:` status line.
pub fn writes_at_once(m: &Mount) -> u64 {
    let st = m.status();
    let line = st
        .lines()
        .find(|l| l.starts_with("writes:"))
        .unwrap_or_else(|| panic!("no writes line in status:\n{st}"));
    line.split("at most ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no 'at most N' in {line:?}"))
}

/// Polls `writes_at_once` until it reaches `want` or `PILE_UP_WAIT` passes; the last count.
pub fn wait_for_writes_at_once(m: &Mount, want: u64) -> u64 {
    let t = Instant::now();
    let mut seen = writes_at_once(m);
    while seen < want && t.elapsed() < PILE_UP_WAIT {
        std::thread::sleep(Duration::from_millis(50));
        seen = writes_at_once(m);
    }
    seen
}
