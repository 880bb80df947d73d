//! Who else serves a directory: every dhrd daemon holds an exclusive `flock` on the
//! directory it serves (`dhrd attach` on DIR, `dhrd mount` on its backing directory), and
//! the kernel lists each lock in the holder's /proc/PID/fdinfo (and all of them in
//! /proc/locks) with the holder's pid and the locked inode. A directory is refused when a
//! dhrd daemon serves it, a directory above it or one below it: two daemons would pin,
//! flag and restore the same files.
//!
//! Why the check that runs at every attach reads the dhrd processes' descriptors and not
//! /proc/locks: reading /proc/locks takes the kernel's lock list for writing
//! (`percpu_down_write(&file_rwsem)` in fs/locks.c), which waits for an RCU grace period
//! when no one took it lately, 14-21 ms here, on the path from `dhrd attach` to the first
//! read it serves. /proc/locks is read only to name the holder of a lock found taken.
//!
//! Invariants: only reads /proc; a lock whose holder exited between the reads is simply
//! not reported. No state and no crash semantics (the locks die with their holders).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A process holding an exclusive flock on a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line, for the message.
    pub command: String,
    /// The directory it holds, when it could be found among its descriptors.
    pub path: Option<PathBuf>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.command)
    }
}

/// One exclusive FLOCK of /proc/locks: holder pid, device (major, minor) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lock {
    pid: u32,
    major: u32,
    minor: u32,
    ino: u64,
}

/// "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (waiters have "->" after the id).
fn parse_locks(text: &str) -> Vec<Lock> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(1) == Some(&"->") || f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
                return None;
            }
            let mut dev = f.get(5)?.split(':');
            Some(Lock {
                pid: f.get(4)?.parse().ok()?,
                major: u32::from_str_radix(dev.next()?, 16).ok()?,
                minor: u32::from_str_radix(dev.next()?, 16).ok()?,
                ino: dev.next()?.parse().ok()?,
            })
        })
        .collect()
}

fn command_of(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "exited".into())
}

fn is_dhrd(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "dhrd")
}

/// The path of the descriptor of `pid` that is the inode (dev, ino), if any.
fn path_of(pid: u32, dev: u64, ino: u64) -> Option<PathBuf> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten().find_map(|e| {
        let m = std::fs::metadata(e.path()).ok()?;
        (m.dev() == dev && m.ino() == ino)
            .then(|| std::fs::read_link(e.path()).ok())
            .flatten()
    })
}

/// The holder of an exclusive flock on the inode (dev, ino), if any.
pub fn holder_of(dev: u64, ino: u64) -> Option<Holder> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    parse_locks(&text)
        .into_iter()
        .find(|l| l.major == major && l.minor == minor && l.ino == ino)
        .map(|l| Holder {
            pid: l.pid,
            command: command_of(l.pid),
            path: path_of(l.pid, dev, ino),
        })
}

/// A dhrd daemon (other than this process) holding a directory on device `dev` that is
/// `dir`, above it or below it.
pub fn dhrd_near(dir: &Path, dev: u64) -> Option<Holder> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && is_dhrd(pid))
        .find_map(|pid| held_near(pid, dir, dev))
}

/// A directory on device `dev` that `pid` holds an exclusive flock on and that is `dir`,
/// above it or below it. Looks at the lock (fdinfo) only of descriptors whose path is
/// near `dir`: a mount daemon may hold thousands of its backing's files open.
fn held_near(pid: u32, dir: &Path, dev: u64) -> Option<Holder> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten().find_map(|e| {
        let path = std::fs::read_link(e.path()).ok()?;
        if !(path.starts_with(dir) || dir.starts_with(&path)) {
            return None;
        }
        let m = std::fs::metadata(e.path()).ok()?;
        if !m.is_dir() || m.dev() != dev {
            return None;
        }
        let fd = e.file_name();
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_str()?)).ok()?;
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        parse_locks(&fdinfo_locks(&info))
            .iter()
            .any(|l| l.major == major && l.minor == minor && l.ino == m.ino())
            .then(|| Holder {
                pid,
                command: command_of(pid),
                path: Some(path),
            })
    })
}

/// The lock lines of an fdinfo file, in /proc/locks's format ("lock:\t1: FLOCK ...").
fn fdinfo_locks(info: &str) -> String {
    info.lines()
        .filter_map(|l| l.strip_prefix("lock:"))
        .map(|l| format!("{}\n", l.trim_start()))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn exclusive_flocks_are_parsed_and_waiters_and_posix_locks_skipped() {
        let text = "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 55 08:02:77 0 EOF\n\
                    3: FLOCK  ADVISORY  READ 56 08:02:78 0 EOF\n";
        assert_eq!(
            parse_locks(text),
            vec![Lock {
                pid: 1234,
                major: 0xfd,
                minor: 1,
                ino: 5678
            }]
        );
    }

    #[test]
    fn the_holder_of_our_own_lock_is_this_process_with_the_path() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = std::fs::File::open(d.path()).expect("dir");
        rustix::fs::flock(
            f.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )
        .expect("flock");
        let m = f.metadata().expect("meta");
        let h = holder_of(m.dev(), m.ino()).expect("listed in /proc/locks");
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.path.as_deref(), Some(d.path()));
        // Not a dhrd process (the test binary), and never itself.
        assert_eq!(dhrd_near(d.path(), m.dev()), None);
    }

    #[test]
    fn a_flocked_directory_is_found_near_itself_and_its_subdirectories_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let held = d.path().join("held");
        std::fs::create_dir_all(held.join("below")).expect("mkdir");
        std::fs::create_dir(d.path().join("beside")).expect("mkdir");
        let f = std::fs::File::open(&held).expect("dir");
        // Open, not locked: not a holder.
        let _open = std::fs::File::open(d.path().join("beside")).expect("dir");
        let dev = f.metadata().expect("meta").dev();
        let me = std::process::id();
        assert_eq!(held_near(me, &held, dev), None, "not locked yet");
        rustix::fs::flock(
            f.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )
        .expect("flock");
        for near in [held.clone(), held.join("below"), d.path().to_path_buf()] {
            let h = held_near(me, &near, dev).unwrap_or_else(|| panic!("near {near:?}"));
            assert_eq!((h.pid, h.path.as_deref()), (me, Some(held.as_path())));
        }
        assert_eq!(held_near(me, &d.path().join("beside"), dev), None);
        assert_eq!(held_near(me, &held, dev + 1), None, "another device");
    }

    #[test]
    fn fdinfo_lock_lines_read_as_proc_locks_lines() {
        let info = "pos:\t0\nflags:\t0100000\nmnt_id:\t30\nino:\t852469\n\
                    lock:\t1: FLOCK  ADVISORY  WRITE 7706 fe:00:852469 0 EOF\n";
        assert_eq!(
            parse_locks(&fdinfo_locks(info)),
            vec![Lock {
                pid: 7706,
                major: 0xfe,
                minor: 0,
                ino: 852469
            }]
        );
    }
}
