//! `ConfinedFile`: one backing file as the durable copy of a hybrid object.
//!
//! Why not `dhrd_io::FileBacking`: it opens by path (following symlinks, outside any
//! confinement) and holds two descriptors per file. Here the descriptor is obtained by the
//! caller through the confined `openat2` of `sys.rs`, so the durable copy is exactly the
//! inode the daemon looked up, and each object costs one backing descriptor (plus the
//! engine's memfd), which matters for trees of 500k files.
//!
//! Invariants: writes are `pwrite`; `sync` is `fdatasync` (which also makes a size change
//! durable) and only then drops the written pages from the page cache, so neither writes
//! nor loads leave a second copy of the data in the page cache (drop-behind, SPEC I8).
//! Crash semantics are the kernel's: what `fdatasync` returned `Ok` for is on the device.

use dhrd_io::Durable;
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;

/// Size of the zero buffer used when the file system cannot punch holes.
const ZERO_FALLBACK_BUF_BYTES: u64 = 64 * 1024;

#[derive(Debug)]
pub struct ConfinedFile {
    file: File,
    /// Byte range written since the last sync, dropped from the page cache after the sync.
    dirty: Mutex<Option<(u64, u64)>>,
    name: String,
}

impl ConfinedFile {
    pub fn new(file: File, name: String) -> Self {
        Self {
            file,
            dirty: Mutex::new(None),
            name,
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    fn fadvise_dontneed(&self, offset: u64, len: u64) {
        // SAFETY: plain syscall on a descriptor we own; failure only loses a hint.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    fn mark_dirty(&self, offset: u64, len: u64) {
        let mut d = self.dirty.lock();
        let end = offset.saturating_add(len);
        *d = Some(match *d {
            None => (offset, end),
            Some((s, e)) => (s.min(offset), e.max(end)),
        });
    }
}

impl Durable for ConfinedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let Some(rest) = buf.get_mut(done..) else {
                break;
            };
            match self.file.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        self.mark_dirty(offset, buf.len() as u64);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let range = self.dirty.lock().take();
        if let Err(e) = rustix::fs::fdatasync(self.file.as_fd()) {
            // Keep the range: the pages are still dirty and must not be dropped as clean.
            if let Some((s, e2)) = range {
                self.mark_dirty(s, e2 - s);
            }
            return Err(e.into());
        }
        if let Some((s, e)) = range {
            self.fadvise_dontneed(s, e - s);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.read_at(buf, offset)?;
        self.fadvise_dontneed(offset, n as u64);
        Ok(n)
    }

    fn drop_cache(&self, offset: u64, len: u64) {
        self.fadvise_dontneed(offset, len);
    }

    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        // SEEK_DATA from `offset`: no data before offset+len means the range is a hole.
        match rustix::fs::seek(self.file.as_fd(), rustix::fs::SeekFrom::Data(offset)) {
            Ok(next) => next >= offset.saturating_add(len),
            Err(rustix::io::Errno::NXIO) => true,
            Err(_) => false,
        }
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(self.file.as_fd(), flags, offset, len) {
            Ok(()) => {
                self.mark_dirty(offset, len);
                Ok(())
            }
            Err(rustix::io::Errno::OPNOTSUPP) => {
                let zeros = vec![0u8; ZERO_FALLBACK_BUF_BYTES.min(len.max(1)) as usize];
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(zeros.len() as u64) as usize;
                    self.write_at(zeros.get(..n).unwrap_or(&[]), offset + done)?;
                    done += n as u64;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
