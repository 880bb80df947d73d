//! How a range of storage is allocated: the answer of [`crate::Durable::extent_at`], and
//! [`seek_extent`], which finds it in a file with `SEEK_DATA` / `SEEK_HOLE`.
//!
//! Invariants:
//! - an extent is never empty and never longer than the length it was asked about;
//! - `Hole` and `Zero` are promises that the range reads as zeros; `Data` promises
//!   nothing (it is what any backing may answer when it does not know), so a wrong `Data`
//!   costs only efficiency, a wrong `Hole` would lose data for a sparse copy.
//!
//! Crash semantics: none; this only reports.

use std::io;
use std::os::fd::RawFd;

/// How one extent is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Allocated, or not known to be anything else.
    Data,
    /// Reads as zeros, but storage is allocated (writes need no new space).
    Zero,
    /// Not allocated: reads as zeros.
    Hole,
}

impl Allocation {
    /// Whether the extent is known to read as zeros.
    pub fn reads_as_zeros(self) -> bool {
        !matches!(self, Allocation::Data)
    }
}

/// A run of bytes with one [`Allocation`], starting where it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub allocation: Allocation,
}

impl Extent {
    pub fn data(len: u64) -> Self {
        Self {
            len,
            allocation: Allocation::Data,
        }
    }
}

fn lseek(fd: RawFd, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on a descriptor the caller keeps open; SEEK_DATA/SEEK_HOLE move the
    // file position only, which positional I/O (pread/pwrite) never uses.
    let r = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // ENXIO: no data (SEEK_DATA) at or after `offset`, or `offset` at or past the end.
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// The extent of the file `fd` that starts at `offset`, at most `max_len` bytes long
/// (`max_len > 0`): a hole up to the next data, or data up to the next hole. A file
/// system without `SEEK_DATA` answers `Data` (EINVAL, EOPNOTSUPP), as does any other
/// error: the safe answer, never a hole that is not one.
pub fn seek_extent(fd: RawFd, offset: u64, max_len: u64) -> Extent {
    assert!(max_len > 0, "an extent of nothing");
    let end = offset.saturating_add(max_len);
    let clip = |to: u64| to.clamp(offset + 1, end) - offset;
    match lseek(fd, offset, libc::SEEK_DATA) {
        // No data from here to the end of the file: a hole to the end of the question.
        Ok(None) => Extent {
            len: max_len,
            allocation: Allocation::Hole,
        },
        Ok(Some(data)) if data > offset => Extent {
            len: clip(data),
            allocation: Allocation::Hole,
        },
        Ok(Some(_)) => match lseek(fd, offset, libc::SEEK_HOLE) {
            // Every file has a hole at its end, so None only if it shrank meanwhile.
            Ok(Some(hole)) if hole > offset => Extent::data(clip(hole)),
            _ => Extent::data(max_len),
        },
        Err(_) => Extent::data(max_len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;

    #[test]
    fn holes_and_data_of_a_sparse_file() {
        let dir = std::env::temp_dir().join(format!("dhrd-extent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("sparse");
        let f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let mib = 1u64 << 20;
        f.set_len(8 * mib).unwrap_or_else(|e| panic!("{e}"));
        f.write_all_at(&[7u8; 4096], 2 * mib)
            .unwrap_or_else(|e| panic!("{e}"));
        let fd = f.as_raw_fd();
        let e = seek_extent(fd, 0, 8 * mib);
        if e.allocation == Allocation::Data {
            // tmpfs and every common disk file system report holes; say so if not.
            eprintln!("NOTE: the temp directory's file system reports no holes");
            return;
        }
        assert_eq!(
            e,
            Extent {
                len: 2 * mib,
                allocation: Allocation::Hole
            }
        );
        let d = seek_extent(fd, 2 * mib, 8 * mib);
        assert_eq!(d.allocation, Allocation::Data);
        assert!(d.len >= 4096 && d.len < 6 * mib, "{d:?}");
        // Clipped to the question, and a hole past the last data runs to the end.
        assert_eq!(seek_extent(fd, 0, 4096).len, 4096);
        let tail = seek_extent(fd, 4 * mib, 4 * mib);
        assert_eq!(
            tail,
            Extent {
                len: 4 * mib,
                allocation: Allocation::Hole
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
