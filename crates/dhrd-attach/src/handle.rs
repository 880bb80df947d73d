//! File handles: how fanotify names files (FID reporting), and the key the warm-up knows a
//! file by.
//!
//! Why handles and not inode numbers: a fanotify event names its file by a handle, also
//! after the file lost its last name (a delete), when it can no longer be opened or
//! stat'ed by path; a handle also tells a reused inode number from the file that had it
//! (it carries the generation on ext4). The key is a 64-bit hash of the handle, the same
//! whether the handle came from an event or from `name_to_handle_at` during a walk:
//! both ask for the file-identifier form (`AT_HANDLE_FID`, what fanotify reports).
//!
//! Invariants: a `Handle` is immutable; equal handles have equal keys. Two different files
//! share a key only by a 64-bit hash collision, which costs one of them its residency (it
//! is taken for the other), never data. No state and no crash semantics.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Most bytes of a handle (linux/exportfs.h `MAX_HANDLE_SZ`).
pub const HANDLE_BYTES_MAX: usize = libc::MAX_HANDLE_SZ as usize;

/// One file's handle on its file system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Handle {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; HANDLE_BYTES_MAX],
}

impl Handle {
    /// The handle of `name` in directory `dir` (never following a symlink), or of `dir`
    /// itself when `name` is None.
    pub fn of(dir: BorrowedFd<'_>, name: Option<&CStr>) -> io::Result<Handle> {
        let mut raw = RawHandle {
            handle_bytes: HANDLE_BYTES_MAX as u32,
            handle_type: 0,
            f_handle: [0; HANDLE_BYTES_MAX],
        };
        let mut mount_id: libc::c_int = 0;
        let (path, flags) = match name {
            Some(n) => (n, libc::AT_HANDLE_FID),
            None => (c"", libc::AT_HANDLE_FID | libc::AT_EMPTY_PATH),
        };
        // SAFETY: `raw` is a file_handle with `handle_bytes` bytes of room after its
        // header, `path` is NUL-terminated, `mount_id` is a live int; the kernel writes
        // within those.
        let r = unsafe {
            libc::name_to_handle_at(
                dir.as_raw_fd(),
                path.as_ptr(),
                (&mut raw as *mut RawHandle).cast::<libc::file_handle>(),
                &mut mount_id,
                flags,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let n = (raw.handle_bytes as usize).min(HANDLE_BYTES_MAX);
        Ok(Handle {
            handle_type: raw.handle_type,
            bytes: raw.f_handle[..n].to_vec(),
        })
    }

    /// The handle in a fanotify info record: `handle_bytes` (u32), `handle_type` (i32),
    /// then the bytes. Returns the handle and the bytes after it (a name, for the records
    /// that carry one). None if the record is cut short.
    pub fn parse(b: &[u8]) -> Option<(Handle, &[u8])> {
        let len = u32::from_ne_bytes(b.get(0..4)?.try_into().ok()?) as usize;
        let handle_type = i32::from_ne_bytes(b.get(4..8)?.try_into().ok()?);
        let bytes = b.get(8..8 + len)?.to_vec();
        Some((Handle { handle_type, bytes }, &b[8 + len..]))
    }

    /// The warm-up's key of this file (FNV-1a over type and bytes).
    pub fn key(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self
            .handle_type
            .to_ne_bytes()
            .iter()
            .chain(self.bytes.iter())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }

    /// Opens the file by its handle (`mount_fd`: any descriptor on its file system).
    /// Needs CAP_DAC_READ_SEARCH. ESTALE once the file is gone.
    pub fn open(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        if self.bytes.len() > HANDLE_BYTES_MAX {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as u32,
            handle_type: self.handle_type,
            f_handle: [0; HANDLE_BYTES_MAX],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        // SAFETY: `raw` is a valid file_handle of `handle_bytes` bytes; the kernel only
        // reads it.
        let fd = unsafe {
            libc::open_by_handle_at(
                mount_fd.as_raw_fd(),
                (&mut raw as *mut RawHandle).cast::<libc::file_handle>(),
                flags | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: open_by_handle_at returned a new descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_file_has_the_same_key_by_name_and_by_descriptor_and_opens_by_handle() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("f"), b"x").expect("write");
        let dir = std::fs::File::open(d.path()).expect("dir");
        let by_name = match Handle::of(dir.as_fd(), Some(c"f")) {
            Ok(h) => h,
            Err(e) => {
                dhrd_testkit::skip(format!("no file handles here: {e}"));
                return;
            }
        };
        let f = std::fs::File::open(d.path().join("f")).expect("open");
        let by_fd = Handle::of(f.as_fd(), None).expect("handle");
        assert_eq!(by_name, by_fd);
        assert_eq!(by_name.key(), by_fd.key());
        let other = Handle::of(dir.as_fd(), None).expect("dir handle");
        assert_ne!(other.key(), by_name.key());
        match by_name.open(dir.as_fd(), libc::O_RDONLY) {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd).expect("fstat");
                assert_eq!(st.st_size, 1);
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                dhrd_testkit::skip("open_by_handle_at needs CAP_DAC_READ_SEARCH");
            }
            Err(e) => panic!("open by handle: {e}"),
        }
        // The record layout fanotify uses: length, type, bytes, then what follows.
        let mut rec = (by_name.bytes.len() as u32).to_ne_bytes().to_vec();
        rec.extend(by_name.handle_type.to_ne_bytes());
        rec.extend(&by_name.bytes);
        rec.extend(b"name\0");
        let (h, rest) = Handle::parse(&rec).expect("parse");
        assert_eq!(h, by_name);
        assert_eq!(rest, b"name\0");
        assert!(Handle::parse(&rec[..6]).is_none());
    }
}
