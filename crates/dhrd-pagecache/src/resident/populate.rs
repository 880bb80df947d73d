//! Warming a range of a file through a mapping of it, for [`Folios::Large`]: a read-only
//! shared mapping advised `MADV_HUGEPAGE` and `MADV_RANDOM`, then `MADV_POPULATE_READ`.
//!
//! Why not `read(2)` (measured 2026-11-29 on a virtio disk whose `read_ahead_kb` is 8,192,
//! one cold 1.5 GiB file, a second process reading 4 KiB of another cold file every
//! 20 ms meanwhile): sequential reads build readahead windows of up to 8 MiB and keep two
//! of them at the disk, so a reader of a file not yet warm queued behind them (median
//! 1.2-2.8 ms, worst 11-31 ms per 4 KiB read, four warm-up threads: up to 61 ms). A fault
//! in a mapping advised `MADV_HUGEPAGE` reads the 2 MiB-aligned stretch around it as one
//! folio of that size, and `MADV_RANDOM` stops the readahead after it, so a thread has 2
//! MiB at the disk at a time (the other reader: median 0.5-0.8 ms, worst 1.9-2.6 ms). The
//! file was also warm sooner (1.5 GiB in about 0.9 s against 2 s), with no copy to a
//! buffer, and its pages are in 2 MiB folios, the largest the page cache makes. A file
//! system without large folios gets 2 MiB of order-0 pages per fault, still one read.
//!
//! Invariants: a [`Mapped`] owns its mapping ([`FileMap`]: never dereferenced, unmapped
//! once). Populating goes through `madvise`, so a file that shrank meanwhile, or a read
//! that failed, is an `EFAULT` of the call, never a SIGBUS; the file's size tells which,
//! and a failed read fails the range as a failed `read(2)` would. The advice applies to
//! this mapping only: other readers of the file keep their own readahead. A warm-up
//! thread holds at most one at a time, so they stay within the mappings `mapcount.rs`
//! leaves to the rest of the process.
//!
//! Crash semantics: none; what was read stays in the page cache.
//!
//! [`Folios::Large`]: super::config::Folios::Large

use super::pin::FileMap;
use super::state::{file_size, page_ceil};
use std::fs::File;
use std::io;

/// `MADV_POPULATE_READ` (Linux 5.14); the libc crate does not name it for every target.
const MADV_POPULATE_READ: libc::c_int = 22;

/// What one [`Mapped::populate`] call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Populated {
    /// Every page of the range is in the page cache.
    Done,
    /// The file ends before the range does (it shrank since it was sized).
    PastEnd,
}

/// A mapping of a range of a file, advised for warming.
pub(super) struct Mapped {
    map: FileMap,
}

impl Mapped {
    /// Maps and advises the range; `offset` is page-aligned (segments start at multiples of
    /// `WARM_SEGMENT_BYTES`). An error means this way is not available here (no
    /// `MADV_HUGEPAGE` without transparent huge pages, no mapping of this file): the caller
    /// reads instead.
    pub(super) fn new(file: &File, offset: u64, len: u64) -> io::Result<Self> {
        let m = Mapped {
            map: FileMap::new(file, offset, len)?,
        };
        // Huge pages first: `MADV_RANDOM` alone would make every fault read one page.
        m.advise(0, m.map.len, libc::MADV_HUGEPAGE)?;
        m.advise(0, m.map.len, libc::MADV_RANDOM)?;
        Ok(m)
    }

    /// Brings `len` bytes from `at` (relative to the mapping's start) into the page cache.
    /// A fault the kernel would have answered with SIGBUS is `EFAULT` here: either the file
    /// ends before the range (it shrank since it was sized), or reading it failed, which
    /// the file's size tells apart.
    pub(super) fn populate(&self, file: &File, at: usize, len: usize) -> io::Result<Populated> {
        loop {
            match self.advise(at, len, MADV_POPULATE_READ) {
                Ok(()) => return Ok(Populated::Done),
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    // The last page of a file is mapped whole, so the file ends before
                    // the range only if its pages do.
                    let end = self.map.offset + (at + len) as u64;
                    return if page_ceil(file_size(file)?) < end {
                        Ok(Populated::PastEnd)
                    } else {
                        Err(io::Error::from_raw_os_error(libc::EIO))
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn advise(&self, at: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        // SAFETY: advice on a part of the mapping this value owns (`addr_of` checks the
        // range); no memory is touched from user space.
        if unsafe { libc::madvise(self.map.addr_of(at, len), len, advice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use dhrd_io::PAGE_BYTES;
    use std::io::Write;

    #[test]
    fn a_range_past_the_end_of_the_file_is_told_from_one_inside_it() {
        let d = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let p = d.path().join("f");
        let mut f = File::create(&p).expect("create");
        f.write_all(&vec![7u8; 4 << 20]).expect("write");
        let f = File::open(&p).expect("open");
        // Mapped beyond the end, as a file that shrank after it was sized would be.
        let m = Mapped::new(&f, 0, 8 << 20).expect("map");
        assert_eq!(m.populate(&f, 0, 4 << 20).expect("inside"), Populated::Done);
        assert_eq!(
            m.populate(&f, 4 << 20, 2 << 20).expect("past the end"),
            Populated::PastEnd
        );
        // A last page partly past the end is the file's own: populated, not past it.
        let q = d.path().join("g");
        std::fs::write(&q, vec![7u8; 5000]).expect("write");
        let g = File::open(&q).expect("open");
        let m = Mapped::new(&g, 0, 2 * PAGE_BYTES).expect("map");
        assert_eq!(
            m.populate(&g, 0, 2 * PAGE_BYTES as usize)
                .expect("partial page"),
            Populated::Done
        );
    }
}
