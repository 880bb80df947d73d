//! dhrd-stack: builds the storage stack under a hybrid object, the one way every frontend
//! does it (`dhrd nbd`, `dhrd load`, the C API, the benchmarks). Bottom up:
//!
//! 1. the backing: a file or block device (`dhrd_io::FileBacking`: the single-writer lock,
//!    the write mode the durability asks for, `Durability::file_write_sync`) or a Ceph RBD
//!    image (`dhrd_rbd::RbdBacking`), [`backing`];
//! 2. optional device timing of the backing (SPEC E1, `dhrd_io::Timed`);
//! 3. optional fast layer: NVM write-back or the SSD cache tier (`dhrd_tier`), [`fast`];
//! 4. the engine's `HybridObject` over the top device.
//!
//! The engine knows nothing of the layers: it sees one `Durable`. This crate sits above
//! the engine, the devices (`dhrd-tier`) and the RBD backing, and below the frontends, so
//! every dependency still points downward; `dhrd-tier` stays the devices alone.
//!
//! Invariants:
//! - nothing is written before every check passed: a backing a cache marked as lacking its
//!   data is refused (or its mark dropped, when asked) before any layer or object opens,
//!   and each fast layer checks its own pairing with the backing as it opens;
//! - a fast layer never sits under a read-only object;
//! - closing goes top down: the object flushes and stops first, then the fast layer drains
//!   and closes (its record, mark and stamp, `dhrd_tier::pairing`) while the backing is
//!   still open, then an RBD backing closes, releasing its lock ([`Stack::release`]).
//!
//! Crash semantics: the stack adds none of its own; each layer keeps its own
//! (docs/crash-model.md). What happened at open that a caller may want to report (a lock
//! taken over, a cache distrusted, dirty chunks found) is in [`Stack::notices`].

mod backing;
mod error;
mod fast;
mod status;

pub use error::{Error, Result};
pub use fast::NVM_WRITEBACK_THREADS;
pub use status::{status, ENGINE_FIELDS};

use dhrd_engine::{HybridObject, ObjectConfig, DEFAULT_CHUNK_BYTES};
use dhrd_io::{DeviceProfile, Durable, Timed, WriteSync};
use dhrd_rbd::{RbdBacking, RbdOptions};
use dhrd_tier::{SsdTier, TierMode, TierStats, WriteBack, WriteBackStats};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The NVM write-back layer over whatever backing the stack opened.
pub type NvmLayer = WriteBack<Arc<dyn Durable>, Arc<dyn Durable>>;

/// The object a stack serves.
pub type Object = HybridObject<Arc<dyn Durable>>;

/// Where the bytes live, and how the backing is opened.
#[derive(Debug, Clone)]
pub struct BackingConfig {
    /// A regular file, a block device, or a Ceph RBD image as `rbd:POOL/IMAGE` (also
    /// `rbd:POOL/NAMESPACE/IMAGE`; `@SNAP` opens a snapshot, read-only).
    pub name: PathBuf,
    /// Create a missing file or image (an image needs `min_len`); never when read-only.
    pub create: bool,
    /// Extend a regular file or an image to at least this many bytes (never shrink).
    pub min_len: Option<u64>,
    /// How writes reach a file or block device; `None`: what the object's durability asks
    /// for (`Durability::file_write_sync`).
    pub write_sync: Option<WriteSync>,
    /// Take a file's single-writer lock. Off only for a caller that keeps other writers
    /// away itself (a benchmark timing two objects over one file without reading back).
    pub file_lock: bool,
    /// An RBD image's settings; `create`, `min_len` and `read_only` come from this config
    /// and the object's.
    pub rbd: RbdOptions,
    /// Device timing of the backing (E1).
    pub timing: Option<DeviceProfile>,
}

impl BackingConfig {
    /// The backing `name` with the defaults: not created, locked, untimed.
    pub fn new(name: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            create: false,
            min_len: None,
            write_sync: None,
            file_lock: true,
            rbd: RbdOptions::default(),
            timing: None,
        }
    }
}

/// A non-volatile fast layer between the backing and the object: writes are acknowledged
/// once durable on it and written back to the backing in the background.
#[derive(Debug, Clone)]
pub enum FastLayer {
    /// NVM write-back (SPEC M4): a file on non-volatile memory (a pmem/DAX mount), created
    /// if missing; refused on tmpfs or ramfs.
    Nvm {
        file: PathBuf,
        timing: Option<DeviceProfile>,
    },
    /// The SSD cache tier (SPEC T1): an SSD file of `bytes` bytes (header and slot table
    /// included) caching the backing in chunk slots, created if missing.
    Ssd {
        file: PathBuf,
        bytes: u64,
        mode: TierMode,
        timing: Option<DeviceProfile>,
    },
}

impl FastLayer {
    pub fn kind(&self) -> Layer {
        match self {
            FastLayer::Nvm { .. } => Layer::Nvm,
            FastLayer::Ssd { .. } => Layer::Ssd,
        }
    }
}

/// Which fast layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Nvm,
    Ssd,
}

impl Layer {
    /// What messages call it.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Nvm => "NVM write-back layer",
            Layer::Ssd => "SSD tier",
        }
    }
}

/// A whole stack, bottom to top.
#[derive(Clone)]
pub struct StackConfig {
    pub backing: BackingConfig,
    pub fast: Option<FastLayer>,
    /// Keep the dirty chunks of a fast layer made for another backing, or whose backing
    /// changed while detached, and write them back over it (`LowerIdentity::adopt`).
    pub adopt_cache: bool,
    /// Start although the backing is marked as lacking data a cache holds that this stack
    /// does not have: the mark is removed, or replaced by this stack's fast layer's
    /// (`LowerIdentity::ignore_mark`). That cache's data is then lost for the backing.
    pub drop_cache_mark: bool,
    /// Chunk size of the RAM tier and the fast layer; `None`: the backing's own (an RBD
    /// image's object size), else the engine's default. It replaces `object.chunk_bytes`.
    pub chunk_bytes: Option<u64>,
    /// The hybrid object's settings; its `read_only` holds for every layer, and with
    /// `fixed_len` an empty backing is refused.
    pub object: ObjectConfig,
}

/// Something that happened while the stack opened, for the caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// The RBD image's lock was taken over from `from`, a dhrd of this host that is no
    /// longer running (that client is now blocklisted).
    LockTakenOver { image: String, from: String },
    /// The file system refused direct I/O: each write is buffered, then synced.
    NoDirectWrites { backing: String, why: String },
    /// A regular file larger than the `min_len` asked for: served at its size.
    LargerThanAsked {
        backing: String,
        len: u64,
        asked: u64,
    },
    /// A read-only start over a backing marked as lacking data that `holder` holds.
    ServedDespiteMark { key: String, holder: String },
    /// `drop_cache_mark`: the mark of `holder` was removed; its data is lost for the
    /// backing.
    MarkDropped { key: String, holder: String },
    /// The fast layer was made for another backing, or the backing changed while it was
    /// detached (`why`): its clean chunks were dropped and its dirty ones adopted.
    Distrusted {
        layer: Layer,
        why: String,
        dropped: u64,
        adopted: u64,
    },
    /// Chunks dirty in the fast layer at open (after a crash or an unfinished write-back):
    /// served from it and written back now.
    DirtyAtOpen { layer: Layer, chunks: u64 },
    /// An SSD tier of the first format: its dirty chunks were written to the backing and
    /// it was formatted anew.
    Upgraded { chunks: u64 },
}

/// The fast layer under an object (cheap to clone: a status writer keeps one).
#[derive(Clone, Default)]
pub struct Layers {
    pub writeback: Option<Arc<NvmLayer>>,
    pub tier: Option<Arc<SsdTier>>,
}

/// The statistics of the fast layer, under the names of the status document.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writeback: Option<WriteBackStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierStats>,
}

impl Layers {
    pub fn stats(&self) -> LayerStats {
        LayerStats {
            writeback: self.writeback.as_ref().map(|w| w.stats()),
            tier: self.tier.as_ref().map(|t| t.stats()),
        }
    }
}

/// How a fast layer's write-back ended at a close.
#[derive(Debug, Clone)]
pub struct Drained<S> {
    /// Nothing was left dirty.
    pub done: bool,
    /// Why the layer failed, if it did (it then stops writing back at once).
    pub failure: Option<String>,
    pub stats: S,
}

/// What [`Stack::release`] did under the object.
#[derive(Debug, Clone, Default)]
pub struct Released {
    pub writeback: Option<Drained<WriteBackStats>>,
    pub tier: Option<Drained<TierStats>>,
}

/// An open stack: the object and what is under it.
pub struct Stack {
    object: Object,
    layers: Layers,
    rbd: Option<Arc<RbdBacking>>,
    description: String,
    notices: Vec<Notice>,
    object_closed: bool,
}

/// `backing`, timed as `profile` says.
pub(crate) fn timed(backing: Arc<dyn Durable>, profile: Option<DeviceProfile>) -> Arc<dyn Durable> {
    match profile {
        Some(p) => Arc::new(Timed::new(backing, p)),
        None => backing,
    }
}

impl Stack {
    /// Opens the stack `cfg` describes, bottom up; on an error, what was opened is closed
    /// again (dropped) and nothing above the failed layer exists.
    pub fn open(cfg: StackConfig) -> Result<Stack> {
        let read_only = cfg.object.read_only;
        let mut notices = Vec::new();
        let durability = cfg.object.durability;
        let mut opened = backing::open(&cfg.backing, durability, read_only, &mut notices)?;
        let name = cfg.backing.name.display().to_string();
        if cfg.object.fixed_len && opened.backing.len().map_err(|e| size_error(&name, e))? == 0 {
            return Err(Error::Empty { name });
        }
        opened.identity.adopt = cfg.adopt_cache;
        opened.identity.ignore_mark = cfg.drop_cache_mark;
        if cfg.fast.is_none() {
            backing::uncached_start(&opened.identity, read_only, &mut notices)?;
        }
        // Described before the timing wrapper, which callers name on its own.
        let description = opened.backing.describe();
        let backing = timed(opened.backing, cfg.backing.timing);
        let chunk_bytes = cfg
            .chunk_bytes
            .or(opened.preferred_chunk)
            .unwrap_or(DEFAULT_CHUNK_BYTES);
        let (top, layers) = fast::open(
            cfg.fast.as_ref(),
            backing,
            opened.identity,
            chunk_bytes,
            durability,
            read_only,
            &mut notices,
        )?;
        let object_cfg = ObjectConfig {
            chunk_bytes,
            ..cfg.object
        };
        let object = HybridObject::open(top, object_cfg).map_err(Error::Object)?;
        Ok(Stack {
            object,
            layers,
            rbd: opened.rbd,
            description,
            notices,
            object_closed: false,
        })
    }

    /// The object, to serve from (cheap to clone).
    pub fn object(&self) -> &Object {
        &self.object
    }

    /// The fast layer under the object, if any.
    pub fn layers(&self) -> &Layers {
        &self.layers
    }

    /// What the backing is (its own description, without the device timing).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// What happened while the stack opened.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// The status document of the stack (module `status`).
    pub fn status(&self) -> serde_json::Map<String, serde_json::Value> {
        status(&self.object, &self.layers.stats())
    }

    /// Flushes the object (unless read-only) and stops its loading: the first step of a
    /// close, which a caller may report on before [`Stack::release`] drains the layers.
    pub fn close_object(&mut self) -> dhrd_engine::Result<()> {
        self.object_closed = true;
        self.object.close()
    }

    /// The rest of a close, after [`Stack::close_object`]: the fast layer writes back for
    /// up to `drain` (what is left stays safe in it and is written back at the next open)
    /// and closes its pairing while the backing is open; an RBD backing closes last.
    pub fn release(self, drain: Duration) -> Released {
        assert!(
            self.object_closed,
            "the layers under an object are released only after the object closed"
        );
        let writeback = self.layers.writeback.as_ref().map(|w| {
            let done = w.drain(drain);
            let d = Drained {
                done,
                failure: w.failure(),
                stats: w.stats(),
            };
            w.close();
            d
        });
        let tier = self.layers.tier.as_ref().map(|t| {
            let done = t.drain(drain);
            let d = Drained {
                done,
                failure: t.failure(),
                stats: t.stats(),
            };
            t.close();
            d
        });
        if let Some(r) = &self.rbd {
            r.close();
        }
        Released { writeback, tier }
    }

    /// Closes the whole stack: [`Stack::close_object`], then [`Stack::release`].
    pub fn close(mut self, drain: Duration) -> (dhrd_engine::Result<()>, Released) {
        let flushed = self.close_object();
        (flushed, self.release(drain))
    }
}

fn size_error(name: &str, source: std::io::Error) -> Error {
    Error::File {
        what: "sizing",
        name: name.to_string(),
        source,
    }
}
