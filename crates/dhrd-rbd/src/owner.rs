//! The owner record: which lock owner a dhrd process on this host is, so that a restart
//! after a crash can take the image's lock at once.
//!
//! Without it, a crashed holder's exclusive lock stays until its watch expires on the OSDs
//! (`osd_client_watch_timeout`, 30 s by default), and a restarted dhrd waits that long
//! before it serves anything. With it, the restart sees that the lock's owner is the
//! librados client of a process of this host that no longer runs, and breaks the lock
//! (which blocklists that client) instead of waiting.
//!
//! Invariants (why breaking is safe):
//! - a record names a lock owner (its messenger address, unique per librados client
//!   instance), the pid of the process that held it and that process's start time;
//! - a lock is broken only if the image's one owner is exactly the recorded owner and no
//!   process with that pid and start time exists on this host. A librados client lives and
//!   dies with its process, so that owner cannot be writing; breaking the lock also
//!   blocklists it, so not even a stray request of it could land later;
//! - the record is written after the lock is taken, replaced atomically (write and
//!   rename), and removed at a clean close. A record from before a reboot names a pid that
//!   either does not exist or has another start time: the rule above still holds.
//!
//! Crash semantics: a crash between taking the lock and writing the record leaves the old
//! record (naming another owner) or none: the restart then waits for the watch timeout,
//! as without a record. Nothing is ever broken on a guess.

use std::io;
use std::path::Path;

/// One record: `PID START_TICKS OWNER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnerRecord {
    pub pid: u32,
    pub start_ticks: u64,
    pub owner: String,
}

impl OwnerRecord {
    /// The record for this process holding the lock as `owner`.
    pub(crate) fn current(owner: &str) -> io::Result<OwnerRecord> {
        let pid = std::process::id();
        let start_ticks =
            start_ticks(pid)?.ok_or_else(|| io::Error::other("no /proc/self/stat start time"))?;
        Ok(OwnerRecord {
            pid,
            start_ticks,
            owner: owner.to_owned(),
        })
    }

    pub(crate) fn parse(text: &str) -> Option<OwnerRecord> {
        let mut it = text.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start_ticks = it.next()?.parse().ok()?;
        let owner = it.next()?.to_owned();
        if it.next().is_some() {
            return None;
        }
        Some(OwnerRecord {
            pid,
            start_ticks,
            owner,
        })
    }

    pub(crate) fn read(path: &Path) -> Option<OwnerRecord> {
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }

    /// Replaces the record at `path` atomically, creating its directory if needed.
    pub(crate) fn write(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(
            &tmp,
            format!("{} {} {}\n", self.pid, self.start_ticks, self.owner),
        )?;
        std::fs::rename(&tmp, path)
    }

    /// Whether the process this record names is gone (no such pid, or a pid reused by a
    /// process that started at another time).
    pub(crate) fn holder_is_gone(&self) -> bool {
        match start_ticks(self.pid) {
            Ok(Some(t)) => t != self.start_ticks,
            Ok(None) => true,
            // /proc unreadable: assume alive; never break on a guess.
            Err(_) => false,
        }
    }
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// /proc/PID/stat); `None` if no such process exists.
fn start_ticks(pid: u32) -> io::Result<Option<u64>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) is in parentheses and may hold spaces: count fields from
    // after its closing parenthesis, where field 3 starts.
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| io::Error::other("malformed /proc/PID/stat"))?;
    after
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|f| f.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::other("no start time in /proc/PID/stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_garbage() -> io::Result<()> {
        let r = OwnerRecord::current("127.0.0.1:0/12345")?;
        assert_eq!(r.pid, std::process::id());
        let dir = std::env::temp_dir().join(format!("dhrd-owner-{}", std::process::id()));
        let path = dir.join("sub/img.owner");
        r.write(&path)?;
        assert_eq!(OwnerRecord::read(&path), Some(r.clone()));
        std::fs::remove_dir_all(&dir)?;
        for bad in ["", "1 2", "x 2 o", "1 2 o extra"] {
            assert_eq!(OwnerRecord::parse(bad), None, "{bad:?}");
        }
        Ok(())
    }

    #[test]
    fn a_live_process_is_not_gone_and_a_changed_start_time_is() -> io::Result<()> {
        let me = OwnerRecord::current("o")?;
        assert!(!me.holder_is_gone());
        let reused = OwnerRecord {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(reused.holder_is_gone());
        let no_such = OwnerRecord {
            pid: u32::MAX - 1,
            ..me
        };
        assert!(no_such.holder_is_gone());
        Ok(())
    }
}
