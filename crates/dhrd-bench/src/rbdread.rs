//! `dhrd-bench rbd-read`: the fair baseline of dhrd's load from an RBD image. A plain
//! librbd client (`dhrd_rbd::BulkReader`) reads the whole image into a fresh memfd, as
//! dhrd's load fills its RAM tier, with dhrd's request size and number of requests in
//! flight: what librbd alone achieves doing the same work. fio's rbd engine, the earlier
//! baseline, reuses one small buffer and so never pays for fresh memory (docs/rbd.md).
//!
//! Timing: from making the memfd to the last completion (connecting and opening the image
//! come before, as dhrd's load is timed from after its open); with `--prefault` the memfd's
//! pages are touched first, untimed. One JSON object on stdout.
//!
//! Invariants: the image is opened read-only; the mapping outlives every read into it (the
//! reads are waited for before `read_window` returns) and is unmapped once.

use crate::fileio::{emit, r3};
use anyhow::{bail, Context, Result};
use dhrd_rbd::{BulkReader, RbdOptions, RbdSpec, BULK_PIECES_IN_FLIGHT, BULK_PIECE_BYTES};
use serde_json::json;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

/// Requests in flight at most.
const DEPTH_MAX: usize = 1024;

#[derive(clap::Args, Debug)]
pub struct RbdReadArgs {
    /// The image, as rbd:POOL/IMAGE.
    #[arg(long)]
    pub image: String,
    /// ceph.conf (default: $CEPH_CONF, then /etc/ceph/ceph.conf).
    #[arg(long)]
    pub ceph_conf: Option<PathBuf>,
    /// Bytes per request (default: dhrd's, 1 MiB).
    #[arg(long, value_parser = dhrd_engine::parse_size)]
    pub piece: Option<u64>,
    /// Requests in flight (default: dhrd's loader threads, each with the pieces of one
    /// chunk, the image's object size, in flight).
    #[arg(long)]
    pub depth: Option<usize>,
    /// Touch every page of the memfd first, untimed, so only the read is measured.
    #[arg(long)]
    pub prefault: bool,
}

/// dhrd's depth over this image: loader threads times the pieces of one chunk.
fn dhrd_depth(object_bytes: u64, piece: u64) -> usize {
    let per_chunk = (object_bytes.div_ceil(piece) as usize).clamp(1, BULK_PIECES_IN_FLIGHT);
    dhrd_engine::LOADER_THREADS_DEFAULT * per_chunk
}

/// A shared mapping of a fresh memfd of `len` bytes, unmapped on drop.
struct Fresh {
    _fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

impl Fresh {
    fn new(len: usize) -> Result<Fresh> {
        let name = CString::new("dhrd-bench-rbd-read").context("memfd name")?;
        // SAFETY: a valid C string; constant flags.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        // SAFETY: a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).context("image size")?;
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(std::io::Error::last_os_error()).context("ftruncate of the memfd");
        }
        // SAFETY: a new shared mapping of our memfd, of its size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of the memfd");
        }
        Ok(Fresh {
            _fd: fd,
            ptr: p.cast(),
            len,
        })
    }

    fn prefault(&self) -> Result<()> {
        // SAFETY: advice on our own mapping.
        let rc = unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("MADV_POPULATE_WRITE");
        }
        Ok(())
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: our mapping of `len` bytes, alive as long as `self`; `&mut self` makes
        // this the only slice of it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

pub fn run(a: RbdReadArgs) -> Result<()> {
    let spec = RbdSpec::parse(&a.image).with_context(|| format!("--image {}", a.image))?;
    let opts = RbdOptions {
        conf: a.ceph_conf.clone(),
        read_only: true,
        ..Default::default()
    };
    let r = BulkReader::open(&spec, &opts).with_context(|| format!("opening {spec}"))?;
    let piece = a.piece.unwrap_or(BULK_PIECE_BYTES);
    let depth = a
        .depth
        .unwrap_or_else(|| dhrd_depth(r.object_bytes(), piece));
    if piece == 0 || depth == 0 || depth > DEPTH_MAX {
        bail!("--piece must be positive and --depth in [1, {DEPTH_MAX}]");
    }
    let len = usize::try_from(r.size_bytes()).context("image size")?;
    let t0 = Instant::now();
    let mut mem = Fresh::new(len)?;
    let start = if a.prefault {
        mem.prefault()?;
        Instant::now()
    } else {
        t0
    };
    r.read_window(mem.slice(), 0, piece as usize, depth)
        .with_context(|| format!("reading {spec}"))?;
    let secs = start.elapsed().as_secs_f64();
    let j = json!({
        "benchmark": "rbd-read", "image": a.image, "bytes": len, "secs": r3(secs),
        "mib_per_sec": r3(len as f64 / (1 << 20) as f64 / secs),
        "piece_bytes": piece, "depth": depth, "object_bytes": r.object_bytes(),
        "prefault": a.prefault,
    });
    emit(
        &j,
        &format!(
            "rbd-read: {len} bytes in {secs:.2} s ({:.0} MiB/s), {piece}-byte requests, {depth} in flight",
            len as f64 / (1 << 20) as f64 / secs
        ),
    )
}
