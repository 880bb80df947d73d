//! Replacing a small file atomically in a directory other users may write (a status file
//! in a node_exporter textfile directory or /tmp, an owner record), as root.
//!
//! A fixed temporary name (`FILE.tmp`) there is a hole: another user plants a symlink of
//! that name pointing at /etc/shadow, and root's next `write` goes through it. Here the
//! temporary file gets a random name and is created with `O_CREAT | O_EXCL | O_NOFOLLOW`,
//! so it is always a new file of ours (a planted name makes the create fail, never
//! follow); the rename then replaces `FILE` itself (a symlink at `FILE` is replaced, not
//! followed). The temporary file is removed when anything fails.
//!
//! Crash semantics: a reader sees the old or the new contents, never a mix. With
//! `durable`, the new contents and the rename are on the device when this returns; a crash
//! before that may leave a stray temporary file, which later calls never reuse.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Tries with fresh random names before giving up (a clash means someone plants names).
const NAME_TRIES: usize = 16;

/// A random 64-bit value from the kernel.
pub fn random_u64() -> io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: `b` is writable for its length; getrandom fills at most that.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(b))
}

/// Replaces `path` with `content` (file mode `mode`, less the umask) through a temporary
/// file of a random name in the same directory; see the module header.
pub fn replace_file(path: &Path, content: &[u8], mode: u32, durable: bool) -> io::Result<()> {
    let (dir, mut f, tmp) = new_temp(path, mode)?;
    let done = f
        .write_all(content)
        .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if durable {
        std::fs::File::open(&dir)?.sync_all()?;
    }
    Ok(())
}

/// Whether [`replace_file`] could replace `path`: its directory takes a new file (one is
/// made and removed again) and `path` is not a directory. A program that writes a status
/// file checks this at start, before it makes anything else, so that a mistyped path fails
/// the start instead of the first write.
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    let (_, _, tmp) = new_temp(path, 0o600)?;
    std::fs::remove_file(&tmp)
}

/// A new file of a random name next to `path` (`.NAME.RANDOM.tmp`): its directory, the
/// file, and its path.
fn new_temp(path: &Path, mode: u32) -> io::Result<(PathBuf, std::fs::File, PathBuf)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut last = None;
    for _ in 0..NAME_TRIES {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{:016x}.tmp", random_u64()?));
        let tmp = dir.join(tmp_name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((dir, f, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_never_followed() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("dhrd-replace-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep")?;
        let path = dir.join("status");
        std::os::unix::fs::symlink(&victim, dir.join("status.tmp"))?;
        replace_file(&path, b"one", 0o644, false)?;
        replace_file(&path, b"two", 0o644, true)?;
        assert_eq!(std::fs::read(&path)?, b"two");
        assert_eq!(std::fs::read(&victim)?, b"keep");
        // A symlink at the name itself is replaced, not written through.
        std::fs::remove_file(&path)?;
        std::os::unix::fs::symlink(&victim, &path)?;
        replace_file(&path, b"three", 0o644, false)?;
        assert_eq!(std::fs::read(&victim)?, b"keep");
        assert!(!std::fs::symlink_metadata(&path)?.file_type().is_symlink());
        let left: Vec<_> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .filter(|e| e.file_name() != "status.tmp")
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
        std::fs::remove_dir_all(&dir)
    }

    #[test]
    fn a_path_that_cannot_be_replaced_is_found_before_any_write() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("dhrd-replaceable-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        check_replaceable(&dir.join("status"))?;
        assert!(!dir.join("status").exists(), "the check made the file");
        assert_eq!(
            std::fs::read_dir(&dir)?.count(),
            0,
            "the check left its probe"
        );
        let missing = check_replaceable(&dir.join("no/such/dir/status"));
        assert_eq!(missing.map_err(|e| e.kind()), Err(io::ErrorKind::NotFound));
        let onto_dir = check_replaceable(&dir);
        assert_eq!(
            onto_dir.map_err(|e| e.kind()),
            Err(io::ErrorKind::IsADirectory)
        );
        std::fs::remove_dir_all(&dir)
    }
}
