//! Extended attributes of an open file: where a cache marks a backing file that lacks data
//! the cache holds (`dhrd_tier::pairing`).
//!
//! Invariants: none of its own; a file system without user extended attributes reads as
//! "no attribute" and refuses to set one with `ErrorKind::Unsupported`, so callers can say
//! so and go on.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Longest attribute value read.
const VALUE_BYTES_MAX: usize = 4096;

fn name_of(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::EPERM))
}

/// The value of attribute `name` of `file`; None when it has none, or the file system
/// keeps no user attributes.
pub fn get(file: &File, name: &str) -> io::Result<Option<Vec<u8>>> {
    let n = name_of(name)?;
    let mut buf = vec![0u8; VALUE_BYTES_MAX];
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of the given length.
    let rc = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) || unsupported(&e) {
            return Ok(None);
        }
        return Err(e);
    }
    buf.truncate(rc as usize);
    Ok(Some(buf))
}

/// Sets attribute `name` of `file` to `value`. `ErrorKind::Unsupported` where the file
/// system keeps no user attributes.
pub fn set(file: &File, name: &str, value: &[u8]) -> io::Result<()> {
    let n = name_of(name)?;
    // SAFETY: a valid descriptor, a NUL-terminated name and a value of the given length.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if unsupported(&e) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, e));
        }
        return Err(e);
    }
    Ok(())
}

/// Removes attribute `name` of `file`; Ok when it had none.
pub fn remove(file: &File, name: &str) -> io::Result<()> {
    let n = name_of(name)?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let rc = unsafe { libc::fremovexattr(file.as_raw_fd(), n.as_ptr()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) || unsupported(&e) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_remove() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("dhrd-xattr-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("f");
        let f = File::create(&path)?;
        // The suite's file system must keep user xattrs: the cache mark lives in one.
        if let Err(e) = set(&f, "user.dhrd.test", b"v1") {
            panic!(
                "{} keeps no user extended attributes ({e}); run the tests with TMPDIR on \
                 ext4, xfs, btrfs or tmpfs (Linux 6.6 or later)",
                dir.display()
            );
        }
        assert_eq!(get(&f, "user.dhrd.test")?, Some(b"v1".to_vec()));
        remove(&f, "user.dhrd.test")?;
        assert_eq!(get(&f, "user.dhrd.test")?, None);
        remove(&f, "user.dhrd.test")?;
        std::fs::remove_dir_all(&dir)
    }
}
