//! `fuse-transport`: what the FUSE transport alone costs, /dev/fuse against FUSE over
//! io_uring, measured with a "null server" that does no work of its own.
//!
//! The server speaks the raw FUSE protocol (no fuser, no libfuse) and serves one regular file
//! held in an anonymous RAM mapping: READ copies out of it, WRITE copies into it and
//! acknowledges. Every open gets FOPEN_DIRECT_IO, so every 4 KiB read or write of fio is one
//! request and one reply through the transport under test. It runs over two transports:
//! - legacy: T threads, each blocking in read() on its own clone of the /dev/fuse descriptor
//!   and replying with writev() (what fuser and dhrd do today);
//! - io_uring (kernel >= 6.14, `fuse.enable_uring`): one queue per possible CPU, each served
//!   by one thread pinned to that CPU with its own ring of SQE128 URING_CMDs; the kernel puts
//!   a request on the queue of the CPU the caller runs on. A /dev/fuse reader stays for what
//!   the kernel still sends that way.
//!
//! fio runs against each mount and against a tmpfs file in the same invocation, in
//! interleaved rounds with rotating order; the report takes medians of per-round ratios.
//!
//! Invariants:
//! - `enable_uring` is only changed while the io_uring server negotiates (the kernel checks it
//!   when it sends INIT, when it processes the INIT reply and at the first REGISTER; once the
//!   connection has io_uring it stays on), and the previous value is always restored,
//!   also on errors and on SIGINT/SIGTERM.
//! - Every mount made here is unmounted before `run` returns (lazy unmount and a connection
//!   abort as last resorts); no server thread outlives its mount by design.
//! - The RAM file is shared memory between server threads, accessed only by raw copies, like
//!   a device: overlapping concurrent writes leave unspecified bytes, never torn metadata.
//! - It is experiment 8 of the benchmark suite (`bench/suite`, so its tiny profile runs it
//!   in the default test suite): the floor under any request a FUSE daemon serves, on
//!   which the choice of dhrd's transport rests. It needs root, fio and, for the io_uring
//!   half, a kernel built with CONFIG_FUSE_IO_URING (without it that half is reported as
//!   unavailable).

use crate::machine::Machine;
use anyhow::{bail, Context};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Bounds and tunables
// ---------------------------------------------------------------------------------------

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Largest WRITE the server accepts (INIT's max_write) and largest READ it is sent.
const MAX_WRITE: u32 = 128 * KIB as u32;
/// INIT's max_pages: MAX_WRITE in 4 KiB pages (the kernel sizes ring payloads from it).
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;
/// A /dev/fuse read must have room for the largest request: header, write_in, MAX_WRITE.
const LEGACY_BUF_BYTES: usize = MAX_WRITE as usize + 4096;
/// Ring payload buffer per entry; the kernel refuses less than max(8 KiB, max_write,
/// max_pages * 4 KiB).
const PAYLOAD_BYTES: usize = MAX_WRITE as usize;
/// Ring entries (requests in flight) per queue. fio QD1 with 2 jobs needs one per CPU;
/// a few more cover background requests (RELEASE) arriving meanwhile.
const ENTRIES_PER_QUEUE: usize = 4;
/// Attribute and entry timeouts: nothing but this server changes the file.
const ATTR_VALID_SECS: u64 = 3600;
/// How long teardown waits for server threads after unmounting before aborting the
/// connection, and again after the abort.
const THREAD_EXIT_WAIT: Duration = Duration::from_secs(5);
/// The request the stall probe makes the server sleep on, and for how long.
const STALL_MS: u64 = 200;
/// When the stall probe's second reader starts after the first.
const STALL_PROBE_DELAY: Duration = Duration::from_millis(20);
/// fio ramp time before each measured run (seconds).
const FIO_RAMP_SECS: u32 = 1;
/// Name of the one file in the null file system.
const FILE_NAME: &[u8] = b"data";
const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

// ---------------------------------------------------------------------------------------
// FUSE ABI (include/uapi/linux/fuse.h), only what the null server uses
// ---------------------------------------------------------------------------------------

mod abi {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;

    pub const IN_HEADER_BYTES: usize = 40;
    pub const OUT_HEADER_BYTES: usize = 16;
    pub const ATTR_BYTES: usize = 88;
    pub const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
    pub const ATTR_OUT_BYTES: usize = 16 + ATTR_BYTES;
    pub const OPEN_OUT_BYTES: usize = 16;
    pub const WRITE_IN_BYTES: usize = 40;
    pub const WRITE_OUT_BYTES: usize = 8;
    pub const STATFS_OUT_BYTES: usize = 80;
    pub const INIT_OUT_BYTES: usize = 64;

    pub const KERNEL_MAJOR: u32 = 7;
    /// INIT flags (the low 32 bits; flags2 holds bits 32..63).
    pub const FLAG_MAX_PAGES: u32 = 1 << 22;
    pub const FLAG_INIT_EXT: u32 = 1 << 30;
    /// FUSE_OVER_IO_URING is bit 41 of the 64-bit flags, i.e. bit 9 of flags2.
    pub const FLAG2_OVER_IO_URING: u32 = 1 << (41 - 32);
    pub const FOPEN_DIRECT_IO: u32 = 1 << 0;

    /// _IOR(229, 0, uint32_t)
    pub const DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

    /// fuse_uring_req_header: in_out[128] op_in[128] ent_in_out{flags, commit_id,
    /// payload_sz, padding, reserved}.
    pub const RING_IN_OUT_OFF: usize = 0;
    pub const RING_OP_IN_OFF: usize = 128;
    pub const RING_OP_IN_BYTES: usize = 128;
    pub const RING_ENT_OFF: usize = 256;
    pub const RING_COMMIT_ID_OFF: usize = RING_ENT_OFF + 8;
    pub const RING_PAYLOAD_SZ_OFF: usize = RING_ENT_OFF + 16;
    pub const RING_HEADER_BYTES: usize = 288;
    /// The io_uring command numbers (sqe->cmd_op) and the iovec count REGISTER wants.
    pub const URING_CMD_REGISTER: u32 = 1;
    pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
    pub const URING_IOV_SEGS: u32 = 2;
}

// ---------------------------------------------------------------------------------------
// Pure helpers: little-endian fields, request parsing, reply encoding
// ---------------------------------------------------------------------------------------

fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InHeader {
    len: u32,
    opcode: u32,
    unique: u64,
    nodeid: u64,
    pid: u32,
}

fn parse_in_header(b: &[u8]) -> Option<InHeader> {
    if b.len() < abi::IN_HEADER_BYTES {
        return None;
    }
    Some(InHeader {
        len: get_u32(b, 0),
        opcode: get_u32(b, 4),
        unique: get_u64(b, 8),
        nodeid: get_u64(b, 16),
        pid: get_u32(b, 32),
    })
}

fn encode_out_header(b: &mut [u8], len: usize, error: i32, unique: u64) {
    put_u32(b, 0, len as u32);
    put_u32(b, 4, error as u32);
    put_u64(b, 8, unique);
}

fn encode_attr(b: &mut [u8], ino: u64, size: u64) {
    b[..abi::ATTR_BYTES].fill(0);
    let (mode, nlink) = if ino == ROOT_INO {
        (libc::S_IFDIR | 0o755, 2)
    } else {
        (libc::S_IFREG | 0o644, 1)
    };
    put_u64(b, 0, ino);
    put_u64(b, 8, size);
    put_u64(b, 16, size.div_ceil(512));
    put_u32(b, 60, mode);
    put_u32(b, 64, nlink);
    put_u32(b, 80, 4096);
}

/// The name of a LOOKUP: the kernel may put it in op_in or in the payload (io_uring) or
/// both concatenated (/dev/fuse); it ends at the first NUL.
fn lookup_name(first: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = first.iter().chain(rest.iter()).copied().collect();
    if let Some(p) = v.iter().position(|&c| c == 0) {
        v.truncate(p);
    }
    v
}

/// INIT reply; returns whether io_uring was accepted (offered by the kernel and wanted).
fn encode_init_out(init_in: &[u8], want_uring: bool, out: &mut [u8]) -> (usize, bool) {
    let minor = get_u32(init_in, 4);
    let max_readahead = get_u32(init_in, 8);
    let flags = get_u32(init_in, 12);
    let flags2 = if flags & abi::FLAG_INIT_EXT != 0 {
        get_u32(init_in, 16)
    } else {
        0
    };
    let uring = want_uring && flags2 & abi::FLAG2_OVER_IO_URING != 0;
    out[..abi::INIT_OUT_BYTES].fill(0);
    put_u32(out, 0, abi::KERNEL_MAJOR);
    put_u32(out, 4, minor);
    put_u32(out, 8, max_readahead);
    put_u32(out, 12, flags & (abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES));
    put_u16(out, 16, 16); // max_background
    put_u16(out, 18, 12); // congestion_threshold
    put_u32(out, 20, MAX_WRITE);
    put_u32(out, 24, 1); // time_gran
    put_u16(out, 28, MAX_PAGES);
    put_u32(out, 32, if uring { abi::FLAG2_OVER_IO_URING } else { 0 });
    (abi::INIT_OUT_BYTES, uring)
}

fn opcode_name(op: u32) -> String {
    let n = match op {
        abi::LOOKUP => "LOOKUP",
        abi::FORGET => "FORGET",
        abi::GETATTR => "GETATTR",
        4 => "SETATTR",
        abi::OPEN => "OPEN",
        abi::READ => "READ",
        abi::WRITE => "WRITE",
        abi::STATFS => "STATFS",
        abi::RELEASE => "RELEASE",
        abi::FSYNC => "FSYNC",
        abi::GETXATTR => "GETXATTR",
        abi::LISTXATTR => "LISTXATTR",
        abi::FLUSH => "FLUSH",
        abi::INIT => "INIT",
        27 => "OPENDIR",
        28 => "READDIR",
        29 => "RELEASEDIR",
        34 => "ACCESS",
        35 => "CREATE",
        abi::INTERRUPT => "INTERRUPT",
        abi::DESTROY => "DESTROY",
        abi::BATCH_FORGET => "BATCH_FORGET",
        43 => "FALLOCATE",
        44 => "READDIRPLUS",
        46 => "LSEEK",
        52 => "STATX",
        _ => return format!("op{op}"),
    };
    n.to_string()
}

// ---------------------------------------------------------------------------------------
// The null file system
// ---------------------------------------------------------------------------------------

/// Anonymous RAM mapping holding the file. See the module invariants for why raw copies.
struct RamFile {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as the struct; all access is by raw copies within
// bounds checked by the caller (see the module invariants).
unsafe impl Send for RamFile {}
// SAFETY: as above.
unsafe impl Sync for RamFile {}

impl RamFile {
    fn new(len: usize) -> anyhow::Result<Self> {
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

    fn read_at(&self, off: usize, out: &mut [u8]) {
        debug_assert!(off + out.len() <= self.len);
        // SAFETY: bounds checked by the caller; `out` does not overlap the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }

    fn write_at(&self, off: usize, data: &[u8]) {
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
enum Via {
    Dev,
    Ring,
}

const OPCODE_SLOTS: usize = 64;

struct Counters {
    dev: Vec<AtomicU64>,
    ring: Vec<AtomicU64>,
}

impl Counters {
    fn new() -> Self {
        Self {
            dev: (0..OPCODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ring: (0..OPCODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn count(&self, via: Via, op: u32) {
        let slot = (op as usize).min(OPCODE_SLOTS - 1);
        let v = if via == Via::Dev {
            &self.dev
        } else {
            &self.ring
        };
        v[slot].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> (HashMap<String, u64>, HashMap<String, u64>) {
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

enum Outcome {
    /// Reply with `error` (negative errno or 0) and `len` bytes of reply arguments.
    Reply { error: i32, len: usize },
    /// FORGET, BATCH_FORGET, INTERRUPT: the kernel expects nothing.
    NoReply,
}

struct NullFs {
    file: RamFile,
    size: u64,
    counters: Counters,
    /// Stall probe: a READ of the last block sleeps STALL_MS while set.
    stall: AtomicBool,
}

impl NullFs {
    fn new(size: u64) -> anyhow::Result<Self> {
        Ok(Self {
            file: RamFile::new(size as usize)?,
            size,
            counters: Counters::new(),
            stall: AtomicBool::new(false),
        })
    }

    fn stall_offset(&self) -> u64 {
        self.size - 4096
    }

    fn attr_size(&self, ino: u64) -> u64 {
        if ino == ROOT_INO {
            4096
        } else {
            self.size
        }
    }

    /// Serves one request (not INIT). `first` is the per-opcode argument struct (for
    /// /dev/fuse: all arguments), `payload[..in_len]` the further arguments (io_uring);
    /// reply arguments are written to `payload`, after the inputs have been consumed.
    fn handle(
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

// ---------------------------------------------------------------------------------------
// Mounting and the /dev/fuse (legacy) transport
// ---------------------------------------------------------------------------------------

fn cstr(p: &Path) -> anyhow::Result<CString> {
    Ok(CString::new(p.as_os_str().as_encoded_bytes())?)
}

fn open_dev_fuse() -> anyhow::Result<OwnedFd> {
    // SAFETY: plain open of a device path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        bail!("open /dev/fuse: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A second descriptor on the same connection, so that each thread blocks on its own.
fn clone_dev_fuse(master: RawFd) -> anyhow::Result<OwnedFd> {
    let fd = open_dev_fuse()?;
    let mut m: u32 = master as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the master fd) from the pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), abi::DEV_IOC_CLONE, &mut m) };
    if r != 0 {
        bail!("FUSE_DEV_IOC_CLONE: {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

fn mount_fuse(fd: RawFd, mnt: &Path) -> anyhow::Result<()> {
    let data = format!("fd={fd},rootmode=40000,user_id=0,group_id=0,max_read={MAX_WRITE}");
    mount_fs(c"dhrd-null", mnt, c"fuse.dhrd-null", &data)
}

/// mount(2) of `source` on `mnt` (nosuid, nodev) with file system type `fstype` and `data`.
fn mount_fs(
    source: &std::ffi::CStr,
    mnt: &Path,
    fstype: &std::ffi::CStr,
    data: &str,
) -> anyhow::Result<()> {
    let target = cstr(mnt)?;
    let data = CString::new(data)?;
    // SAFETY: valid NUL-terminated strings for the duration of the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        bail!(
            "mount {} on {}: {}",
            source.to_string_lossy(),
            mnt.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn write_reply(fd: RawFd, unique: u64, error: i32, args: &[u8]) -> std::io::Result<()> {
    let mut hdr = [0u8; abi::OUT_HEADER_BYTES];
    encode_out_header(&mut hdr, abi::OUT_HEADER_BYTES + args.len(), error, unique);
    let iov = [
        libc::iovec {
            iov_base: hdr.as_ptr() as *mut _,
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: args.as_ptr() as *mut _,
            iov_len: args.len(),
        },
    ];
    // SAFETY: both iovecs point at live buffers of the given lengths.
    let r = unsafe { libc::writev(fd, iov.as_ptr(), 2) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the INIT handler tells the thread that waits for the connection.
struct InitDone {
    uring: bool,
}

/// One /dev/fuse server thread: read a request, serve it, reply, until the connection ends.
fn legacy_loop(
    fd: RawFd,
    fs: Arc<NullFs>,
    want_uring: bool,
    init_tx: Option<mpsc::Sender<InitDone>>,
) {
    let mut buf = vec![0u8; LEGACY_BUF_BYTES];
    let mut out = vec![0u8; LEGACY_BUF_BYTES];
    loop {
        // SAFETY: reading into our own buffer of the given length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match errno() {
                // ENOENT: the request was interrupted before we got it.
                libc::EINTR | libc::EAGAIN | libc::ENOENT => continue,
                _ => return, // ENODEV after unmount/abort
            }
        }
        let n = n as usize;
        let Some(h) = parse_in_header(&buf[..n]) else {
            continue;
        };
        let args = &buf[abi::IN_HEADER_BYTES..n];
        if h.opcode == abi::INIT {
            fs.counters.count(Via::Dev, h.opcode);
            let (len, uring) = encode_init_out(args, want_uring, &mut out);
            let r = write_reply(fd, h.unique, 0, &out[..len]);
            if let Some(tx) = &init_tx {
                let _ = tx.send(InitDone {
                    uring: uring && r.is_ok(),
                });
            }
            continue;
        }
        match fs.handle(&h, Via::Dev, args, &mut out, 0) {
            Outcome::Reply { error, len } => {
                // ENOENT: the request was interrupted and is gone; nothing to do.
                let _ = write_reply(fd, h.unique, error, &out[..len]);
            }
            Outcome::NoReply => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// The io_uring transport
// ---------------------------------------------------------------------------------------

/// The header buffer of one ring entry, aligned so the kernel's copies stay in few lines.
#[repr(C, align(64))]
struct RingHeader([u8; abi::RING_HEADER_BYTES]);

struct RingEntry {
    header: Box<RingHeader>,
    payload: Vec<u8>,
    /// REGISTER's iovecs; the kernel copies them during submission.
    iov: [libc::iovec; 2],
}

fn uring_cmd(fd: RawFd, cmd_op: u32, qid: u16, commit_id: u64) -> opcode::UringCmd80 {
    // fuse_uring_cmd_req { flags u64, commit_id u64, qid u16, padding[6] } in the 80-byte area
    let mut cmd = [0u8; 80];
    put_u64(&mut cmd, 8, commit_id);
    put_u16(&mut cmd, 16, qid);
    opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd)
}

/// io-uring 0.7's UringCmd80 sets sqe->addr but not sqe->len, which REGISTER needs (the
/// iovec count). Both SQE types are repr(C) over the kernel's 128-byte layout.
fn with_sqe_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const SQE_LEN_OFF: usize = 24;
    // SAFETY: Entry128 is repr(C) of a 64-byte io_uring_sqe and 64 command bytes, i.e.
    // exactly the kernel's SQE128 layout; `len` sits at byte 24 of io_uring_sqe.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    put_u32(&mut raw, SQE_LEN_OFF, len);
    // SAFETY: same layout back; every byte pattern is a valid SQE value.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn current_cpu() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::sched_getcpu() }
}

/// Per-queue statistics the queue thread keeps for the report.
#[derive(Default)]
struct QueueStats {
    /// Requests per caller pid (thread id) in the current measurement window.
    by_pid: HashMap<u32, u64>,
    /// Requests the queue thread served while running on another CPU than its own.
    off_cpu: u64,
    /// Requests whose caller's previous request went to another queue (the caller
    /// changed CPU in between).
    switched: u64,
}

type SharedQueueStats = Arc<Vec<Mutex<QueueStats>>>;

/// Last queue each caller (pid modulo the table size) used, shared by the queue threads.
const LAST_QUEUE_SLOTS: usize = 1 << 16;
type LastQueue = Arc<Vec<AtomicUsize>>;

fn possible_cpus() -> anyhow::Result<usize> {
    // "0-1" or "0-3,5": the kernel creates a queue per possible CPU and needs them all.
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        max = max.max(last.parse::<usize>()?);
    }
    Ok(max + 1)
}

/// Serves queue `qid` from a thread pinned to CPU `qid`. Sends the registration result,
/// then runs until every entry has been ended by the kernel (unmount or abort).
fn queue_loop(
    fd: RawFd,
    qid: usize,
    fs: Arc<NullFs>,
    stats: SharedQueueStats,
    last_queue: LastQueue,
    ready: mpsc::Sender<Result<(), String>>,
) {
    if let Err(e) = pin_to_cpu(qid) {
        let _ = ready.send(Err(format!("sched_setaffinity cpu {qid}: {e}")));
        return;
    }
    let sq_entries = (ENTRIES_PER_QUEUE as u32).next_power_of_two() * 2;
    // DEFER_TASKRUN: the kernel hands requests over as task work that runs when this
    // thread enters io_uring_enter, instead of interrupting it; single issuer is required.
    let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(sq_entries)
        .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(sq_entries));
    let mut ring = match ring {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!("io_uring_setup(SQE128): {e}")));
            return;
        }
    };
    let mut ents: Vec<RingEntry> = (0..ENTRIES_PER_QUEUE)
        .map(|_| RingEntry {
            header: Box::new(RingHeader([0u8; abi::RING_HEADER_BYTES])),
            payload: vec![0u8; PAYLOAD_BYTES],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        })
        .collect();
    for (i, e) in ents.iter_mut().enumerate() {
        e.iov = [
            libc::iovec {
                iov_base: e.header.0.as_mut_ptr().cast(),
                iov_len: abi::RING_HEADER_BYTES,
            },
            libc::iovec {
                iov_base: e.payload.as_mut_ptr().cast(),
                iov_len: e.payload.len(),
            },
        ];
        let sqe = uring_cmd(fd, abi::URING_CMD_REGISTER, qid as u16, 0)
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        let sqe = with_sqe_len(sqe, abi::URING_IOV_SEGS);
        // SAFETY: the iovecs and the buffers they point to live in `ents` for the whole
        // lifetime of the ring (the ring is dropped first, at the end of this function).
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            let _ = ready.send(Err("submission queue full".into()));
            return;
        }
    }
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(format!("io_uring_enter(REGISTER): {e}")));
        return;
    }
    // A REGISTER that fails completes at once; one that succeeds stays pending until a
    // request arrives, which cannot happen before all queues are registered.
    let mut early = Vec::new();
    for cqe in ring.completion() {
        early.push((cqe.user_data(), cqe.result()));
    }
    if let Some((_, res)) = early.iter().find(|(_, r)| *r < 0) {
        let _ = ready.send(Err(format!(
            "FUSE_IO_URING_CMD_REGISTER on queue {qid}: {}",
            std::io::Error::from_raw_os_error(-res)
        )));
        return;
    }
    let _ = ready.send(Ok(()));

    let mut live = ENTRIES_PER_QUEUE;
    let mut pending: Vec<(u64, i32)> = early;
    loop {
        for (idx, res) in pending.drain(..) {
            let i = idx as usize;
            if res < 0 {
                // ENOTCONN/ECANCELED: the connection is going away; the entry is done.
                live -= 1;
                continue;
            }
            let e = &mut ents[i];
            let hdr = &mut e.header.0;
            let Some(h) = parse_in_header(&hdr[abi::RING_IN_OUT_OFF..]) else {
                live -= 1;
                continue;
            };
            let commit_id = get_u64(hdr, abi::RING_COMMIT_ID_OFF);
            let in_len = (get_u32(hdr, abi::RING_PAYLOAD_SZ_OFF) as usize).min(PAYLOAD_BYTES);
            // The first argument is in op_in; its size is what the header's total length
            // leaves after the payload (at most the op_in area).
            let op_len = (h.len as usize)
                .saturating_sub(abi::IN_HEADER_BYTES + in_len)
                .min(abi::RING_OP_IN_BYTES);
            {
                let mut st = match stats[qid].lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                *st.by_pid.entry(h.pid).or_insert(0) += 1;
                if current_cpu() != qid as i32 {
                    st.off_cpu += 1;
                }
                let slot = &last_queue[h.pid as usize % LAST_QUEUE_SLOTS];
                if slot.swap(qid + 1, Ordering::Relaxed) != qid + 1 {
                    st.switched += 1;
                }
            }
            let mut op_in = [0u8; abi::RING_OP_IN_BYTES];
            op_in[..op_len]
                .copy_from_slice(&hdr[abi::RING_OP_IN_OFF..abi::RING_OP_IN_OFF + op_len]);
            let (error, len) =
                match fs.handle(&h, Via::Ring, &op_in[..op_len], &mut e.payload, in_len) {
                    Outcome::Reply { error, len } => (error, len),
                    // Requests without a reply do not come over the ring; if one did,
                    // committing an empty reply keeps the entry in circulation.
                    Outcome::NoReply => (0, 0),
                };
            encode_out_header(
                &mut hdr[abi::RING_IN_OUT_OFF..],
                abi::OUT_HEADER_BYTES + len,
                error,
                h.unique,
            );
            put_u32(hdr, abi::RING_PAYLOAD_SZ_OFF, len as u32);
            let sqe = uring_cmd(fd, abi::URING_CMD_COMMIT_AND_FETCH, qid as u16, commit_id)
                .build()
                .user_data(idx);
            // SAFETY: the entry's buffers outlive the ring (see REGISTER above).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                live -= 1;
            }
        }
        if live == 0 {
            return;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(_) => return,
        }
        for cqe in ring.completion() {
            pending.push((cqe.user_data(), cqe.result()));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Servers: mount, threads, teardown
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
enum Kind {
    Legacy(usize),
    Uring,
}

struct Server {
    kind: Kind,
    mnt: PathBuf,
    fs: Arc<NullFs>,
    /// /sys/fs/fuse/connections/<id>, for the abort fallback.
    conn_id: Option<u64>,
    fds: Vec<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    alive: Arc<AtomicUsize>,
    mounted: bool,
    queue_stats: Option<SharedQueueStats>,
}

impl Server {
    fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
        let alive = self.alive.clone();
        alive.fetch_add(1, Ordering::SeqCst);
        let h = std::thread::Builder::new().name(name).spawn(move || {
            f();
            alive.fetch_sub(1, Ordering::SeqCst);
        })?;
        self.threads.push(h);
        Ok(())
    }

    fn file(&self) -> PathBuf {
        self.mnt
            .join(std::str::from_utf8(FILE_NAME).unwrap_or("data"))
    }

    fn label(&self) -> String {
        match self.kind {
            Kind::Legacy(t) => format!("legacy-{t}t"),
            Kind::Uring => "io_uring".into(),
        }
    }

    fn wait_threads(&self, d: Duration) -> bool {
        let t0 = Instant::now();
        while self.alive.load(Ordering::SeqCst) > 0 {
            if t0.elapsed() > d {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Unmount; lazily if busy; abort the connection if the threads do not end.
    fn shutdown(&mut self) {
        if self.mounted {
            let Ok(target) = cstr(&self.mnt) else { return };
            // SAFETY: valid path string.
            let r = unsafe { libc::umount2(target.as_ptr(), 0) };
            if r != 0 {
                eprintln!(
                    "fuse-transport: umount {}: {}; detaching",
                    self.mnt.display(),
                    std::io::Error::last_os_error()
                );
                // SAFETY: as above.
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            }
            self.mounted = false;
        }
        if !self.wait_threads(THREAD_EXIT_WAIT) {
            if let Some(id) = self.conn_id {
                eprintln!("fuse-transport: server threads still running; aborting connection {id}");
                let _ = std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), "1");
            }
            if !self.wait_threads(THREAD_EXIT_WAIT) {
                eprintln!("fuse-transport: {} threads did not exit", self.label());
                return; // leave them detached rather than close fds under them
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.fds.clear();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn conn_id_of(mnt: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mnt).ok()?.dev();
    Some(libc::minor(dev) as u64)
}

/// Sets `enable_uring` and puts the previous value back when dropped.
struct UringParam {
    previous: Option<String>,
}

impl UringParam {
    fn enable() -> anyhow::Result<Self> {
        let previous = std::fs::read_to_string(ENABLE_URING_PARAM)
            .with_context(|| format!("reading {ENABLE_URING_PARAM} (CONFIG_FUSE_IO_URING?)"))?;
        let previous = previous.trim().to_string();
        if previous != "Y" {
            std::fs::write(ENABLE_URING_PARAM, "Y")
                .with_context(|| format!("writing {ENABLE_URING_PARAM}"))?;
        }
        Ok(Self {
            previous: Some(previous),
        })
    }

    fn restore(&mut self) {
        if let Some(p) = self.previous.take() {
            if p != "Y" {
                if let Err(e) = std::fs::write(ENABLE_URING_PARAM, &p) {
                    eprintln!("fuse-transport: restoring {ENABLE_URING_PARAM}={p}: {e}");
                }
            }
        }
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        self.restore();
    }
}

fn new_server(kind: Kind, mnt: &Path, size: u64) -> anyhow::Result<Server> {
    std::fs::create_dir_all(mnt)?;
    Ok(Server {
        kind,
        mnt: mnt.to_path_buf(),
        fs: Arc::new(NullFs::new(size)?),
        conn_id: None,
        fds: Vec::new(),
        threads: Vec::new(),
        alive: Arc::new(AtomicUsize::new(0)),
        mounted: false,
        queue_stats: None,
    })
}

fn wait_init(rx: &mpsc::Receiver<InitDone>) -> anyhow::Result<InitDone> {
    rx.recv_timeout(Duration::from_secs(10))
        .context("no FUSE_INIT from the kernel within 10 s")
}

fn start_legacy(mnt: &Path, threads: usize, size: u64) -> anyhow::Result<Server> {
    let mut s = new_server(Kind::Legacy(threads), mnt, size)?;
    let master = open_dev_fuse()?;
    mount_fuse(master.as_raw_fd(), mnt)?;
    s.mounted = true;
    let (tx, rx) = mpsc::channel();
    let mut fds = vec![master];
    for _ in 1..threads {
        fds.push(clone_dev_fuse(fds[0].as_raw_fd())?);
    }
    for (i, fd) in fds.iter().enumerate() {
        let (raw, fs) = (fd.as_raw_fd(), s.fs.clone());
        // Any of the cloned descriptors may be the one that reads INIT.
        let tx = Some(tx.clone());
        s.spawn(format!("null-dev{i}"), move || {
            legacy_loop(raw, fs, false, tx)
        })?;
    }
    s.fds = fds;
    wait_init(&rx)?;
    s.conn_id = conn_id_of(mnt);
    Ok(s)
}

/// Mounts the io_uring server. Err carries why registration failed (after cleanup).
fn start_uring(mnt: &Path, size: u64) -> anyhow::Result<Server> {
    let mut param = UringParam::enable()?;
    let mut s = new_server(Kind::Uring, mnt, size)?;
    let master = open_dev_fuse()?;
    mount_fuse(master.as_raw_fd(), mnt)?;
    s.mounted = true;
    let (tx, rx) = mpsc::channel();
    let raw = master.as_raw_fd();
    s.fds.push(master);
    let fs = s.fs.clone();
    s.spawn("null-dev0".into(), move || {
        legacy_loop(raw, fs, true, Some(tx))
    })?;
    let init = wait_init(&rx)?;
    // The kernel read the switch when it sent INIT and when it processed our reply; from
    // here on the connection's own io_uring flag is what counts, so the global switch can
    // go back at once (it also governs every other FUSE mount made meanwhile).
    param.restore();
    if !init.uring {
        bail!("the kernel did not offer FUSE_OVER_IO_URING in INIT (flags2)");
    }
    let ncpu = possible_cpus()?;
    let stats: SharedQueueStats = Arc::new(
        (0..ncpu)
            .map(|_| Mutex::new(QueueStats::default()))
            .collect(),
    );
    s.queue_stats = Some(stats.clone());
    let last_queue: LastQueue =
        Arc::new((0..LAST_QUEUE_SLOTS).map(|_| AtomicUsize::new(0)).collect());
    let (rtx, rrx) = mpsc::channel();
    for q in 0..ncpu {
        let (fs, stats, rtx) = (s.fs.clone(), stats.clone(), rtx.clone());
        let lq = last_queue.clone();
        s.spawn(format!("null-q{q}"), move || {
            queue_loop(raw, q, fs, stats, lq, rtx)
        })?;
    }
    for _ in 0..ncpu {
        match rrx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("a queue thread did not report its registration"),
        }
    }
    // Not earlier: until every queue has an entry registered the kernel holds every new
    // request (even this stat) waiting for the ring.
    s.conn_id = conn_id_of(mnt);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// tmpfs baseline
// ---------------------------------------------------------------------------------------

struct TmpfsMount {
    mnt: PathBuf,
    mounted: bool,
}

impl TmpfsMount {
    fn new(mnt: &Path, size: u64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(mnt)?;
        mount_fs(
            c"tmpfs",
            mnt,
            c"tmpfs",
            &format!("size={}", size + 16 * MIB),
        )?;
        let t = Self {
            mnt: mnt.to_path_buf(),
            mounted: true,
        };
        let f = File::create(t.file())?;
        let mut block = vec![0u8; MIB as usize];
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i * 7 + 1) as u8;
        }
        let mut off = 0;
        while off < size {
            let n = (size - off).min(block.len() as u64) as usize;
            f.write_all_at(&block[..n], off)?;
            off += n as u64;
        }
        Ok(t)
    }

    fn file(&self) -> PathBuf {
        self.mnt.join("data")
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        if self.mounted {
            if let Ok(t) = cstr(&self.mnt) {
                // SAFETY: valid path string.
                if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
                    // SAFETY: as above.
                    unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
                }
            }
            self.mounted = false;
        }
    }
}

// ---------------------------------------------------------------------------------------
// fio
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Serialize)]
struct Workload {
    name: &'static str,
    rw: &'static str,
    jobs: usize,
    /// fio's cpus_allowed, to keep the caller on one CPU.
    cpus: Option<&'static str>,
}

const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "randread-1job",
        rw: "randread",
        jobs: 1,
        cpus: None,
    },
    // The caller pinned: the io_uring handoff then stays on one CPU in both directions,
    // where an unpinned caller is woken on the other, idle CPU (see the cpu-change share).
    Workload {
        name: "randread-1job-cpu0",
        rw: "randread",
        jobs: 1,
        cpus: Some("0"),
    },
    Workload {
        name: "randread-2jobs",
        rw: "randread",
        jobs: 2,
        cpus: None,
    },
    Workload {
        name: "randwrite-1job",
        rw: "randwrite",
        jobs: 1,
        cpus: None,
    },
];

#[derive(Clone, Debug, Serialize)]
struct FioResult {
    iops: f64,
    clat_mean_us: f64,
    clat_p99_us: f64,
}

fn fio(file: &Path, w: &Workload, size: u64, runtime: u32) -> anyhow::Result<FioResult> {
    let mut cmd = std::process::Command::new("fio");
    if let Some(c) = w.cpus {
        cmd.arg(format!("--cpus_allowed={c}"));
    }
    let out = cmd
        .arg("--name=probe")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--rw={}", w.rw))
        .arg("--bs=4k")
        .arg("--ioengine=psync")
        .arg("--iodepth=1")
        .arg(format!("--numjobs={}", w.jobs))
        .arg("--group_reporting=1")
        .arg("--time_based=1")
        .arg(format!("--runtime={runtime}"))
        .arg(format!("--ramp_time={FIO_RAMP_SECS}"))
        .arg(format!("--size={size}"))
        .arg("--invalidate=0")
        .arg("--fallocate=none")
        .arg("--norandommap=1")
        .arg("--randrepeat=0")
        .arg("--output-format=json")
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio on {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("fio json: {}", String::from_utf8_lossy(&out.stdout)))?;
    let dir = if w.rw == "randwrite" { "write" } else { "read" };
    let j = &v["jobs"][0][dir];
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    Ok(FioResult {
        iops: f(&j["iops"]),
        clat_mean_us: f(&j["clat_ns"]["mean"]) / 1000.0,
        clat_p99_us: f(&j["clat_ns"]["percentile"]["99.000000"]) / 1000.0,
    })
}

// ---------------------------------------------------------------------------------------
// Stall probe: does one blocked request hold up others on the same queue/CPU?
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
struct StallResult {
    target: String,
    /// Latency of a read on CPU 0 while another read on CPU 0 is stalled in the server.
    same_cpu_us: f64,
    /// The same with the second reader on CPU 1.
    other_cpu_us: f64,
}

fn stall_probe(s: &Server) -> anyhow::Result<StallResult> {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let measure = |cpu_b: usize| -> anyhow::Result<f64> {
        s.fs.stall.store(true, Ordering::SeqCst);
        let (fa, fb) = (File::open(s.file())?, File::open(s.file())?);
        let stall_off = s.fs.stall_offset();
        let a = std::thread::spawn(move || {
            let _ = pin_to_cpu(0);
            let mut b = [0u8; 4096];
            let _ = fa.read_at(&mut b, stall_off);
        });
        std::thread::sleep(STALL_PROBE_DELAY);
        let b = std::thread::spawn(move || -> f64 {
            let _ = pin_to_cpu(cpu_b);
            let mut buf = [0u8; 4096];
            let t0 = Instant::now();
            let _ = fb.read_at(&mut buf, 0);
            t0.elapsed().as_secs_f64() * 1e6
        });
        let us = b.join().unwrap_or(f64::NAN);
        let _ = a.join();
        s.fs.stall.store(false, Ordering::SeqCst);
        Ok(us)
    };
    let same = measure(0)?;
    let other = if ncpu > 1 { measure(1)? } else { f64::NAN };
    Ok(StallResult {
        target: s.label(),
        same_cpu_us: same,
        other_cpu_us: other,
    })
}

// ---------------------------------------------------------------------------------------
// Orchestration and report
// ---------------------------------------------------------------------------------------

#[derive(clap::Args)]
pub struct FuseTransportArgs {
    /// Size of the served file (and of the tmpfs baseline file).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// Legacy server thread counts to measure (1 and dhrd's default 8).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub threads: Vec<usize>,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds per fio run (after a 1 s ramp).
    #[arg(long, default_value_t = 4)]
    pub runtime: u32,
    /// Skip the io_uring transport (legacy and tmpfs only).
    #[arg(long)]
    pub no_uring: bool,
    /// Where results go; default bench/results/fuse-transport-<yyyymmdd-hhmmss>.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for the mount points.
    #[arg(long, default_value = "/tmp")]
    pub scratch: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], KIB),
        Some('M' | 'm') => (&s[..s.len() - 1], MIB),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|e| format!("{s}: {e}"))?;
    let v = n * mult;
    if v < 1 << 20 || v & 4095 != 0 {
        return Err(format!("{s}: need a multiple of 4 KiB, at least 1 MiB"));
    }
    Ok(v)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let h = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, h as libc::sighandler_t);
        libc::signal(libc::SIGTERM, h as libc::sighandler_t);
    }
}

#[derive(Clone, Debug, Serialize)]
struct Run {
    round: usize,
    order: usize,
    workload: String,
    target: String,
    result: FioResult,
    loadavg: String,
    /// io_uring only: requests per queue (CPU) during this run.
    queue_requests: Option<Vec<u64>>,
    /// io_uring only: share of the run's requests that came from the fio job's main CPU
    /// (requests of each pid on its most used queue / all requests).
    main_queue_share: Option<f64>,
    /// io_uring only: share of requests whose caller was on another CPU (queue) than for
    /// its previous request.
    cpu_change_share: Option<f64>,
}

#[derive(Serialize)]
struct Median {
    workload: String,
    target: String,
    iops: f64,
    clat_mean_us: f64,
    clat_p99_us: f64,
    /// Median over rounds of (target IOPS / tmpfs IOPS) of the same round.
    iops_vs_tmpfs: f64,
    /// Median over rounds of (target mean latency / tmpfs mean latency).
    lat_vs_tmpfs: f64,
    iops_vs_tmpfs_min: f64,
    iops_vs_tmpfs_max: f64,
    /// io_uring only: median per-round IOPS ratio to each legacy configuration.
    uring_vs_legacy: Vec<(String, f64)>,
}

/// Requests per opcode over /dev/fuse and over the ring.
type OpCounts = (HashMap<String, u64>, HashMap<String, u64>);

#[derive(Serialize)]
struct Summary {
    command: String,
    machine: Machine,
    size: u64,
    rounds: usize,
    runtime_s: u32,
    uring_status: String,
    server_threads: HashMap<String, String>,
    medians: Vec<Median>,
    runs: Vec<Run>,
    /// Requests per opcode that arrived over /dev/fuse and over the ring, per server.
    requests: HashMap<String, OpCounts>,
    stall: Vec<StallResult>,
    elapsed_s: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn default_out() -> PathBuf {
    let d = std::process::Command::new("date")
        .args(["-u", "+%Y%m%d-%H%M%S"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "undated".into());
    PathBuf::from(format!("bench/results/fuse-transport-{d}"))
}

/// Per-queue request counts, the share on each caller's main queue, and the share of
/// requests whose caller had changed CPU since its previous request.
fn take_queue_stats(s: &Server) -> Option<(Vec<u64>, f64, f64)> {
    let stats = s.queue_stats.as_ref()?;
    let mut per_queue = Vec::new();
    let mut per_pid: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut switched = 0;
    let n = stats.len();
    for (q, m) in stats.iter().enumerate() {
        let mut g = match m.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        per_queue.push(g.by_pid.values().sum());
        for (&pid, &c) in &g.by_pid {
            per_pid.entry(pid).or_insert_with(|| vec![0; n])[q] += c;
        }
        switched += g.switched;
        if g.off_cpu > 0 {
            eprintln!(
                "fuse-transport: queue {q} served {} requests off its CPU",
                g.off_cpu
            );
        }
        *g = QueueStats::default();
    }
    let total: u64 = per_queue.iter().sum();
    let main: u64 = per_pid
        .values()
        .map(|v| v.iter().copied().max().unwrap_or(0))
        .sum();
    let share = if total > 0 {
        main as f64 / total as f64
    } else {
        f64::NAN
    };
    Some((per_queue, share, switched as f64 / total.max(1) as f64))
}

pub fn run(a: FuseTransportArgs) -> anyhow::Result<()> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        bail!("fuse-transport needs root (mount(2), enable_uring)");
    }
    install_signal_handlers();
    let t_start = Instant::now();
    let machine = Machine::probe(&a.scratch);
    println!("machine: {}", machine.describe());
    let out_dir = a.out.clone().unwrap_or_else(default_out);
    let base = a
        .scratch
        .join(format!("dhrd-fuse-transport-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let result = run_inner(&a, &base, &machine, &out_dir, t_start);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn run_inner(
    a: &FuseTransportArgs,
    base: &Path,
    machine: &Machine,
    out_dir: &Path,
    t_start: Instant,
) -> anyhow::Result<()> {
    // Servers and tmpfs are dropped (unmounted) in reverse order on every return path.
    let tmpfs = TmpfsMount::new(&base.join("tmpfs"), a.size)?;
    let mut servers: Vec<Server> = Vec::new();
    for &t in &a.threads {
        servers.push(start_legacy(&base.join(format!("legacy{t}")), t, a.size)?);
    }
    let uring_status = if a.no_uring {
        "skipped (--no-uring)".to_string()
    } else {
        match start_uring(&base.join("uring"), a.size) {
            Ok(s) => {
                servers.push(s);
                "registered".to_string()
            }
            Err(e) => {
                let msg = format!("io_uring transport unavailable: {e:#}");
                eprintln!("fuse-transport: {msg}");
                msg
            }
        }
    };
    let mut server_threads = HashMap::new();
    for s in &servers {
        server_threads.insert(
            s.label(),
            match s.kind {
                Kind::Legacy(t) => format!("{t} threads on cloned /dev/fuse fds, unpinned"),
                Kind::Uring => format!(
                    "{} queue threads pinned 1:1 to CPUs, {ENTRIES_PER_QUEUE} entries each, plus 1 /dev/fuse reader",
                    s.queue_stats.as_ref().map_or(0, |q| q.len())
                ),
            },
        );
    }
    // Smoke check every target before spending minutes on it.
    for s in &servers {
        let f = File::open(s.file()).with_context(|| format!("open {}", s.file().display()))?;
        let mut b = [0u8; 4096];
        let n = f.read_at(&mut b, 4096)?;
        if n != 4096 || b[0] != 1 || b[1] != 8 {
            bail!("{}: unexpected read of {n} bytes", s.label());
        }
    }
    for s in &servers {
        let _ = take_queue_stats(s);
    }

    let mut targets: Vec<(String, PathBuf, Option<usize>)> =
        vec![("tmpfs".into(), tmpfs.file(), None)];
    for (i, s) in servers.iter().enumerate() {
        targets.push((s.label(), s.file(), Some(i)));
    }
    let mut runs: Vec<Run> = Vec::new();
    let total = a.rounds * WORKLOADS.len() * targets.len();
    let mut done = 0;
    for round in 0..a.rounds {
        // Rotate both the workload order and the target order from round to round.
        let mut order = 0;
        for wi in 0..WORKLOADS.len() {
            let w = &WORKLOADS[(wi + round) % WORKLOADS.len()];
            for ti in 0..targets.len() {
                let (label, file, srv) = &targets[(ti + round) % targets.len()];
                if STOP.load(Ordering::SeqCst) {
                    bail!("interrupted");
                }
                let la = loadavg();
                let r = fio(file, w, a.size, a.runtime)?;
                if STOP.load(Ordering::SeqCst) {
                    bail!("interrupted");
                }
                let qs = srv.and_then(|i| take_queue_stats(&servers[i]));
                done += 1;
                println!(
                    "[{done}/{total}] round {round} {:<15} {:<10} {:>9.0} IOPS  mean {:>7.2} us  p99 {:>7.2} us{}",
                    w.name,
                    label,
                    r.iops,
                    r.clat_mean_us,
                    r.clat_p99_us,
                    qs.as_ref()
                        .map(|(q, s, w)| format!(
                            "  queues {q:?} main-queue share {s:.3} cpu-change share {w:.3}"
                        ))
                        .unwrap_or_default()
                );
                runs.push(Run {
                    round,
                    order,
                    workload: w.name.into(),
                    target: label.clone(),
                    result: r,
                    loadavg: la,
                    queue_requests: qs.as_ref().map(|(q, _, _)| q.clone()),
                    main_queue_share: qs.as_ref().map(|(_, s, _)| *s),
                    cpu_change_share: qs.as_ref().map(|(_, _, w)| *w),
                });
                order += 1;
            }
        }
    }

    let mut stall = Vec::new();
    for s in &servers {
        match stall_probe(s) {
            Ok(r) => stall.push(r),
            Err(e) => eprintln!("fuse-transport: stall probe on {}: {e:#}", s.label()),
        }
    }
    let _ = servers.iter().map(take_queue_stats).count();

    // Medians of per-round values and ratios.
    let find = |round: usize, w: &str, t: &str| {
        runs.iter()
            .find(|r| r.round == round && r.workload == w && r.target == t)
            .map(|r| r.result.clone())
    };
    let legacy_labels: Vec<String> = servers
        .iter()
        .filter(|s| matches!(s.kind, Kind::Legacy(_)))
        .map(|s| s.label())
        .collect();
    let mut medians = Vec::new();
    for w in &WORKLOADS {
        for (t, _, _) in &targets {
            let (mut iops, mut mean, mut p99, mut ri, mut rl) =
                (vec![], vec![], vec![], vec![], vec![]);
            let mut vs_legacy: Vec<(String, Vec<f64>)> =
                legacy_labels.iter().map(|l| (l.clone(), vec![])).collect();
            for round in 0..a.rounds {
                let (Some(x), Some(b)) = (find(round, w.name, t), find(round, w.name, "tmpfs"))
                else {
                    continue;
                };
                iops.push(x.iops);
                mean.push(x.clat_mean_us);
                p99.push(x.clat_p99_us);
                ri.push(x.iops / b.iops);
                rl.push(x.clat_mean_us / b.clat_mean_us);
                if t == "io_uring" {
                    for (l, v) in vs_legacy.iter_mut() {
                        if let Some(y) = find(round, w.name, l) {
                            v.push(x.iops / y.iops);
                        }
                    }
                }
            }
            let (mn, mx) = ri
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            medians.push(Median {
                workload: w.name.into(),
                target: t.clone(),
                iops: median(&mut iops),
                clat_mean_us: median(&mut mean),
                clat_p99_us: median(&mut p99),
                iops_vs_tmpfs: median(&mut ri),
                lat_vs_tmpfs: median(&mut rl),
                iops_vs_tmpfs_min: mn,
                iops_vs_tmpfs_max: mx,
                uring_vs_legacy: if t == "io_uring" {
                    vs_legacy
                        .into_iter()
                        .map(|(l, mut v)| (l, median(&mut v)))
                        .collect()
                } else {
                    vec![]
                },
            });
        }
    }
    let mut requests = HashMap::new();
    for s in &servers {
        requests.insert(s.label(), s.fs.counters.snapshot());
    }
    let summary = Summary {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine.clone(),
        size: a.size,
        rounds: a.rounds,
        runtime_s: a.runtime,
        uring_status,
        server_threads,
        medians,
        runs,
        requests,
        stall,
        elapsed_s: t_start.elapsed().as_secs_f64(),
    };
    let md = markdown(&summary);
    println!("\n{md}");
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(
        out_dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    std::fs::write(out_dir.join("results.md"), &md)?;
    println!("wrote {}", out_dir.display());
    drop(servers);
    drop(tmpfs);
    Ok(())
}

fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# fuse-transport: /dev/fuse vs FUSE over io_uring (null server)\n"
    );
    let _ = writeln!(m, "Command: `{}`\n", s.command);
    let _ = writeln!(m, "Machine: {}\n", s.machine.describe());
    let _ = writeln!(
        m,
        "File {} MiB, {} rounds x {} s (+{FIO_RAMP_SECS} s ramp) per run, fio 4 KiB psync QD1, order rotated per round. io_uring: {}.\n",
        s.size / MIB,
        s.rounds,
        s.runtime_s,
        s.uring_status
    );
    let mut names: Vec<_> = s.server_threads.iter().collect();
    names.sort();
    for (k, v) in names {
        let _ = writeln!(m, "- {k}: {v}");
    }
    let _ = writeln!(
        m,
        "\nMedians over rounds; ratios are medians of per-round ratios (min-max of the IOPS ratio in brackets).\n"
    );
    let _ = writeln!(
        m,
        "| workload | target | IOPS | mean us | p99 us | IOPS / tmpfs | mean lat / tmpfs | io_uring IOPS / legacy |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|---|");
    for x in &s.medians {
        let vs = x
            .uring_vs_legacy
            .iter()
            .map(|(l, r)| format!("{r:.2}x {l}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            m,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.3} ({:.3}-{:.3}) | {:.2} | {} |",
            x.workload,
            x.target,
            x.iops,
            x.clat_mean_us,
            x.clat_p99_us,
            x.iops_vs_tmpfs,
            x.iops_vs_tmpfs_min,
            x.iops_vs_tmpfs_max,
            x.lat_vs_tmpfs,
            vs
        );
    }
    let _ = writeln!(m, "\n## Requests by transport (opcode: count)\n");
    let mut reqs: Vec<_> = s.requests.iter().collect();
    reqs.sort_by(|a, b| a.0.cmp(b.0));
    for (label, (dev, ring)) in reqs {
        let fmt = |h: &HashMap<String, u64>| {
            let mut v: Vec<_> = h.iter().collect();
            v.sort();
            v.iter()
                .map(|(k, c)| format!("{k} {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(m, "- {label}: /dev/fuse: {}; ring: {}", fmt(dev), fmt(ring));
    }
    let uring_runs: Vec<&Run> = s
        .runs
        .iter()
        .filter(|r| r.queue_requests.is_some())
        .collect();
    if !uring_runs.is_empty() {
        let _ = writeln!(
            m,
            "\n## io_uring queue use per run (requests per queue = per CPU of the caller; share on each caller's main queue)\n"
        );
        for r in uring_runs {
            let _ = writeln!(
                m,
                "- round {} {}: {:?}, main-queue share {:.3}, caller changed CPU since its previous request: {:.3}",
                r.round,
                r.workload,
                r.queue_requests.clone().unwrap_or_default(),
                r.main_queue_share.unwrap_or(f64::NAN),
                r.cpu_change_share.unwrap_or(f64::NAN)
            );
        }
    }
    if !s.stall.is_empty() {
        let _ = writeln!(
            m,
            "\n## Stall probe (a read on CPU 0 sleeps {STALL_MS} ms in the server; latency of a second read)\n"
        );
        let _ = writeln!(
            m,
            "| target | second read on CPU 0 | second read on CPU 1 |"
        );
        let _ = writeln!(m, "|---|---|---|");
        for x in &s.stall {
            let _ = writeln!(
                m,
                "| {} | {:.0} us | {:.0} us |",
                x.target, x.same_cpu_us, x.other_cpu_us
            );
        }
    }
    let _ = writeln!(m, "\nElapsed: {:.0} s", s.elapsed_s);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, nodeid: u64, len: u32) -> [u8; abi::IN_HEADER_BYTES] {
        let mut h = [0u8; abi::IN_HEADER_BYTES];
        put_u32(&mut h, 0, len);
        put_u32(&mut h, 4, opcode);
        put_u64(&mut h, 8, 77);
        put_u64(&mut h, 16, nodeid);
        put_u32(&mut h, 32, 1234);
        h
    }

    #[test]
    fn parses_in_header() {
        let h = header(abi::READ, FILE_INO, 80);
        let p = parse_in_header(&h);
        assert_eq!(
            p,
            Some(InHeader {
                len: 80,
                opcode: abi::READ,
                unique: 77,
                nodeid: FILE_INO,
                pid: 1234
            })
        );
        assert_eq!(parse_in_header(&h[..39]), None);
    }

    #[test]
    fn init_reply_accepts_uring_only_when_offered() {
        let mut init_in = [0u8; 64];
        put_u32(&mut init_in, 0, 7);
        put_u32(&mut init_in, 4, 44);
        put_u32(
            &mut init_in,
            12,
            abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES | 1,
        );
        let mut out = [0u8; 64];
        assert!(!encode_init_out(&init_in, true, &mut out).1);
        put_u32(&mut init_in, 16, abi::FLAG2_OVER_IO_URING);
        let (len, uring) = encode_init_out(&init_in, true, &mut out);
        assert!(uring && len == 64);
        assert_eq!(get_u32(&out, 4), 44);
        assert_eq!(get_u32(&out, 12), abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES);
        assert_eq!(get_u32(&out, 20), MAX_WRITE);
        assert_eq!(get_u32(&out, 32), abi::FLAG2_OVER_IO_URING);
        assert!(!encode_init_out(&init_in, false, &mut out).1);
    }

    #[test]
    fn lookup_name_from_either_place() {
        assert_eq!(lookup_name(b"data\0", b""), b"data");
        assert_eq!(lookup_name(b"", b"data\0junk"), b"data");
        assert_eq!(lookup_name(b"data", b"\0"), b"data");
    }

    #[test]
    fn serves_lookup_read_write() -> anyhow::Result<()> {
        let fs = NullFs::new(MIB)?;
        let mut out = vec![0u8; PAYLOAD_BYTES];
        let h = parse_in_header(&header(abi::LOOKUP, ROOT_INO, 45))
            .ok_or_else(|| anyhow::anyhow!("hdr"))?;
        let Outcome::Reply { error: 0, len } = fs.handle(&h, Via::Dev, b"data\0", &mut out, 0)
        else {
            bail!("lookup failed");
        };
        assert_eq!(len, abi::ENTRY_OUT_BYTES);
        assert_eq!(get_u64(&out, 0), FILE_INO);
        assert_eq!(get_u64(&out, 40 + 8), MIB);

        // /dev/fuse layout: write_in followed by the data.
        let mut w = vec![0u8; abi::WRITE_IN_BYTES + 4];
        put_u64(&mut w, 8, 4096);
        put_u32(&mut w, 16, 4);
        w[abi::WRITE_IN_BYTES..].copy_from_slice(b"abcd");
        let h = parse_in_header(&header(abi::WRITE, FILE_INO, 84))
            .ok_or_else(|| anyhow::anyhow!("hdr"))?;
        let Outcome::Reply { error: 0, len: 8 } = fs.handle(&h, Via::Dev, &w, &mut out, 0) else {
            bail!("write failed");
        };
        assert_eq!(get_u32(&out, 0), 4);

        // io_uring layout: write_in in op_in, the data in the payload.
        out[..4].copy_from_slice(b"wxyz");
        put_u64(&mut w, 8, 4098);
        let Outcome::Reply { error: 0, len: 8 } =
            fs.handle(&h, Via::Ring, &w[..abi::WRITE_IN_BYTES], &mut out, 4)
        else {
            bail!("ring write failed");
        };

        let mut r = [0u8; 40];
        put_u64(&mut r, 8, 4096);
        put_u32(&mut r, 16, 6);
        let h = parse_in_header(&header(abi::READ, FILE_INO, 80))
            .ok_or_else(|| anyhow::anyhow!("hdr"))?;
        let Outcome::Reply { error: 0, len: 6 } = fs.handle(&h, Via::Ring, &r, &mut out, 0) else {
            bail!("read failed");
        };
        assert_eq!(&out[..6], b"abwxyz");

        // Reads past the end are short; unknown opcodes get ENOSYS; FORGET no reply.
        put_u64(&mut r, 8, MIB - 2);
        let Outcome::Reply { error: 0, len: 2 } = fs.handle(&h, Via::Dev, &r, &mut out, 0) else {
            bail!("short read failed");
        };
        let h = parse_in_header(&header(4, FILE_INO, 40)).ok_or_else(|| anyhow::anyhow!("hdr"))?;
        assert!(matches!(
            fs.handle(&h, Via::Dev, &[], &mut out, 0),
            Outcome::Reply { error, len: 0 } if error == -libc::ENOSYS
        ));
        let h = parse_in_header(&header(abi::FORGET, FILE_INO, 48))
            .ok_or_else(|| anyhow::anyhow!("hdr"))?;
        assert!(matches!(
            fs.handle(&h, Via::Dev, &[0; 8], &mut out, 0),
            Outcome::NoReply
        ));
        Ok(())
    }

    #[test]
    fn register_sqe_carries_iovec_count() {
        let e = uring_cmd(3, abi::URING_CMD_REGISTER, 1, 0)
            .addr(Some(0x1000))
            .build();
        let e = with_sqe_len(e, abi::URING_IOV_SEGS);
        // SAFETY: same layout argument as in with_sqe_len.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(get_u32(&raw, 24), 2);
        assert_eq!(get_u64(&raw, 16), 0x1000);
        assert_eq!(get_u32(&raw, 4), 3); // fd
        assert_eq!(get_u32(&raw, 8), abi::URING_CMD_REGISTER); // cmd_op
        assert_eq!(get_u16(&raw, 48 + 16), 1); // qid in the command area
    }

    fn get_u16(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("256M"), Ok(256 * MIB));
        assert!(parse_size("12345").is_err());
    }
}
