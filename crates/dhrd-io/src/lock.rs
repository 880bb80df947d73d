//! One writer per backing file: the open file description lock [`FileBacking::open`]
//! takes, whatever the frontend (NBD, the C API, the Rust library).
//!
//! Two objects over one file each keep their own RAM copy: each serves its own, so one
//! reads stale bytes and writes of one are lost to the other. The lock keeps the second
//! away: a read-write open takes an exclusive lock on the whole file, a read-only one a
//! shared lock (several readers, no writer beside them).
//!
//! Why an open file description (OFD) lock, `fcntl(F_OFD_SETLK)`: it belongs to the open,
//! not to the process, so two opens in one process conflict (a classic POSIX lock would
//! not); it is released by the kernel when the descriptor closes, also when the process
//! dies; it works on block devices (on the device node's inode) and over NFS (as a POSIX
//! lock through the lock manager, where `flock` is only emulated on top of it); and it
//! conflicts with the OFD locks QEMU takes on disk images, so QEMU and dhrd keep each
//! other off one image file. It is advisory: a program that takes no lock is not stopped.
//!
//! The FUSE daemon does not use it: it hands in files it opened itself
//! (`FileBacking::from_file`) and holds one `flock` on its whole backing directory. That
//! lock is on the directory's inode, this one on a file's, so the two never conflict
//! within one daemon.
//!
//! An open waits up to [`RELEASE_WAIT`] for a lock held by this same process
//! (an object closed a moment ago whose background threads have not yet let go of its
//! file) or by no process it can find (one that let go while it looked, or one out of its
//! sight), never for one of another process it sees.
//!
//! Crash semantics: the kernel drops the lock with the last descriptor of its open, so a
//! process that crashed holds nothing; nothing is written.
//!
//! [`FileBacking::open`]: crate::FileBacking::open

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

/// How long an open waits for a lock another open of this same process holds, or one
/// whose holder it cannot find: an object's `close` waits for its background jobs, but a
/// loader thread may still hold the object for the few instructions after its job ends. A
/// lock held by another process that the search finds is not waited for.
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// How often, while an open waits for a lock whose holder it could not find, it searches
/// every process's descriptors again (each search reads the fdinfo of every descriptor of
/// every process); the lock itself is tried every 5 ms meanwhile. About ten searches
/// before a refusal instead of two hundred.
const HOLDER_SEARCH_INTERVAL: Duration = Duration::from_millis(100);

/// Takes the lock on `file` (exclusive for a writer, shared for a reader) without waiting
/// for another process; an `ErrorKind::ResourceBusy` error naming the holder when another
/// open has it.
pub(crate) fn lock_backing(file: &File, label: &str, exclusive: bool) -> io::Result<()> {
    let started = Instant::now();
    let mut searched: Option<Instant> = None;
    loop {
        let mut fl: libc::flock = flock_whole(exclusive);
        // SAFETY: a descriptor we own and a flock struct that outlives the call.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Err(io::Error::new(
                e.kind(),
                format!("locking {label} against a second writer: {e}"),
            ));
        }
        // This process's own descriptors first: the common holder (a closed object's
        // loader thread), found without searching every process.
        let waiting = started.elapsed() < RELEASE_WAIT;
        if waiting && held_here(file) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        if waiting && searched.is_some_and(|t| t.elapsed() < HOLDER_SEARCH_INTERVAL) {
            // The last search found no holder: try the lock again before searching again.
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let holders = holder_pids(file);
        searched = Some(Instant::now());
        if waiting && may_be_released(&holders, std::process::id()) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let holder = describe_holders(&holders);
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{label} is in use by {holder}: dhrd serves a backing from one open only, \
                 since each open keeps its own RAM copy"
            ),
        ));
    }
}

/// Whether a conflicting lock whose holders are `holders` may be let go soon: when this
/// process (`me`) holds it, and when no holder is found at all. A holder that let go
/// between the failed `fcntl` and the search (a loader thread dropping a closed object's
/// file) leaves no trace, and failing then would refuse an open that succeeds a moment
/// later.
fn may_be_released(holders: &[u32], me: u32) -> bool {
    holders.is_empty() || holders.contains(&me)
}

fn flock_whole(exclusive: bool) -> libc::flock {
    // SAFETY: flock is plain data; all zeros is valid (and what OFD locks need for l_pid).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // to the end, however the file grows
    fl
}

/// Whether process `pid` (a /proc entry: a pid or "self") has a lock on the inode named
/// `want` (`MAJ:MIN:INO` as /proc prints it) through one of its descriptors: each
/// descriptor's fdinfo lists the locks of its open file description.
fn holds_lock(pid: &str, want: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    fds.filter_map(|e| e.ok()).any(|e| {
        std::fs::read_to_string(e.path()).is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("lock:") && l.split_whitespace().any(|f| f == want))
        })
    })
}

/// The `MAJ:MIN:INO` of `file` as /proc prints it (major and minor in hex).
fn proc_name(file: &File) -> Option<String> {
    let m = file.metadata().ok()?;
    let (dev, ino) = (m.dev(), m.ino());
    Some(format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev),
        libc::minor(dev)
    ))
}

/// Whether this process holds a lock on `file`'s inode through another descriptor.
fn held_here(file: &File) -> bool {
    proc_name(file).is_some_and(|want| holds_lock("self", &want))
}

/// The pids holding locks on `file`'s inode. /proc/locks names OFD locks' holders as -1 on
/// current kernels, so the processes' fdinfo is searched (only after a conflict); a holder
/// in another pid namespace, or on another NFS client, is not found.
fn holder_pids(file: &File) -> Vec<u32> {
    let Some(want) = proc_name(file) else {
        return Vec::new();
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| holds_lock(&pid.to_string(), &want))
        .collect()
}

/// Names the holders for a message.
fn describe_holders(pids: &[u32]) -> String {
    let me = std::process::id();
    let names: Vec<String> = pids
        .iter()
        .map(|&pid| match pid {
            p if p == me => format!("this process (pid {p}, another open of the same file)"),
            p => {
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .map(|c| c.trim().to_owned())
                    .unwrap_or_else(|_| String::from("?"));
                format!("pid {p} ({comm})")
            }
        })
        .collect();
    match names.is_empty() {
        true => String::from("another open of it (a process not visible here, or on another host)"),
        false => names.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A fresh directory of this test's own (`name`), and a file path in it.
    fn scratch(name: &str) -> io::Result<(PathBuf, PathBuf)> {
        let dir = std::env::temp_dir().join(format!("dhrd-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("f");
        Ok((dir, path))
    }

    fn open_rw(path: &Path) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    }

    #[test]
    fn two_opens_of_one_file_conflict_and_readers_share() -> io::Result<()> {
        let (dir, path) = scratch("lock")?;
        let (a, b) = (open_rw(&path)?, open_rw(&path)?);
        lock_backing(&a, "f", true)?;
        let e = lock_backing(&b, "f", true).err();
        let e = e.unwrap_or_else(|| panic!("a second writer got the lock"));
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        assert!(e.to_string().contains("this process"), "{e}");
        assert!(
            lock_backing(&b, "f", false).is_err(),
            "a reader beside a writer"
        );
        drop(a);
        lock_backing(&b, "f", false)?;
        let c = open_rw(&path)?;
        lock_backing(&c, "f", false)?;
        std::fs::remove_dir_all(&dir)
    }

    #[test]
    fn a_lock_released_while_its_holder_is_sought_is_tried_again() {
        assert!(may_be_released(&[], 10), "a holder that let go meanwhile");
        assert!(
            may_be_released(&[3, 10], 10),
            "this process among the holders"
        );
        assert!(!may_be_released(&[3], 10), "another process that holds it");
    }

    #[test]
    fn a_lock_another_thread_drops_soon_is_waited_for() -> io::Result<()> {
        let (dir, path) = scratch("lock-wait")?;
        let (a, b) = (open_rw(&path)?, open_rw(&path)?);
        lock_backing(&a, "f", true)?;
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
        });
        lock_backing(&b, "f", true)?;
        holder
            .join()
            .map_err(|_| io::Error::other("holder panicked"))?;
        std::fs::remove_dir_all(&dir)
    }
}
