//! The null file system: one regular file in a RAM mapping, served over either transport.
//! Its invariants are the parent module's (raw copies only, like a device).

use super::*;

/// Anonymous RAM mapping holding the file. See the module invariants for why raw copies.
pub(super) struct RamFile {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the mapping lives as long as the struct; all access is by raw copies within
// bounds checked by the caller (see the module invariants).
unsafe impl Send for RamFile {}
// SAFETY: as above.
unsafe impl Sync for RamFile {}

impl RamFile {
    pub(super) fn new(len: usize) -> anyhow::Result<Self> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap {len} bytes: {}", std::io::Error::last_os_error());
        }
        let f = Self { ptr: p.cast(), len };
        // Non-zero content so that neither side can shortcut zero pages.
        let mut block = [0u8; 4096];
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i * 7 + 1) as u8;
        }
        let mut off = 0;
        while off < len {
            let n = block.len().min(len - off);
            f.write_at(off, &block[..n]);
            off += n;
        }
        Ok(f)
    }

    pub(super) fn read_at(&self, off: usize, out: &mut [u8]) {
        debug_assert!(off + out.len() <= self.len);
        // SAFETY: bounds checked by the caller; `out` does not overlap the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }

    pub(super) fn write_at(&self, off: usize, data: &[u8]) {
        debug_assert!(off + data.len() <= self.len);
        // SAFETY: bounds checked by the caller; `data` does not overlap the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

impl Drop for RamFile {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer referenced.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Which transport carried a request.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    Dev,
    Ring,
}

pub(super) const OPCODE_SLOTS: usize = 64;

pub(super) struct Counters {
    pub(super) dev: Vec<AtomicU64>,
    pub(super) ring: Vec<AtomicU64>,
}

impl Counters {
    pub(super) fn new() -> Self {
        Self {
            dev: (0..OPCODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ring: (0..OPCODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn count(&self, via: Via, op: u32) {
        let slot = (op as usize).min(OPCODE_SLOTS - 1);
        let v = if via == Via::Dev {
            &self.dev
        } else {
            &self.ring
        };
        v[slot].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> (HashMap<String, u64>, HashMap<String, u64>) {
        let take = |v: &Vec<AtomicU64>| {
            v.iter()
                .enumerate()
                .filter_map(|(op, c)| {
                    let n = c.load(Ordering::Relaxed);
                    (n > 0).then(|| (opcode_name(op as u32), n))
                })
                .collect()
        };
        (take(&self.dev), take(&self.ring))
    }
}

pub(super) enum Outcome {
    /// Reply with `error` (negative errno or 0) and `len` bytes of reply arguments.
    Reply { error: i32, len: usize },
    /// FORGET, BATCH_FORGET, INTERRUPT: the kernel expects nothing.
    NoReply,
}

pub(super) struct NullFs {
    pub(super) file: RamFile,
    pub(super) size: u64,
    pub(super) counters: Counters,
    /// Stall probe: a READ of the last block sleeps STALL_MS while set.
    pub(super) stall: AtomicBool,
}

impl NullFs {
    pub(super) fn new(size: u64) -> anyhow::Result<Self> {
        Ok(Self {
            file: RamFile::new(size as usize)?,
            size,
            counters: Counters::new(),
            stall: AtomicBool::new(false),
        })
    }

    pub(super) fn stall_offset(&self) -> u64 {
        self.size - 4096
    }

    pub(super) fn attr_size(&self, ino: u64) -> u64 {
        if ino == ROOT_INO {
            4096
        } else {
            self.size
        }
    }

    /// Serves one request (not INIT). `first` is the per-opcode argument struct (for
    /// /dev/fuse: all arguments), `payload[..in_len]` the further arguments (io_uring);
    /// reply arguments are written to `payload`, after the inputs have been consumed.
    pub(super) fn handle(
        &self,
        h: &InHeader,
        via: Via,
        first: &[u8],
        payload: &mut [u8],
        in_len: usize,
    ) -> Outcome {
        self.counters.count(via, h.opcode);
        let ok = |len| Outcome::Reply { error: 0, len };
        let err = |e: i32| Outcome::Reply { error: -e, len: 0 };
        match h.opcode {
            abi::LOOKUP => {
                let name = lookup_name(first, &payload[..in_len]);
                if h.nodeid != ROOT_INO || name != FILE_NAME {
                    return err(libc::ENOENT);
                }
                let o = &mut payload[..abi::ENTRY_OUT_BYTES];
                o.fill(0);
                put_u64(o, 0, FILE_INO);
                put_u64(o, 8, 1);
                put_u64(o, 16, ATTR_VALID_SECS);
                put_u64(o, 24, ATTR_VALID_SECS);
                encode_attr(&mut o[40..], FILE_INO, self.size);
                ok(abi::ENTRY_OUT_BYTES)
            }
            abi::GETATTR => {
                if h.nodeid != ROOT_INO && h.nodeid != FILE_INO {
                    return err(libc::ENOENT);
                }
                let o = &mut payload[..abi::ATTR_OUT_BYTES];
                o.fill(0);
                put_u64(o, 0, ATTR_VALID_SECS);
                encode_attr(&mut o[16..], h.nodeid, self.attr_size(h.nodeid));
                ok(abi::ATTR_OUT_BYTES)
            }
            abi::OPEN => {
                let o = &mut payload[..abi::OPEN_OUT_BYTES];
                o.fill(0);
                put_u32(o, 8, abi::FOPEN_DIRECT_IO);
                ok(abi::OPEN_OUT_BYTES)
            }
            abi::READ => {
                if first.len() < 24 {
                    return err(libc::EINVAL);
                }
                let off = get_u64(first, 8);
                let want = get_u32(first, 16) as u64;
                if self.stall.load(Ordering::Relaxed) && off == self.stall_offset() {
                    std::thread::sleep(Duration::from_millis(STALL_MS));
                }
                let n = want
                    .min(self.size.saturating_sub(off))
                    .min(payload.len() as u64) as usize;
                self.file.read_at(off as usize, &mut payload[..n]);
                ok(n)
            }
            abi::WRITE => {
                if first.len() < 24 {
                    return err(libc::EINVAL);
                }
                let off = get_u64(first, 8);
                let want = get_u32(first, 16) as usize;
                // /dev/fuse: data follows write_in; io_uring: data is the payload.
                let data = if in_len > 0 {
                    &payload[..in_len.min(want)]
                } else if first.len() >= abi::WRITE_IN_BYTES {
                    let d = &first[abi::WRITE_IN_BYTES..];
                    &d[..d.len().min(want)]
                } else {
                    return err(libc::EINVAL);
                };
                let n = (data.len() as u64).min(self.size.saturating_sub(off)) as usize;
                self.file.write_at(off as usize, &data[..n]);
                let o = &mut payload[..abi::WRITE_OUT_BYTES];
                o.fill(0);
                put_u32(o, 0, n as u32);
                ok(abi::WRITE_OUT_BYTES)
            }
            abi::FLUSH | abi::RELEASE | abi::FSYNC | abi::DESTROY => ok(0),
            abi::STATFS => {
                let o = &mut payload[..abi::STATFS_OUT_BYTES];
                o.fill(0);
                let blocks = self.size / 4096;
                put_u64(o, 0, blocks);
                put_u64(o, 24, 2);
                put_u32(o, 40, 4096);
                put_u32(o, 44, 255);
                put_u32(o, 48, 4096);
                ok(abi::STATFS_OUT_BYTES)
            }
            abi::FORGET | abi::BATCH_FORGET | abi::INTERRUPT => Outcome::NoReply,
            // ENOSYS makes the kernel stop asking (no_getxattr / no_listxattr).
            abi::GETXATTR | abi::LISTXATTR => err(libc::ENOSYS),
            _ => err(libc::ENOSYS),
        }
    }
}
