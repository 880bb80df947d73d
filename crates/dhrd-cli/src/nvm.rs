//! The fast tiers in front of a backing, from `dhrd_tier`:
//! - `--ram-file PATH --ram-kind nvm`: writes acknowledged once on non-volatile memory and
//!   written back to the backing in the background (SPEC M4, `dhrd_tier::writeback`);
//! - `--tier-ssd PATH --tier-ssd-size SIZE`: an SSD cache tier over a slow backing (SPEC
//!   T1, `dhrd_tier::tiered`).
//!
//! DRAM is never treated as non-volatile: the file must be on a file system that keeps
//! its contents without power (a pmem/DAX mount, or any disk file system for testing);
//! tmpfs and ramfs are refused. The user declares the kind explicitly, because dhrd
//! cannot tell a DAX mount of real persistent memory from one of emulated memory.

use anyhow::{bail, Context, Result};
use dhrd_io::{DeviceProfile, Durable, FileBacking, FileOptions};
use dhrd_tier::{LowerIdentity, TierMode, TierStats, WriteBack, WriteBackStats};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// `statfs` magic numbers of file systems held in RAM only.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;
/// The write-back tier over whatever backing the export opened.
pub type NvmTier = WriteBack<Arc<dyn Durable>, Arc<dyn Durable>>;

/// Write-back threads of the NVM tier.
pub const WRITEBACK_THREADS: usize = dhrd_tier::writeback::WRITEBACK_THREADS_DEFAULT;

/// What the RAM tier's memory is: `dram` (volatile, write-through) or `nvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RamKind {
    Dram,
    Nvm,
}

/// Refuses a file whose directory is on a RAM-only file system.
fn check_non_volatile(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .context("--ram-file path contains a NUL byte")?;
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed statfs the call fills.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", dir.display()));
    }
    let magic = st.f_type as i64;
    if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
        bail!(
            "--ram-file {} is on tmpfs/ramfs, which loses its contents at power off: writes \
             acknowledged there would not be durable. Put it on persistent memory (a DAX \
             mount) or drop --ram-kind nvm",
            path.display()
        );
    }
    Ok(())
}

/// Puts the write-back tier in front of `backing`.
pub fn wrap(
    backing: Arc<dyn Durable>,
    identity: LowerIdentity,
    ram_file: &Path,
    chunk_bytes: u64,
    timing: Option<DeviceProfile>,
) -> Result<Arc<NvmTier>> {
    check_non_volatile(ram_file)?;
    // Absolute, so that the backing's cache mark names it from anywhere.
    let ram_file = &std::path::absolute(ram_file).context("--ram-file path")?;
    let fast = FileBacking::open(
        ram_file,
        &FileOptions {
            create: true,
            ..Default::default()
        },
    )
    .with_context(|| format!("opening --ram-file {}", ram_file.display()))?;
    let fast: Arc<dyn Durable> = crate::timing::wrap(Arc::new(fast), timing);
    let wb = WriteBack::open(fast, backing, identity, chunk_bytes, WRITEBACK_THREADS)
        .with_context(|| format!("opening the write-back tier on {}", ram_file.display()))?;
    Ok(Arc::new(wb))
}

pub fn describe(s: &WriteBackStats) -> String {
    format!(
        "{} of {} chunks dirty ({} dirty at start), {} written back, {} write-back failures, {} fills",
        s.chunks_dirty,
        s.chunks,
        s.chunks_dirty_at_open,
        s.chunks_written_back,
        s.writeback_failures,
        s.fills
    )
}

/// At a clean stop: waits up to `timeout` for the write-back to finish and says how it
/// ended. Dirty data left behind is safe in the file and written back at the next start.
pub fn drain(wb: &NvmTier, timeout: Duration) {
    let done = wb.drain(timeout);
    let s = wb.stats();
    let failure = wb.failure();
    if let Some(why) = &failure {
        eprintln!("dhrd nbd: the --ram-file failed: {why}");
    }
    if done {
        eprintln!("dhrd nbd: write-back complete: {}", describe(&s));
    } else {
        eprintln!(
            "dhrd nbd: write-back not finished{}: {}; the dirty chunks are safe in the \
             --ram-file and are written back at the next start",
            stopped_after(failure.is_some(), timeout),
            describe(&s)
        );
    }
}

pub use dhrd_tier::SsdTier;

/// Puts an SSD cache tier of `ssd_bytes` in `ssd_file` in front of `lower`.
pub fn tier(
    lower: Arc<dyn Durable>,
    identity: LowerIdentity,
    ssd_file: &Path,
    ssd_bytes: u64,
    chunk_bytes: u64,
    mode: TierMode,
    timing: Option<DeviceProfile>,
) -> Result<Arc<SsdTier>> {
    let t = dhrd_tier::open_ssd_file(
        lower,
        identity,
        ssd_file,
        ssd_bytes,
        chunk_bytes,
        mode,
        timing,
    )
    .with_context(|| format!("opening the SSD tier on {}", ssd_file.display()))?;
    Ok(Arc::new(t))
}

pub fn describe_tier(s: &TierStats) -> String {
    format!(
        "{} of {} slots used, {} dirty ({} at start); reads {} from the SSD, {} from the lower tier; \
         {} promoted, {} evicted, {} written back ({} failures), {} writes bypassed the SSD; \
         {} write misses filled only their parts, {} slots completed by the write-back",
        s.slots_used,
        s.slots,
        s.slots_dirty,
        s.dirty_at_open,
        s.reads_ssd,
        s.reads_lower,
        s.promotions,
        s.evictions,
        s.written_back,
        s.writeback_failures,
        s.writes_bypassed,
        s.partial_fills,
        s.completions
    )
}

/// At a clean stop: waits up to `timeout` for the SSD tier's write-back.
pub fn drain_tier(t: &SsdTier, timeout: Duration) {
    let done = t.drain(timeout);
    let s = t.stats();
    let failure = t.failure();
    if let Some(why) = &failure {
        eprintln!("dhrd nbd: the --tier-ssd failed: {why}");
    }
    if done {
        eprintln!("dhrd nbd: SSD tier written back: {}", describe_tier(&s));
    } else {
        eprintln!(
            "dhrd nbd: SSD tier write-back not finished{}: {}; the dirty chunks are \
             safe on the SSD and are written back at the next start",
            stopped_after(failure.is_some(), timeout),
            describe_tier(&s)
        );
    }
}

/// How an unfinished drain ended: it gave up at once on a failed tier, or timed out.
fn stopped_after(failed: bool, timeout: Duration) -> String {
    if failed {
        String::new()
    } else {
        format!(" after {} s", timeout.as_secs())
    }
}
