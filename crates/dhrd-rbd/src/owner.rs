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
//!   instance), the pid of the process that held it, that process's start time, its pid
//!   namespace and the boot it ran in;
//! - a lock is broken only if the image's one owner is exactly the recorded owner, the
//!   record was written in this boot and this pid namespace (a pid means nothing in
//!   another one), and no process with that pid and start time exists. A librados client
//!   lives and dies with its process, so that owner cannot be writing; breaking the lock
//!   also blocklists it, so not even a stray request of it could land later;
//! - a record is believed only as far as its writer could be trusted: the directory must
//!   belong to this user and be writable by nobody else (else the open fails), and the
//!   record must be a regular file of this user, not a symlink (else it is ignored). A
//!   record others could forge (a dead pid beside a live owner's address) would make dhrd
//!   break a live lock;
//! - the record is written after the lock is taken, replaced atomically through a
//!   temporary file of a random name created O_EXCL|O_NOFOLLOW (a name planted in the
//!   directory is never followed), and removed at a clean close.
//!
//! Crash semantics: a crash between taking the lock and writing the record leaves the old
//! record (naming another owner) or none: the restart then waits for the watch timeout,
//! as without a record. Nothing is ever broken on a guess.

use std::io;
use std::path::Path;

/// One record: `PID START_TICKS OWNER PID_NAMESPACE BOOT_ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnerRecord {
    pub pid: u32,
    pub start_ticks: u64,
    pub owner: String,
    /// `/proc/self/ns/pid` of the writer (e.g. `pid:[4026531836]`).
    pub pid_ns: String,
    /// `/proc/sys/kernel/random/boot_id` of the writer's boot.
    pub boot_id: String,
}

/// This process's pid namespace and boot.
fn here() -> io::Result<(String, String)> {
    let ns = std::fs::read_link("/proc/self/ns/pid")?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok((ns.to_string_lossy().into_owned(), boot.trim().to_owned()))
}

/// Refuses an owner-record directory that another user could write to (or that is not a
/// directory of this user): its records could be forged.
pub(crate) fn check_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let why = if !m.file_type().is_dir() {
        Some(String::from("not a directory (or a symlink)"))
    } else if m.uid() != me {
        Some(format!("owned by uid {}, not {me}", m.uid()))
    } else if m.mode() & 0o022 != 0 {
        Some(format!("writable by others (mode {:o})", m.mode() & 0o7777))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "owner record directory {}: {why}: another user could forge a record that \
                 makes dhrd break a live lock",
                dir.display()
            ),
        )),
    }
}

impl OwnerRecord {
    /// The record for this process holding the lock as `owner`.
    pub(crate) fn current(owner: &str) -> io::Result<OwnerRecord> {
        let pid = std::process::id();
        let start_ticks =
            start_ticks(pid)?.ok_or_else(|| io::Error::other("no /proc/self/stat start time"))?;
        let (pid_ns, boot_id) = here()?;
        Ok(OwnerRecord {
            pid,
            start_ticks,
            owner: owner.to_owned(),
            pid_ns,
            boot_id,
        })
    }

    pub(crate) fn parse(text: &str) -> Option<OwnerRecord> {
        let mut it = text.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start_ticks = it.next()?.parse().ok()?;
        let owner = it.next()?.to_owned();
        // A record of the first format (no namespace or boot) proves nothing here.
        let pid_ns = it.next()?.to_owned();
        let boot_id = it.next()?.to_owned();
        if it.next().is_some() {
            return None;
        }
        Some(OwnerRecord {
            pid,
            start_ticks,
            owner,
            pid_ns,
            boot_id,
        })
    }

    /// The record at `path`, if it is a regular file of this user (not a symlink).
    pub(crate) fn read(path: &Path) -> Option<OwnerRecord> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .ok()?;
        let m = f.metadata().ok()?;
        // SAFETY: geteuid has no preconditions.
        if !m.file_type().is_file() || m.uid() != unsafe { libc::geteuid() } {
            return None;
        }
        let mut text = String::new();
        f.read_to_string(&mut text).ok()?;
        Self::parse(&text)
    }

    /// Replaces the record at `path` atomically, creating its directory (mode 0700) if
    /// needed; refuses a directory others may write (`check_dir`).
    pub(crate) fn write(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            check_dir(dir)?;
        }
        let text = format!(
            "{} {} {} {} {}\n",
            self.pid, self.start_ticks, self.owner, self.pid_ns, self.boot_id
        );
        dhrd_io::replace::replace_file(path, text.as_bytes(), 0o600, true)
    }

    /// Whether the process this record names is provably gone: the record is of this boot
    /// and pid namespace, and no process has that pid, or one that started at another
    /// time does.
    pub(crate) fn holder_is_gone(&self) -> bool {
        match here() {
            Ok((ns, boot)) if ns == self.pid_ns && boot == self.boot_id => {}
            // Another namespace or boot (or unknown): the pid cannot be checked here.
            _ => return false,
        }
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
        for bad in ["", "1 2", "x 2 o", "1 2 o", "1 2 o n b extra"] {
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
            ..me.clone()
        };
        assert!(no_such.holder_is_gone());
        // Written in another pid namespace or boot: its pid says nothing here.
        let elsewhere = OwnerRecord {
            pid_ns: String::from("pid:[1]"),
            ..no_such.clone()
        };
        assert!(!elsewhere.holder_is_gone());
        let before = OwnerRecord {
            boot_id: String::from("another-boot"),
            ..no_such
        };
        assert!(!before.holder_is_gone());
        Ok(())
    }
}
