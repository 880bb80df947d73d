//! Options of an object. Every bound is a named constant here; the loader's own options
//! and bounds are in `loader.rs` (re-exported here), which imports nothing from this file.

use crate::ahead::{ReadAhead, WINDOW_MAX_CHUNKS_DEFAULT};
use crate::cache::{Admission, CachePolicy};
// The loader's own options live beside it; they are named here with the object's.
use crate::loader::{LoadGate, Loader};
pub use crate::loader::{LoaderConfig, LOADER_THREADS_DEFAULT, LOADER_THREADS_MAX};
use dhrd_io::RamBudget;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Default chunk size, chosen from the sweep recorded in `bench/results/` and
/// `docs/design.md` (load rate flat from 1 MiB up, write blocking on a loading chunk grows
/// with chunk size).
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 20;
/// Largest object the RAM tier can map (virtual address space is 128 TiB on x86-64).
pub const OBJECT_BYTES_MAX: u64 = 1 << 46;
/// Demand-priority queue bound per object (I10); more demands are dropped, the
/// sequential pass still reaches those chunks.
pub const DEMAND_QUEUE_MAX: usize = 256;
/// Objects up to this size may be loaded on the opening thread (`inline_load_bytes_max`):
/// for a small file the one read the loader would do costs less than waking a loader
/// thread, and the read that follows an open finds the data in RAM.
pub const INLINE_LOAD_BYTES_MAX: u64 = 64 << 10;

/// When writes become durable (docs/requirements.md, durability modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every write and metadata change is durable before the call returns.
    #[default]
    Sync,
    /// Durable at `flush` (fsync, NBD FLUSH/FUA, unmount).
    Fsync,
    /// `Fsync` plus a flush every period.
    Periodic(Duration),
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::Sync => f.write_str("sync"),
            Durability::Fsync => f.write_str("fsync"),
            Durability::Periodic(d) => write!(f, "periodic:{}", d.as_secs()),
        }
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(Durability::Sync),
            "fsync" => Ok(Durability::Fsync),
            _ => {
                let secs = s
                    .strip_prefix("periodic:")
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        format!("bad durability {s:?}: use sync, fsync or periodic:N")
                    })?;
                Ok(Durability::Periodic(Duration::from_secs(secs)))
            }
        }
    }
}

impl Durability {
    /// How a file backing makes writes durable in this mode; every frontend opens its
    /// file backings with it. In `sync` mode each write must be durable before its reply:
    /// whole aligned blocks go to the device once, through O_DIRECT with RWF_DSYNC, as a
    /// raw O_DIRECT|O_DSYNC write does (concurrent writers reach the device in parallel),
    /// where `pwrite` plus `fdatasync` costs a write and a flush (docs/benchmarks.md,
    /// "Durable block writes"). In the other modes writes wait for a flush anyway, so they
    /// are buffered and made durable together by one `fdatasync`.
    pub fn file_write_sync(self) -> dhrd_io::WriteSync {
        match self {
            Durability::Sync => dhrd_io::WriteSync::DirectDsync,
            Durability::Fsync | Durability::Periodic(_) => dhrd_io::WriteSync::Fdatasync,
        }
    }
}

/// How the RAM tier's memory is held.
#[derive(Debug, Clone, Default)]
pub struct RamOptions {
    /// Lock pages in memory as they are first touched (mlock2 MLOCK_ONFAULT).
    pub mlock: bool,
    /// Ask for transparent huge pages (effective when shmem THP is `advise` or `always`).
    pub huge_pages: bool,
    /// Touch every page of the RAM tier when it is made (MADV_POPULATE_WRITE, Linux
    /// 5.14), so that the load writes into memory already there: the first touch's cost
    /// (zeroing, and on a VM the host's) moves to the open. For measuring the load
    /// pipeline apart from fresh RAM; it costs the same time, earlier.
    pub prefault: bool,
}

/// Cache mode and read-ahead (SPEC M1-M3, M2, M5; `cache.rs`, `ahead.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// What leaves RAM when a load needs room once the RAM budget is exhausted.
    pub policy: CachePolicy,
    /// Which misses bring their chunk into RAM once the budget is exhausted (or from the
    /// start without `prefill`).
    pub admission: Admission,
    pub read_ahead: ReadAhead,
    pub read_ahead_window_max_chunks: u64,
    /// The background loader copies the object into RAM in order until the budget is
    /// full (the hybrid disk's warm-up, I7). Off: RAM fills only by admission, read-ahead
    /// and writes (a pure cache).
    pub prefill: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            policy: CachePolicy::default(),
            admission: Admission::default(),
            read_ahead: ReadAhead::default(),
            read_ahead_window_max_chunks: WINDOW_MAX_CHUNKS_DEFAULT,
            prefill: true,
        }
    }
}

/// Options of one hybrid object.
#[derive(Clone)]
pub struct ObjectConfig {
    pub chunk_bytes: u64,
    pub durability: Durability,
    pub ram: RamOptions,
    /// Shared RAM budget; `None` is unlimited.
    pub budget: Option<Arc<RamBudget>>,
    /// Shared loader; `None` starts a private one with `loader_config`.
    pub loader: Option<Loader>,
    pub loader_config: LoaderConfig,
    /// Do not load at all (cache-mode experiments, tests).
    pub load_disabled: bool,
    /// Chunks read while unloaded are loaded ahead of the sequential order (I10).
    pub demand_priority: bool,
    /// The size never changes (block devices, NBD exports).
    pub fixed_len: bool,
    pub read_only: bool,
    /// Name of the memfd, visible in /proc/PID/fd.
    pub name: String,
    /// An object no longer than this is loaded by `open` itself instead of the loader
    /// threads (0: never). Ignored with `load_disabled` or a `gate`.
    pub inline_load_bytes_max: u64,
    /// Test hook: lets a test pause the loader at a chosen chunk.
    pub gate: Option<Arc<LoadGate>>,
    pub cache: CacheConfig,
}

impl Default for ObjectConfig {
    fn default() -> Self {
        Self {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            durability: Durability::Sync,
            ram: RamOptions::default(),
            budget: None,
            loader: None,
            loader_config: LoaderConfig::default(),
            load_disabled: false,
            demand_priority: true,
            fixed_len: false,
            read_only: false,
            name: String::from("dhrd"),
            inline_load_bytes_max: 0,
            gate: None,
            cache: CacheConfig::default(),
        }
    }
}

impl fmt::Debug for ObjectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectConfig")
            .field("chunk_bytes", &self.chunk_bytes)
            .field("durability", &self.durability)
            .field("fixed_len", &self.fixed_len)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_parses() {
        assert_eq!("sync".parse(), Ok(Durability::Sync));
        assert_eq!(
            "periodic:5".parse(),
            Ok(Durability::Periodic(Duration::from_secs(5)))
        );
        assert!("periodic:0".parse::<Durability>().is_err());
        assert!("often".parse::<Durability>().is_err());
        assert_eq!(
            Durability::Periodic(Duration::from_secs(7)).to_string(),
            "periodic:7"
        );
    }
}
