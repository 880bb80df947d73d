//! dhrd-engine: the durable hybrid RAM object.
//!
//! Every byte of an object lives twice: in a RAM tier that serves reads (a memfd, so a
//! frontend can also hand it to the kernel) and on a durable backing that every write
//! reaches before it is acknowledged. After a restart, a background loader copies the
//! backing into RAM chunk by chunk while requests are already served, following the
//! rules of requirements I1-I11. This crate knows nothing about FUSE or NBD: frontends translate
//! their protocol into `read_at`, `write_at`, `zero_range`, `flush` and `set_len`.
//!
//! See `docs/design.md` for the architecture and `docs/crash-model.md` for what is durable
//! when.

pub mod ahead;
pub mod cache;
mod commit;
mod config;
mod error;
mod layout_lock;
mod loader;
mod object;
mod ram;
mod slot;
mod stats;
mod units;

pub use ahead::ReadAhead;
// The budget lives below both RAM tiers (the page cache tier charges it too).
pub use cache::{Admission, CachePolicy};
pub use config::{
    CacheConfig, Durability, LoaderConfig, ObjectConfig, RamOptions, DEFAULT_CHUNK_BYTES,
    DEMAND_QUEUE_MAX, INLINE_LOAD_BYTES_MAX, LOADER_THREADS_DEFAULT, LOADER_THREADS_MAX,
    OBJECT_BYTES_MAX,
};
pub use dhrd_io::{Allocation, Extent, RamBudget};
pub use error::{BackingOp, Error, FailureCause, Result};
pub use loader::{LoadGate, Loader};
pub use object::{HybridObject, LoadProgress, LoadStep, RamView, ReadOutcome, Served, View};
pub use slot::ChunkState;
pub use stats::{Latency, StatsSnapshot};
pub use units::{
    parse_chunk_size, parse_size, ChunkGeometry, ChunkIndex, Piece, CHUNK_BYTES_MAX,
    CHUNK_BYTES_MIN,
};
