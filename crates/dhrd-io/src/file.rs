//! A real file or block device as the durable backing.
//!
//! Writes are `pwrite` into the file; durability is `fdatasync` (the default, which lets the
//! engine share one sync among concurrent writers) or `O_DSYNC` on every write. Bulk reads
//! for the loader go through a second descriptor opened with `O_DIRECT`, so loading a volume
//! does not leave a second copy of it in the page cache; unaligned reads use the buffered
//! descriptor followed by `POSIX_FADV_DONTNEED` (drop-behind) when `drop_behind` is set.
//!
//! Crash semantics are the kernel's: what `fdatasync` returned `Ok` for is on the device.

use crate::Durable;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Alignment used for O_DIRECT buffers, offsets and lengths. 4 KiB satisfies every logical
/// block size in common use (512 and 4096).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// How a write is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteSync {
    /// `pwrite` then a separate `fdatasync`, shareable by concurrent writers (group commit).
    #[default]
    Fdatasync,
    /// Open with `O_DSYNC`: each `pwrite` is durable on return; `sync` is then cheap.
    ODsync,
}

#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Create the file if missing (never for block devices).
    pub create: bool,
    /// Extend (never shrink) a regular file to at least this many bytes at open.
    pub min_len: Option<u64>,
    pub write_sync: WriteSync,
    /// Use an O_DIRECT descriptor for aligned reads and bulk loading.
    pub direct_reads: bool,
    /// Drop the page-cache copy after buffered reads and after `sync`.
    pub drop_behind: bool,
    /// Open read-only (no writes, no sync needed).
    pub read_only: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            create: true,
            min_len: None,
            write_sync: WriteSync::Fdatasync,
            direct_reads: true,
            drop_behind: true,
            read_only: false,
        }
    }
}

/// A regular file or a block device used as the durable copy.
#[derive(Debug)]
pub struct FileBacking {
    path: PathBuf,
    file: File,
    write_sync: WriteSync,
    direct: Option<File>,
    block_device: bool,
    drop_behind: bool,
}

fn is_aligned(v: u64) -> bool {
    v.is_multiple_of(DIRECT_ALIGN_BYTES as u64)
}

impl FileBacking {
    /// Opens (or creates) `path` as a backing.
    pub fn open(path: &Path, opts: &FileOptions) -> io::Result<Self> {
        let meta = std::fs::metadata(path);
        let block_device = matches!(&meta, Ok(m) if m.file_type().is_block_device());
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if opts.create && !block_device && !opts.read_only {
            oo.create(true);
        }
        let mut flags = libc::O_CLOEXEC;
        if opts.write_sync == WriteSync::ODsync {
            flags |= libc::O_DSYNC;
        }
        oo.custom_flags(flags);
        let file = oo.open(path)?;
        let ft = file.metadata()?.file_type();
        if !(ft.is_file() || ft.is_block_device()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            ));
        }
        // O_DIRECT is optional: some file systems refuse it; then we fall back to drop-behind.
        let direct = if opts.direct_reads {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
                .open(path)
                .ok()
        } else {
            None
        };
        let me = Self {
            path: path.to_path_buf(),
            file,
            write_sync: opts.write_sync,
            direct,
            block_device: ft.is_block_device(),
            drop_behind: opts.drop_behind,
        };
        if let Some(min) = opts.min_len {
            if !me.block_device && me.len()? < min {
                me.file.set_len(min)?;
                me.file.sync_all()?;
            }
        }
        Ok(me)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// The buffered descriptor, for frontends that need `fstat` or similar.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn fadvise_dontneed(&self, offset: u64, len: u64) {
        // SAFETY: plain syscall on a descriptor we own; a failure is only a missed hint.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    fn direct_read(direct: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            match direct.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    if n % DIRECT_ALIGN_BYTES != 0 {
                        break; // short read at end of file
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn buffered_read(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            match self.file.read_at(rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.drop_behind && done > 0 {
            self.fadvise_dontneed(offset, done as u64);
        }
        Ok(done)
    }
}

impl Durable for FileBacking {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(direct) = &self.direct {
            if is_aligned(offset)
                && is_aligned(buf.len() as u64)
                && (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES)
            {
                return Self::direct_read(direct, buf, offset);
            }
        }
        self.buffered_read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        if self.block_device {
            let mut size: u64 = 0;
            // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
            const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
            // SAFETY: the ioctl writes one u64 into `size`, which outlives the call.
            let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut size) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(size)
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.block_device {
            if self.len()? == len {
                return Ok(());
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a block device's size cannot be changed",
            ));
        }
        self.file.set_len(len)
    }

    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Some(direct) = &self.direct else {
            return self.buffered_read(buf, offset);
        };
        if !is_aligned(offset) || !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
            return self.buffered_read(buf, offset);
        }
        let aligned = buf.len() - buf.len() % DIRECT_ALIGN_BYTES;
        let (head, tail) = buf.split_at_mut(aligned);
        let n = Self::direct_read(direct, head, offset)?;
        if n < aligned || tail.is_empty() {
            return Ok(n);
        }
        Ok(n + self.buffered_read(tail, offset + aligned as u64)?)
    }

    fn writes_are_durable(&self) -> bool {
        self.write_sync == WriteSync::ODsync
    }

    fn drop_cache(&self, offset: u64, len: u64) {
        if self.drop_behind {
            self.fadvise_dontneed(offset, len);
        }
    }

    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        if self.block_device || len == 0 {
            return false;
        }
        // SAFETY: lseek on our own descriptor; SEEK_DATA does not move shared state we use
        // (all our I/O is positional).
        let next = unsafe {
            libc::lseek(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                libc::SEEK_DATA,
            )
        };
        if next < 0 {
            // ENXIO: no data at or after offset.
            return io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        next as u64 >= offset + len
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.block_device {
            // SAFETY: fallocate on our own descriptor with plain integer arguments.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err);
            }
        }
        // Fallback: write zeros.
        const ZERO_BUF_BYTES: u64 = 1 << 20;
        let zeros = vec![0u8; ZERO_BUF_BYTES.min(len.max(1)) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let kind = if self.block_device {
            "block device"
        } else {
            "file"
        };
        let direct = if self.direct.is_some() {
            ", O_DIRECT loads"
        } else {
            ""
        };
        format!("{kind} {}{direct}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_holes() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("b");
        let f = FileBacking::open(
            &p,
            &FileOptions {
                min_len: Some(1 << 20),
                ..Default::default()
            },
        )?;
        assert_eq!(f.len()?, 1 << 20);
        assert!(f.is_zero_range(0, 1 << 20));
        f.write_at(b"hello", 4097)?;
        f.sync()?;
        let mut b = [0u8; 5];
        assert_eq!(f.read_at(&mut b, 4097)?, 5);
        assert_eq!(&b, b"hello");
        assert!(!f.is_zero_range(0, 8192));
        // Aligned bulk read through O_DIRECT (or the fallback) sees the same bytes.
        let mut page = vec![0u8; 2 * DIRECT_ALIGN_BYTES + DIRECT_ALIGN_BYTES];
        let off = page.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        let aligned = &mut page[off..off + 2 * DIRECT_ALIGN_BYTES];
        assert_eq!(f.read_bulk_at(aligned, 0)?, 2 * DIRECT_ALIGN_BYTES);
        assert_eq!(&aligned[4097..4102], b"hello");
        f.zero_range(4096, 4096)?;
        assert_eq!(f.read_at(&mut b, 4097)?, 5);
        assert_eq!(b, [0u8; 5]);
        f.set_len(10)?;
        assert_eq!(f.len()?, 10);
        Ok(())
    }
}
