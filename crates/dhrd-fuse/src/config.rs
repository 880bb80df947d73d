//! What a mount is configured with: the data path (`--read-path`), listings, the RAM
//! budget, and the bounds every handler shares.
//!
//! No state and no crash semantics: these are values read once at mount.

use dhrd_engine::Durability;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How long the kernel may cache entries and attributes. Long, because nothing changes the
/// tree except requests through this daemon (see docs/fuse.md for changes behind its back).
pub const ATTR_TTL: Duration = Duration::from_secs(3600);
/// Entries one READDIRPLUS reply is built from at most (each is stat'ed; the kernel's
/// buffer, usually 4 KiB to 128 KiB, holds fewer of these large entries anyway).
pub const READDIRPLUS_BATCH_MAX: usize = 1024;
/// How long a read-only open on the engine's passthrough path waits for its file to finish
/// loading before it falls back to the direct path.
pub const PASSTHROUGH_LOAD_WAIT: Duration = Duration::from_secs(2);
/// Largest write the kernel sends in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Least `max_background` the daemon announces at INIT: the kernel's (and fuser's and
/// libfuse's) default. Page cache readahead and writeback are background requests too.
pub const MAX_BACKGROUND_MIN: u16 = 16;
/// Block size reported by stat for regular files.
pub const STAT_BLKSIZE: u32 = 4096;
/// Most bytes one COPY_FILE_RANGE request copies. The reply counts in 32 bits, and a
/// bounded request keeps one worker from being held for seconds; callers (cp, the kernel's
/// own loop) repeat on a short copy.
pub const COPY_REQUEST_BYTES_MAX: u64 = 64 << 20;
/// Bytes moved per write inside a copy. In `sync` mode each step is one durable write, so
/// a copy pays a device flush per 8 MiB instead of one per 64 KiB pipe buffer, which is
/// what the kernel's splice fallback (and its copy_file_range on a sync inode) would pay.
pub const COPY_STEP_BYTES: u64 = 8 << 20;

/// Where file data lives and how the kernel reaches it (SPEC D1, D4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPath {
    /// The page cache when this kernel and backing file system allow it (see
    /// `PageCache`), else the engine with `EngineAuto`, and the mount says why.
    #[default]
    Auto,
    /// The RAM tier is the page cache of the backing files themselves: every open of a
    /// regular file is passed through to its backing file, reads and writes are served by
    /// the kernel, writes are made synchronous by the inode's sync flag (`sync` mode).
    /// The mount fails if the kernel or the backing file system cannot do it.
    PageCache,
    /// The engine (a memfd per file): passthrough for read-only opens of loaded files
    /// without write permission bits, daemon reads otherwise.
    EngineAuto,
    /// The engine; every read-only open of a loaded file is passed through to the memfd
    /// (waiting up to `PASSTHROUGH_LOAD_WAIT` for the load); writers beside such readers
    /// get ETXTBSY.
    EnginePassthrough,
    /// The engine; every read goes to the daemon (FOPEN_DIRECT_IO): byte range, no page
    /// cache.
    EngineDirect,
    /// The engine behind the kernel's page cache of the mount (the paper's "DHRD without
    /// DBR": two copies).
    EngineCached,
}

impl ReadPath {
    /// Whether this path uses the engine's RAM tier.
    pub fn is_engine(self) -> bool {
        !matches!(self, ReadPath::Auto | ReadPath::PageCache)
    }
}

impl FromStr for ReadPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        // The engine paths' names before the page cache became the default are kept.
        match s {
            "auto" => Ok(Self::Auto),
            "pagecache" | "page-cache" => Ok(Self::PageCache),
            "engine-auto" => Ok(Self::EngineAuto),
            "engine-passthrough" | "passthrough" => Ok(Self::EnginePassthrough),
            "engine-direct" | "direct" => Ok(Self::EngineDirect),
            "engine-cached" | "cached" => Ok(Self::EngineCached),
            _ => Err(format!(
                "bad read path {s:?}: use auto, pagecache, engine-auto, engine-passthrough, \
                 engine-direct or engine-cached"
            )),
        }
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::PageCache => "pagecache",
            Self::EngineAuto => "engine-auto",
            Self::EnginePassthrough => "engine-passthrough",
            Self::EngineDirect => "engine-direct",
            Self::EngineCached => "engine-cached",
        })
    }
}

/// When directory listings carry each entry's attributes (READDIRPLUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReaddirPlus {
    /// The kernel decides per call: the first batch of a listing, and later batches when
    /// lookups followed the previous one (ls -l, rsync). Tools that list a whole directory
    /// before stat'ing (du, find with stat tests, both via fts) get plain listings.
    #[default]
    Auto,
    /// Every listing: du and find -size/-mtime about 3x faster, name-only listings (find
    /// -name, ls -f) about 7x slower (the daemon stats every entry and the kernel builds
    /// an inode for each); measured in docs/fuse.md.
    Always,
    Off,
}

impl FromStr for ReaddirPlus {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "bad readdirplus mode {s:?}: use auto, always or off"
            )),
        }
    }
}

impl fmt::Display for ReaddirPlus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Off => "off",
        })
    }
}

/// Options of the file system (the mount options live in `adapter/session.rs`).
#[derive(Debug, Clone)]
pub struct FsConfig {
    pub durability: Durability,
    pub read_path: ReadPath,
    /// RAM budget shared by all files (SPEC I11): pinned page cache, or engine RAM.
    pub mem_bytes: u64,
    /// Chunk size of each engine object; None = the engine's default.
    pub chunk_bytes: Option<u64>,
    /// Background threads that load (engine) or warm (page cache) files.
    pub loader_threads: usize,
    /// Cap on the background load rate (bytes/s), shared by all files.
    pub load_rate: Option<u64>,
    /// Walk the tree after mounting and load files in the background.
    pub preload: bool,
    /// Page cache: lock what is warmed in RAM, within `mem_bytes`.
    pub pin: bool,
    pub readdirplus: ReaddirPlus,
    /// Engine objects kept after their last close (`objects::CLOSED_OBJECTS_MAX`).
    pub object_cache: usize,
    /// Directory descriptors kept (`nodes::DIR_FDS_MAX`; lowered to fit the descriptor
    /// limit at start).
    pub dir_fds_max: usize,
    /// Page cache path: registrations kept after their last close
    /// (`page::LINGER_MAX`; lowered to fit the descriptor limit at start).
    pub linger_max: usize,
    /// Page cache path: descriptors of dropped registrations kept until asked for their
    /// writeback error (`kept::KEPT_FDS_MAX`; lowered to fit the descriptor limit at
    /// start).
    pub kept_fds_max: usize,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn read_paths_parse_by_old_and_new_names() {
        for (s, p) in [
            ("auto", ReadPath::Auto),
            ("pagecache", ReadPath::PageCache),
            ("page-cache", ReadPath::PageCache),
            ("engine-auto", ReadPath::EngineAuto),
            ("passthrough", ReadPath::EnginePassthrough),
            ("engine-passthrough", ReadPath::EnginePassthrough),
            ("direct", ReadPath::EngineDirect),
            ("engine-direct", ReadPath::EngineDirect),
            ("cached", ReadPath::EngineCached),
            ("engine-cached", ReadPath::EngineCached),
        ] {
            let got: ReadPath = s.parse().expect("parses");
            assert_eq!(got, p);
            assert_eq!(got.to_string().parse::<ReadPath>(), Ok(p));
        }
        assert!("nope".parse::<ReadPath>().is_err());
        assert!(!ReadPath::Auto.is_engine() && ReadPath::EngineDirect.is_engine());
    }
}
