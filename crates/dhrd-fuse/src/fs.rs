//! The FUSE request handlers: each request becomes either engine calls on the file's hybrid
//! object (file data) or confined `*at` system calls on the backing directory (metadata).
//!
//! Invariants:
//! - The daemon is the only writer of the tree while mounted; the kernel caches entries and
//!   attributes for `ATTR_TTL` because every change passes through here. The one change the
//!   kernel does not expect is the set-id bits a write or fallocate drops (killpriv.rs); the
//!   daemon invalidates the inode's cached attributes when it drops them.
//! - Data: every read and write of a regular file goes to its `HybridObject` (one per backing
//!   inode, see `objects.rs`), or, for passthrough opens, the kernel reads the object's
//!   memfd, which is the RAM copy the engine writes into before a write is acknowledged;
//!   so a read that starts after a write returned sees it, on every read path (SPEC D3).
//! - Metadata: in `sync` durability every change (create, mkdir, mknod, symlink, link,
//!   rename, unlink, rmdir, setattr, setxattr, removexattr, set-id bits dropped by a write,
//!   truncate, chown or fallocate) is followed by `fsync` of the changed inode and of the
//!   parent directory (both parents for rename) before the reply. Set-id bits are dropped
//!   (in `sync` mode durably) before the data changes, so a crash cannot leave new content
//!   with them still set. In `fsync` / `periodic:N` the backing file system is `syncfs`'ed
//!   at fsync, fsyncdir, every period and at unmount instead.
//!
//! Crash semantics: a reply that reported success in `sync` mode is on the backing device.
//! A crash between the backing operation and its fsync leaves whatever the backing file
//! system recovers, which is either the old or the new state of that one operation.

use crate::error::{FsError, Result};
use crate::killpriv::{self, Caller, Fsetid};
use crate::nodes::{Fh, Ino, NodeTable};
use crate::objects::{Obj, Objects, OpenKind, ParkedReader, PassthroughChoice, ReaderState};
use crate::stats::FsStats;
use crate::sys::{self, BackingDir, FUSE_ROOT_INO};
use dhrd_engine::{Durability, RamBudget, Served};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::{Mutex, RwLock};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache entries and attributes. Long, because nothing changes the
/// tree except requests through this daemon (see docs/fuse.md for changes behind its back).
pub const ATTR_TTL: Duration = Duration::from_secs(3600);
/// Entries one READDIRPLUS reply is built from at most (each is stat'ed; the kernel's
/// buffer, usually 4 KiB to 128 KiB, holds fewer of these large entries anyway).
pub const READDIRPLUS_BATCH_MAX: usize = 1024;
/// How long a read-only open in `--read-path passthrough` waits for its file to finish
/// loading before it falls back to the direct path.
pub const PASSTHROUGH_LOAD_WAIT: Duration = Duration::from_secs(2);
/// Largest write the kernel sends in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Kernel stacking depth announced with passthrough (1: the memfd is on shmem, depth 0).
pub const PASSTHROUGH_STACK_DEPTH: u32 = 1;
/// Block size reported by stat for regular files.
pub const STAT_BLKSIZE: u32 = 4096;
/// Most bytes one COPY_FILE_RANGE request copies. The reply counts in 32 bits, and a
/// bounded request keeps one worker from being held for seconds; callers (cp, the kernel's
/// own loop) repeat on a short copy.
pub const COPY_REQUEST_BYTES_MAX: u64 = 64 << 20;
/// Bytes moved per engine write inside a copy. In `sync` mode each step is one durable
/// write, so a copy pays a device flush per 8 MiB instead of one per 64 KiB pipe buffer,
/// which is what the kernel's splice fallback sends when the daemon does not copy itself.
pub const COPY_STEP_BYTES: u64 = 8 << 20;

/// Which kernel read path opens use (SPEC D4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPath {
    /// Passthrough for read-only opens of fully loaded files, direct otherwise.
    #[default]
    Auto,
    /// Like auto, but a read-only open waits up to `PASSTHROUGH_LOAD_WAIT` for the load.
    Passthrough,
    /// Every read goes to the daemon (FOPEN_DIRECT_IO): byte range, no page cache.
    Direct,
    /// Kernel page cache in front of the RAM tier (the paper's "DHRD without DBR").
    Cached,
}

impl FromStr for ReadPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(ReadPath::Auto),
            "passthrough" => Ok(ReadPath::Passthrough),
            "direct" => Ok(ReadPath::Direct),
            "cached" => Ok(ReadPath::Cached),
            _ => Err(format!(
                "bad read path {s:?}: use auto, passthrough, direct or cached"
            )),
        }
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReadPath::Auto => "auto",
            ReadPath::Passthrough => "passthrough",
            ReadPath::Direct => "direct",
            ReadPath::Cached => "cached",
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

/// Options of the file system (the mount options live in `daemon.rs`).
#[derive(Debug, Clone)]
pub struct FsConfig {
    pub durability: Durability,
    pub read_path: ReadPath,
    /// RAM budget shared by all files (SPEC I11).
    pub mem_bytes: u64,
    /// Chunk size of each object; None = the engine's default.
    pub chunk_bytes: Option<u64>,
    pub loader_threads: usize,
    /// Cap on the background load rate (bytes/s), shared by all files.
    pub load_rate: Option<u64>,
    /// Walk the tree after mounting and load files in the background.
    pub preload: bool,
    pub readdirplus: ReaddirPlus,
    /// Objects kept after their last close (`objects::CLOSED_OBJECTS_MAX` by default).
    pub object_cache: usize,
}

/// One open file.
struct Handle {
    key: u64,
    data: HandleData,
    /// How the open was counted in `Objects` (passed back at release).
    kind: OpenKind,
}

enum HandleData {
    Object(Obj),
    /// A read-only open served from a parked copy until the inode gets an object; counted
    /// in `Objects` only once switched to it, and closed by `Objects::release_parked`
    /// (which ignores `Handle::kind`).
    Parked(Arc<ParkedReader>),
}

/// What a read through a handle reads from.
enum Source {
    Object(Obj),
    Bytes(Arc<Vec<u8>>),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::Object(o) => o.len(),
            Source::Bytes(b) => b.len() as u64,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(usize, Served)> {
        match self {
            Source::Object(o) => {
                let out = o.read_at(buf, offset)?;
                Ok((out.bytes, out.served))
            }
            Source::Bytes(b) => {
                let from = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let n = buf.len().min(b.len() - from);
                buf[..n].copy_from_slice(&b[from..from + n]);
                Ok((n, Served::Ram))
            }
        }
    }
}

/// Entries of an open directory, read once at its first READDIR (offsets are indexes into
/// it).
struct DirHandle {
    entries: Vec<(u64, FileType, OsString)>,
    /// The directory and its backing inode until the first READDIR reads it: when the
    /// kernel serves a listing from its cache (FOPEN_CACHE_DIR), none comes, and the
    /// backing directory is never read.
    unread: Option<(OwnedFd, u64)>,
}

/// Progress of the background walk that finds and preloads files.
#[derive(Default)]
pub struct PreloadState {
    pub files_seen: AtomicU64,
    pub bytes_seen: AtomicU64,
    pub files_preloaded: AtomicU64,
    pub done: AtomicBool,
}

/// State shared by the FUSE handlers, the control socket and the background threads.
pub struct Shared {
    pub dir: BackingDir,
    pub cfg: FsConfig,
    pub objects: Objects,
    pub budget: Arc<RamBudget>,
    pub stats: FsStats,
    pub preload: PreloadState,
    nodes: Mutex<NodeTable>,
    handles: RwLock<HashMap<Fh, Handle>>,
    dirs: Mutex<HashMap<Fh, DirHandle>>,
    next_fh: AtomicU64,
    pub shutdown: AtomicBool,
    pub passthrough_negotiated: AtomicBool,
    pub mmap_on_direct: AtomicBool,
    /// FUSE_HANDLE_KILLPRIV_V2 negotiated: the kernel leaves dropping set-id bits on cached
    /// writes, size changes, chown and fallocate to the daemon (killpriv.rs).
    pub killpriv_negotiated: AtomicBool,
    /// FUSE_ATOMIC_O_TRUNC accepted: OPEN carries O_TRUNC and the daemon truncates.
    pub atomic_o_trunc: AtomicBool,
    /// Sends cache invalidations to the kernel; set by the daemon once the session exists.
    pub notifier: OnceLock<fuser::Notifier>,
    /// Metadata changed since the last syncfs (non-sync modes).
    meta_dirty: AtomicBool,
    /// First failure of the flush at unmount; makes the daemon exit non-zero.
    final_error: Mutex<Option<String>>,
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn kind_of_dirent(t: rustix::fs::FileType) -> FileType {
    use rustix::fs::FileType as T;
    match t {
        T::Directory => FileType::Directory,
        T::Symlink => FileType::Symlink,
        T::Fifo => FileType::NamedPipe,
        T::Socket => FileType::Socket,
        T::CharacterDevice => FileType::CharDevice,
        T::BlockDevice => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn systime(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    }
}

fn timestamp(t: Option<TimeOrNow>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(st)) => {
            let (sec, nsec) = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
                Err(e) => (-(e.duration().as_secs() as i64), 0),
            };
            rustix::fs::Timespec {
                tv_sec: sec,
                tv_nsec: nsec as _,
            }
        }
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

impl Shared {
    pub fn new(dir: BackingDir, cfg: FsConfig) -> Result<Arc<Self>> {
        let object_cache = cfg.object_cache;
        let budget = RamBudget::new(cfg.mem_bytes);
        let loader = dhrd_engine::Loader::new(dhrd_engine::LoaderConfig {
            threads: cfg.loader_threads,
            rate_bytes_per_s: cfg.load_rate,
            ..Default::default()
        })?;
        // periodic:N: the engine would start one flusher thread per object; with thousands
        // of files the daemon runs a single flusher over all objects instead (daemon.rs)
        // and the objects themselves use `fsync` semantics.
        let object_durability = match cfg.durability {
            Durability::Periodic(_) => Durability::Fsync,
            d => d,
        };
        let mut base = dhrd_engine::ObjectConfig {
            durability: object_durability,
            budget: Some(budget.clone()),
            loader: Some(loader),
            // Small files are loaded by the open itself: the read that follows finds RAM,
            // and no loader thread is woken per file.
            inline_load_bytes_max: dhrd_engine::INLINE_LOAD_BYTES_MAX,
            ..Default::default()
        };
        if let Some(c) = cfg.chunk_bytes {
            base.chunk_bytes = c;
        }
        let sh = Arc::new(Self {
            dir,
            cfg,
            objects: Objects::new(base, object_cache),
            budget: budget.clone(),
            stats: FsStats::default(),
            preload: PreloadState::default(),
            nodes: Mutex::new(NodeTable::new()),
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            passthrough_negotiated: AtomicBool::new(false),
            mmap_on_direct: AtomicBool::new(false),
            killpriv_negotiated: AtomicBool::new(false),
            atomic_o_trunc: AtomicBool::new(false),
            notifier: OnceLock::new(),
            meta_dirty: AtomicBool::new(false),
            final_error: Mutex::new(None),
        });
        // Parked copies of closed files yield to loads: the backing still has them.
        let weak = Arc::downgrade(&sh);
        budget.set_reclaimer(Box::new(move |bytes| {
            weak.upgrade()
                .map_or(0, |sh| sh.objects.reclaim_parked(bytes))
        }));
        Ok(sh)
    }

    fn sync_mode(&self) -> bool {
        self.cfg.durability == Durability::Sync
    }

    /// Makes a metadata change durable per the durability mode (see module header).
    fn meta_durable(&self, fds: &[&dyn AsFd]) -> Result<()> {
        if self.sync_mode() {
            for fd in fds {
                sys::fsync(fd.as_fd())
                    .map_err(|e| FsError::io("fsync after metadata change", e))?;
            }
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.meta_dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Remembers the first unmount-time failure (reported by the daemon's exit status).
    pub fn record_final_error(&self, msg: String) {
        eprintln!("dhrd: {msg}");
        let mut g = self.final_error.lock();
        if g.is_none() {
            *g = Some(msg);
        }
    }

    pub fn final_error(&self) -> Option<String> {
        self.final_error.lock().clone()
    }

    /// syncfs of the backing file system if metadata changed (non-sync modes).
    pub fn sync_metadata(&self) -> Result<()> {
        if self.meta_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = sys::syncfs(self.dir.root_fd()) {
                self.meta_dirty.store(true, Ordering::Release);
                return Err(FsError::io("syncfs of the backing file system", e));
            }
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn new_fh(&self) -> Fh {
        Fh(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    /// Opens node `ino` confined and checks it is still the same backing inode.
    fn node_fd(&self, ino: Ino, flags: OFlags) -> Result<(OwnedFd, libc::stat)> {
        let path = self.nodes.lock().path(ino)?;
        let fd = self
            .dir
            .open_rel(&path, flags)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => FsError::Stale,
                _ => FsError::io("open below the backing directory", e),
            })?;
        let st = sys::fstat(fd.as_fd())?;
        if self.dir.fuse_ino(st.st_ino) != ino.0 || st.st_dev != self.dir.dev() {
            return Err(FsError::Stale);
        }
        Ok((fd, st))
    }

    /// Opens the directory `parent` (readable, so it can be fsync'ed).
    fn dir_fd(&self, parent: Ino) -> Result<OwnedFd> {
        let (fd, st) = self.node_fd(parent, OFlags::RDONLY | OFlags::DIRECTORY)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(FsError::Errno(libc::ENOTDIR));
        }
        Ok(fd)
    }

    fn attr(&self, st: &libc::stat) -> FileAttr {
        let ino = self.dir.fuse_ino(st.st_ino);
        let kind = kind_of(st.st_mode);
        let mut size = st.st_size as u64;
        if kind == FileType::RegularFile {
            // The RAM copy is authoritative for the size (ahead of the backing in the
            // non-sync modes).
            if let Some(o) = self.objects.get(st.st_ino) {
                size = o.len();
            }
        }
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: st.st_blocks as u64,
            atime: systime(st.st_atime, st.st_atime_nsec),
            mtime: systime(st.st_mtime, st.st_mtime_nsec),
            ctime: systime(st.st_ctime, st.st_ctime_nsec),
            crtime: UNIX_EPOCH,
            kind,
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: sys::encode_fuse_rdev(st.st_rdev),
            blksize: STAT_BLKSIZE,
            flags: 0,
        }
    }

    /// Attributes for an entry the kernel will not link: READDIRPLUS's ".", "..", an entry
    /// on another file system, and negative LOOKUP replies; node 0, nothing else is read.
    fn placeholder_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo(0),
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: STAT_BLKSIZE,
            flags: 0,
        }
    }

    /// Stats `parent/name`, records the node and returns its attributes.
    fn lookup_in(&self, parent: Ino, pfd: &OwnedFd, name: &OsStr) -> Result<FileAttr> {
        let st = sys::stat_at(pfd.as_fd(), name)?;
        if st.st_dev != self.dir.dev() {
            // Another file system mounted below the backing directory is not part of it.
            return Err(FsError::Errno(libc::EXDEV));
        }
        let attr = self.attr(&st);
        self.nodes.lock().remember(Ino(attr.ino.0), parent, name);
        Ok(attr)
    }

    /// Opens the backing file of regular-file node `ino` for the engine.
    fn open_backing_file(&self, ino: Ino) -> Result<File> {
        let (fd, st) = self.node_fd(ino, OFlags::RDWR)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::Errno(libc::EINVAL));
        }
        Ok(File::from(fd))
    }

    fn display_name(&self, ino: Ino) -> String {
        match self.nodes.lock().path(ino) {
            Ok(p) => p.display().to_string(),
            Err(_) => format!("inode {}", ino.0),
        }
    }

    /// The object of regular-file node `ino`, created if needed, without counting an open.
    fn object_of(&self, ino: Ino) -> Result<Obj> {
        let key = self.dir.backing_ino(ino.0);
        if let Some(o) = self.objects.get(key) {
            return Ok(o);
        }
        let name = self.display_name(ino);
        self.objects
            .touch(key, &name, || self.open_backing_file(ino))
    }

    /// Stat of node `ino`, falling back to the descriptor of its object when the name is
    /// gone (an unlinked file that is still open).
    fn stat_node(&self, ino: Ino) -> Result<libc::stat> {
        match self.node_fd(ino, OFlags::PATH) {
            Ok((_, st)) => Ok(st),
            Err(FsError::Stale) => {
                let key = self.dir.backing_ino(ino.0);
                match self.objects.get(key) {
                    Some(o) => Ok(sys::fstat(o.backing().file().as_fd())?),
                    None => Err(FsError::Stale),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Gives a newly created inode to the caller (the daemon runs as root), inheriting the
    /// group of a set-group-id parent directory as the kernel would.
    fn chown_new(
        &self,
        req: &Request,
        pfd: &OwnedFd,
        fd: Option<&OwnedFd>,
        name: &OsStr,
    ) -> Result<()> {
        if !rustix::process::geteuid().is_root() {
            return Ok(());
        }
        let pst = sys::fstat(pfd.as_fd())?;
        let gid = if pst.st_mode & libc::S_ISGID != 0 {
            pst.st_gid
        } else {
            req.gid()
        };
        let uid = Some(rustix::fs::Uid::from_raw(req.uid()));
        let gid = Some(rustix::fs::Gid::from_raw(gid));
        match fd {
            Some(fd) => rustix::fs::fchown(fd, uid, gid)?,
            None => rustix::fs::chownat(pfd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?,
        }
        Ok(())
    }

    /// `chown` clears S_ISUID and S_ISGID of a non-directory even when root makes it, so a
    /// node created with set-id bits on the caller's behalf gets them back after
    /// `chown_new`. What the caller may not set the kernel has stripped already
    /// (`vfs_prepare_mode`) before the request reached the daemon.
    fn restore_setid_bits(&self, pfd: &OwnedFd, name: &OsStr, perm: Mode) -> Result<()> {
        if perm.bits() & (libc::S_ISUID | libc::S_ISGID) == 0
            || !rustix::process::geteuid().is_root()
        {
            return Ok(());
        }
        let st = sys::stat_at(pfd.as_fd(), name)?;
        sys::chmod_node(pfd.as_fd(), name, perm, st.st_ino)
    }

    /// A read-only open served from the inode's parked copy (`ParkedReader`), where the
    /// read path would serve it through the daemon anyway: not with `--read-path
    /// passthrough`, nor in auto for a file without write bits (those get passthrough,
    /// which needs the object's memfd).
    fn parked_reader(&self, ino: Ino, key: u64) -> Option<Arc<ParkedReader>> {
        if self.cfg.read_path == ReadPath::Passthrough || !self.objects.parked_only(key) {
            return None;
        }
        let st = self.stat_node(ino).ok()?;
        let passthrough_wanted = self.cfg.read_path == ReadPath::Auto
            && st.st_mode & 0o222 == 0
            && self.passthrough_negotiated.load(Ordering::Acquire);
        if passthrough_wanted || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        self.objects
            .open_parked(key, (st.st_size, st.st_mtime, st.st_mtime_nsec))
    }

    /// The object behind a handle. A parked reader still on its bytes has none: EBADF,
    /// which only operations a read-only open cannot make (write, fallocate, copy into
    /// it, ftruncate) would see; reads, fsync and lseek use `handle_source`.
    fn handle_obj(&self, fh: FileHandle) -> Result<Obj> {
        match self.handle_source(fh)? {
            Source::Object(o) => Ok(o),
            Source::Bytes(_) => Err(FsError::Errno(libc::EBADF)),
        }
    }

    fn handle_source(&self, fh: FileHandle) -> Result<Source> {
        let handles = self.handles.read();
        let h = handles.get(&Fh(fh.0)).ok_or(FsError::Errno(libc::EBADF))?;
        Ok(match &h.data {
            HandleData::Object(o) => Source::Object(o.clone()),
            HandleData::Parked(r) => match r.state() {
                ReaderState::Object(o) => Source::Object(o),
                ReaderState::Bytes(b) => Source::Bytes(b),
            },
        })
    }

    /// Chooses the read path of one open and registers the handle.
    fn open_reply(&self, key: u64, obj: Obj, writable: bool, mode: u32, reply: ReplyOpen) {
        let fh = self.new_fh();
        // auto: only files nobody is meant to write (no write permission bits), because a
        // later writable open of an inode with passthrough opens must be refused (see
        // objects.rs); passthrough: every read-only open of a loaded file.
        let no_write_bits = mode & 0o222 == 0;
        let mut kind = OpenKind::Writer;
        if !writable {
            let pure_ok = self.passthrough_negotiated.load(Ordering::Acquire)
                && match self.cfg.read_path {
                    ReadPath::Auto => no_write_bits && obj.is_fully_loaded(),
                    ReadPath::Passthrough => {
                        obj.is_fully_loaded() || obj.wait_loaded(Some(PASSTHROUGH_LOAD_WAIT))
                    }
                    _ => false,
                };
            let choice = self
                .objects
                .choose_passthrough(key, pure_ok, |o| reply.open_backing(o.ram_fd()));
            kind = OpenKind::PlainReader;
            let picked = match choice {
                Ok(PassthroughChoice::Pure(id)) => {
                    self.stats.opens_passthrough.fetch_add(1, Ordering::Relaxed);
                    Some((FopenFlags::empty(), id))
                }
                Ok(PassthroughChoice::Joined(id)) => {
                    self.stats.opens_direct.fetch_add(1, Ordering::Relaxed);
                    Some((FopenFlags::FOPEN_DIRECT_IO, id))
                }
                Ok(PassthroughChoice::Plain) => None,
                Err(e) => {
                    // Served on the direct path: correct, only slower.
                    eprintln!("dhrd: passthrough registration failed ({e}); using the direct path");
                    None
                }
            };
            if let Some((flags, id)) = picked {
                self.handles.write().insert(
                    fh,
                    Handle {
                        key,
                        data: HandleData::Object(obj),
                        kind: OpenKind::Passthrough,
                    },
                );
                reply.opened_passthrough(FileHandle(fh.0), flags, &id);
                return;
            }
        }
        let flags = self.data_open_flags();
        self.handles.write().insert(
            fh,
            Handle {
                key,
                data: HandleData::Object(obj),
                kind,
            },
        );
        reply.opened(FileHandle(fh.0), flags);
    }

    fn data_open_flags(&self) -> FopenFlags {
        if self.cfg.read_path == ReadPath::Cached {
            self.stats.opens_cached.fetch_add(1, Ordering::Relaxed);
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            self.stats.opens_direct.fetch_add(1, Ordering::Relaxed);
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        }
    }

    fn count_err(&self, e: &FsError) -> Errno {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        errno(e)
    }

    /// Flushes every object and the metadata (unmount, SIGTERM). Returns the first error.
    pub fn flush_all(&self) -> Result<()> {
        let mut first = Ok(());
        for o in self.objects.snapshot() {
            if let Err(e) = o.flush() {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        self.meta_dirty.store(true, Ordering::Release);
        if let Err(e) = self.sync_metadata() {
            if first.is_ok() {
                first = Err(e);
            }
        }
        first
    }

    /// Clears the set-id bits `caller` must drop (killpriv.rs) from the file behind `fd`,
    /// described by `f`, durably per the durability mode. Called before the change
    /// itself, like the VFS does, so that a crash never leaves changed content with the
    /// bits still set. Concurrent callers compute the same mode; a chmod cannot interleave
    /// because the kernel holds the inode lock across both setattr and write.
    fn drop_setid_bits(
        &self,
        fd: BorrowedFd<'_>,
        f: sys::ModeOwner,
        caller: &Caller,
        fsetid: Fsetid,
    ) -> Result<()> {
        let kill = killpriv::bits_to_drop(f.mode, f.gid, caller, fsetid);
        if kill == 0 {
            return Ok(());
        }
        rustix::fs::fchmod(fd, Mode::from_raw_mode(f.mode & 0o7777 & !kill))?;
        self.meta_durable(&[&fd])?;
        // A write or fallocate does not make the kernel forget the cached mode (it
        // invalidates only size and times), so statx(STATX_MODE) would show the bits for
        // up to ATTR_TTL. Offset -1: attributes only, no page cache, no inode lock, so this
        // is safe while the kernel waits for this request. A failure leaves stale
        // attributes, not a wrong file, and is not worth failing the request.
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(self.dir.fuse_ino(f.ino)), -1, 0);
        }
        Ok(())
    }

    // ----- operations, each returning a Result so the handlers stay one-liners -----

    #[allow(clippy::too_many_arguments)] // mirrors the FUSE setattr request
    fn do_setattr(
        &self,
        caller: &Caller,
        ino: Ino,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr> {
        let st = self.stat_node(ino)?;
        let kind = kind_of(st.st_mode);
        if let Some(size) = size {
            if kind != FileType::RegularFile {
                return Err(FsError::Errno(if kind == FileType::Directory {
                    libc::EISDIR
                } else {
                    libc::EINVAL
                }));
            }
            let obj = match fh.map(|f| self.handle_obj(f)) {
                Some(Ok(o)) => o,
                _ => self.object_of(ino)?,
            };
            // With KILLPRIV_V2 the kernel no longer turns a truncate's set-id kill into a
            // mode change (an explicit mode wins, as in the VFS).
            if mode.is_none() {
                let fd = obj.backing().file().as_fd();
                self.drop_setid_bits(fd, (&st).into(), caller, Fsetid::LookUp)?;
            }
            obj.set_len(size)?;
        }
        let changes_inode =
            mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some();
        if changes_inode {
            match kind {
                FileType::RegularFile | FileType::Directory => {
                    let (fd, _) = self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?;
                    if let Some(m) = mode {
                        rustix::fs::fchmod(&fd, Mode::from_raw_mode(m & 0o7777))?;
                    }
                    if uid.is_some() || gid.is_some() {
                        // The backing fchown (by root) drops S_ISUID and S_ISGID with
                        // S_IXGRP itself; what depends on the caller is dropped here.
                        if mode.is_none() {
                            let f = sys::mode_owner(fd.as_fd())?;
                            self.drop_setid_bits(fd.as_fd(), f, caller, Fsetid::LookUp)?;
                        }
                        rustix::fs::fchown(
                            &fd,
                            uid.map(rustix::fs::Uid::from_raw),
                            gid.map(rustix::fs::Gid::from_raw),
                        )?;
                    }
                    if atime.is_some() || mtime.is_some() {
                        let ts = rustix::fs::Timestamps {
                            last_access: timestamp(atime),
                            last_modification: timestamp(mtime),
                        };
                        rustix::fs::futimens(&fd, &ts)?;
                    }
                    self.meta_durable(&[&fd])?;
                }
                _ => {
                    // Symlinks, FIFOs, sockets: act on the name with NOFOLLOW in the parent.
                    let (parent, name) = self.parent_and_name(ino)?;
                    let pfd = self.dir_fd(parent)?;
                    if let Some(m) = mode {
                        let m = Mode::from_raw_mode(m & 0o7777);
                        sys::chmod_node(pfd.as_fd(), &name, m, st.st_ino)?;
                    }
                    if uid.is_some() || gid.is_some() {
                        rustix::fs::chownat(
                            &pfd,
                            &name,
                            uid.map(rustix::fs::Uid::from_raw),
                            gid.map(rustix::fs::Gid::from_raw),
                            AtFlags::SYMLINK_NOFOLLOW,
                        )?;
                    }
                    if atime.is_some() || mtime.is_some() {
                        let ts = rustix::fs::Timestamps {
                            last_access: timestamp(atime),
                            last_modification: timestamp(mtime),
                        };
                        rustix::fs::utimensat(&pfd, &name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
                    }
                    // The inode of a symlink cannot be fsync'ed by descriptor; syncfs covers it.
                    if self.sync_mode() {
                        sys::syncfs(pfd.as_fd()).map_err(|e| FsError::io("syncfs", e))?;
                    }
                }
            }
        }
        let st = self.stat_node(ino)?;
        Ok(self.attr(&st))
    }

    fn parent_and_name(&self, ino: Ino) -> Result<(Ino, OsString)> {
        let nodes = self.nodes.lock();
        let path = nodes.path(ino)?;
        drop(nodes);
        // Rebuild the parent from the path: the node table stores it, but reading it via
        // the path keeps one source of truth.
        let name = path
            .file_name()
            .ok_or(FsError::Errno(libc::EPERM))?
            .to_owned();
        let parent_path = path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
        let fd = self
            .dir
            .open_rel(&parent_path, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|_| FsError::Stale)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok((Ino(self.dir.fuse_ino(st.st_ino)), name))
    }

    fn do_mknod(
        &self,
        req: &Request,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<FileAttr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
        match mode & libc::S_IFMT {
            libc::S_IFREG => {
                let fd = sys::open_confined(
                    pfd.as_fd(),
                    name,
                    OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
                    perm,
                )?;
                self.chown_new(req, &pfd, Some(&fd), name)?;
                self.restore_setid_bits(&pfd, name, perm)?;
                self.meta_durable(&[&fd, &pfd])?;
            }
            libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK => {
                // Device nodes: the kernel lets only callers with CAP_MKNOD (in the initial
                // user namespace) send this request, so making the node in the backing
                // directory is what that caller could do there directly; through the
                // mount, which is nodev, the node opens no device. A daemon without
                // CAP_MKNOD gets EPERM from the backing, which passes through.
                let ft = rustix::fs::FileType::from_raw_mode(mode);
                let dev = if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
                    sys::decode_fuse_rdev(rdev)
                } else {
                    0
                };
                rustix::fs::mknodat(&pfd, name, ft, perm, dev)?;
                self.chown_new(req, &pfd, None, name)?;
                self.restore_setid_bits(&pfd, name, perm)?;
                self.meta_durable(&[&pfd])?;
            }
            _ => return Err(FsError::Errno(libc::EINVAL)),
        }
        self.lookup_in(parent, &pfd, name)
    }

    fn do_mkdir(
        &self,
        req: &Request,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        rustix::fs::mkdirat(&pfd, name, Mode::from_raw_mode(mode & !umask & 0o7777))?;
        let fd = sys::open_confined(
            pfd.as_fd(),
            name,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        self.chown_new(req, &pfd, Some(&fd), name)?;
        self.meta_durable(&[&fd, &pfd])?;
        self.lookup_in(parent, &pfd, name)
    }

    fn do_unlink(&self, parent: Ino, name: &OsStr, dir: bool) -> Result<()> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let st = sys::stat_at(pfd.as_fd(), name)?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&pfd, name, flags)?;
        self.meta_durable(&[&pfd])?;
        let ino = Ino(self.dir.fuse_ino(st.st_ino));
        self.nodes.lock().unlinked(ino, parent, name);
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 {
            self.objects.forget_if_closed(st.st_ino);
        }
        Ok(())
    }

    fn do_symlink(
        &self,
        req: &Request,
        parent: Ino,
        name: &OsStr,
        target: &std::path::Path,
    ) -> Result<FileAttr> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        rustix::fs::symlinkat(target, &pfd, name)?;
        self.chown_new(req, &pfd, None, name)?;
        self.meta_durable(&[&pfd])?;
        self.lookup_in(parent, &pfd, name)
    }

    fn do_rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        sys::check_name(name)?;
        sys::check_name(newname)?;
        let pfd = self.dir_fd(parent)?;
        let npfd = if newparent == parent {
            None
        } else {
            Some(self.dir_fd(newparent)?)
        };
        let nfd = npfd.as_ref().unwrap_or(&pfd);
        let moved = sys::stat_at(pfd.as_fd(), name)?;
        let replaced = sys::stat_at(nfd.as_fd(), newname).ok();
        let rflags = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
        rustix::fs::renameat_with(&pfd, name, nfd, newname, rflags)?;
        match &npfd {
            Some(n) => self.meta_durable(&[n, &pfd])?,
            None => self.meta_durable(&[&pfd])?,
        }
        let moved_ino = Ino(self.dir.fuse_ino(moved.st_ino));
        let mut nodes = self.nodes.lock();
        if let Some(r) = replaced {
            let r_ino = Ino(self.dir.fuse_ino(r.st_ino));
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                nodes.renamed(r_ino, newparent, newname, parent, name);
            } else if r_ino != moved_ino {
                nodes.unlinked(r_ino, newparent, newname);
                drop(nodes);
                if r.st_mode & libc::S_IFMT == libc::S_IFREG && r.st_nlink <= 1 {
                    self.objects.forget_if_closed(r.st_ino);
                }
                nodes = self.nodes.lock();
            }
        }
        if replaced.map(|r| r.st_ino) != Some(moved.st_ino) {
            // (Renaming a name onto another link of the same inode changes nothing.)
            nodes.renamed(moved_ino, parent, name, newparent, newname);
        }
        Ok(())
    }

    fn do_link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> Result<FileAttr> {
        sys::check_name(newname)?;
        let npfd = self.dir_fd(newparent)?;
        let (fd, _) = self.node_fd(ino, OFlags::PATH)?;
        rustix::fs::linkat(&fd, "", &npfd, newname, AtFlags::EMPTY_PATH)?;
        // The link count lives in the inode: syncfs covers it for every file type.
        if self.sync_mode() {
            sys::fsync(npfd.as_fd()).map_err(|e| FsError::io("fsync", e))?;
            sys::syncfs(npfd.as_fd()).map_err(|e| FsError::io("syncfs", e))?;
            self.stats.metadata_syncs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.meta_dirty.store(true, Ordering::Release);
        }
        self.lookup_in(newparent, &npfd, newname)
    }

    fn do_create(
        &self,
        req: &Request,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64, Obj)> {
        sys::check_name(name)?;
        let pfd = self.dir_fd(parent)?;
        let perm = Mode::from_raw_mode(mode & !umask & 0o7777);
        // Exclusive first, so we know whether this call created the file (and must give
        // it to the caller); without O_EXCL an existing file is opened as it is.
        let excl = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR;
        let (fd, created) = match sys::open_confined(pfd.as_fd(), name, excl, perm) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => (
                sys::open_confined(pfd.as_fd(), name, OFlags::RDWR, Mode::empty())?,
                false,
            ),
            Err(e) => return Err(e.into()),
        };
        let st = sys::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let mut looked_up = false;
        let r = (|| {
            if created {
                self.chown_new(req, &pfd, Some(&fd), name)?;
                self.restore_setid_bits(&pfd, name, perm)?;
            }
            self.meta_durable(&[&fd, &pfd])?;
            let attr = self.lookup_in(parent, &pfd, name)?;
            looked_up = true;
            let key = st.st_ino;
            let label = self.display_name(Ino(attr.ino.0));
            let obj = self
                .objects
                .acquire(key, &label, true, || Ok(File::from(fd)))?;
            Ok((attr, key, obj))
        })();
        if r.is_err() && created {
            self.undo_create(parent, &pfd, name, st.st_ino, looked_up);
        }
        r
    }

    /// A create that failed after making its file (ownership, durability, the object)
    /// takes the file away again: a failed operation changes nothing the caller can see.
    /// Only the inode this call made is removed, and only under the name it got. Best
    /// effort: if the removal fails too, an empty file is left, as a crash at that point
    /// would leave it.
    fn undo_create(&self, parent: Ino, pfd: &OwnedFd, name: &OsStr, key: u64, looked_up: bool) {
        let still_ours = sys::stat_at(pfd.as_fd(), name).is_ok_and(|st| st.st_ino == key);
        if still_ours && rustix::fs::unlinkat(pfd, name, AtFlags::empty()).is_ok() {
            let _ = self.meta_durable(&[pfd]);
        }
        let ino = Ino(self.dir.fuse_ino(key));
        let mut nodes = self.nodes.lock();
        nodes.unlinked(ino, parent, name);
        if looked_up {
            // The kernel never got the entry, so it will never forget it.
            nodes.forget(ino, 1);
        }
        drop(nodes);
        self.objects.forget_if_closed(key);
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>> {
        let src = self.handle_source(fh)?;
        let t = Instant::now();
        // Sized to what the file can return: a whole-file read of a small file often asks
        // for far more (1 MiB and up), and zeroing that per request is pure waste.
        let want = (size as u64).min(src.len().saturating_sub(offset));
        let mut buf = vec![0u8; want as usize];
        let (got, served) = src.read_at(&mut buf, offset)?;
        buf.truncate(got);
        let s = &self.stats;
        s.reads.fetch_add(1, Ordering::Relaxed);
        s.read_bytes.fetch_add(got as u64, Ordering::Relaxed);
        match served {
            Served::Ram => s.reads_ram.fetch_add(1, Ordering::Relaxed),
            Served::Backing => s.reads_backing.fetch_add(1, Ordering::Relaxed),
            Served::Mixed => s.reads_mixed.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        s.read_latency.record(t.elapsed());
        Ok(buf)
    }

    /// `kill_suidgid`: the kernel flagged the write (`FUSE_WRITE_KILL_SUIDGID`), i.e. the
    /// writer lacks CAP_FSETID; it is set on most writes of non-root processes, so the
    /// check costs one statx (without timestamps, see `sys::mode_owner`) and nothing more
    /// unless the file has a set-id bit.
    fn do_write(
        &self,
        caller: &Caller,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<u32> {
        let obj = self.handle_obj(fh)?;
        let t = Instant::now();
        if kill_suidgid {
            let fd = obj.backing().file().as_fd();
            self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::Lacks)?;
        }
        obj.write_at(data, offset)?;
        let s = &self.stats;
        s.writes.fetch_add(1, Ordering::Relaxed);
        s.write_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        s.write_latency.record(t.elapsed());
        Ok(data.len() as u32)
    }

    fn do_fsync(&self, fh: FileHandle) -> Result<()> {
        let t = Instant::now();
        // A parked reader has written nothing; metadata below is synced either way.
        if let Source::Object(obj) = self.handle_source(fh)? {
            obj.flush()?;
        }
        if !self.sync_mode() {
            // Attribute changes of this file and the entry that names it.
            self.meta_dirty.store(true, Ordering::Release);
            self.sync_metadata()?;
        }
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_latency.record(t.elapsed());
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE (the kernel answers the other whences itself). Every write
    /// and hole punch reaches the backing file before it is acknowledged, in every
    /// durability mode, so the backing's extent map is the file's; asking it keeps sparse
    /// files sparse through `cp --sparse`, `tar -S` and the like.
    fn do_lseek(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let obj = match self.handle_source(fh)? {
            Source::Object(o) => o,
            // A parked copy has no holes: data up to the length.
            Source::Bytes(b) => {
                let len = b.len() as i64;
                return match whence {
                    _ if offset < 0 || offset >= len => Err(FsError::Errno(libc::ENXIO)),
                    libc::SEEK_DATA => Ok(offset),
                    _ => Ok(len),
                };
            }
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(obj.backing().file());
        // SAFETY: lseek on a descriptor the object keeps open for as long as `obj` lives;
        // the backing is only ever accessed with positioned I/O, so moving its offset is
        // harmless.
        let r = unsafe { libc::lseek(fd, offset, whence) };
        if r < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(r)
    }

    fn do_opendir(&self, ino: Ino) -> Result<Fh> {
        let (fd, st) = self.node_fd(ino, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let fh = self.new_fh();
        self.dirs.lock().insert(
            fh,
            DirHandle {
                entries: Vec::new(),
                unread: Some((fd, st.st_ino)),
            },
        );
        Ok(fh)
    }

    /// Reads the directory of handle `fh` on its first READDIR (see `DirHandle::unread`);
    /// the entries then stay fixed for the handle, so offsets are stable.
    fn dir_entries_ready(&self, ino: Ino, fh: Fh) -> Result<()> {
        let unread = match self.dirs.lock().get_mut(&fh) {
            Some(d) => d.unread.take(),
            None => return Err(FsError::Errno(libc::EBADF)),
        };
        let Some((fd, self_ino)) = unread else {
            return Ok(());
        };
        let entries = self.read_dir_entries(ino, &fd, self_ino);
        let mut dirs = self.dirs.lock();
        let Some(d) = dirs.get_mut(&fh) else {
            return Err(FsError::Errno(libc::EBADF));
        };
        match entries {
            Ok(e) => {
                d.entries = e;
                Ok(())
            }
            Err(e) => {
                d.unread = Some((fd, self_ino));
                Err(e)
            }
        }
    }

    fn read_dir_entries(
        &self,
        ino: Ino,
        fd: &OwnedFd,
        self_ino: u64,
    ) -> Result<Vec<(u64, FileType, OsString)>> {
        let parent_ino = if ino.0 == FUSE_ROOT_INO {
            FUSE_ROOT_INO
        } else {
            match sys::stat_at(fd.as_fd(), OsStr::new("..")) {
                Ok(p) => self.dir.fuse_ino(p.st_ino),
                Err(_) => FUSE_ROOT_INO,
            }
        };
        let mut entries = vec![
            (
                self.dir.fuse_ino(self_ino),
                FileType::Directory,
                OsString::from("."),
            ),
            (parent_ino, FileType::Directory, OsString::from("..")),
        ];
        let mut d = rustix::fs::Dir::read_from(fd)?;
        while let Some(ent) = d.read() {
            let ent = ent?;
            let name = OsStr::from_bytes(ent.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            entries.push((
                self.dir.fuse_ino(ent.ino()),
                kind_of_dirent(ent.file_type()),
                name.to_owned(),
            ));
        }
        Ok(entries)
    }

    #[allow(clippy::type_complexity)] // the argument list of ReplyStatfs::statfs
    fn do_statfs(&self) -> Result<(u64, u64, u64, u64, u64, u32, u32, u32)> {
        let s = rustix::fs::fstatvfs(self.dir.root_fd())?;
        Ok((
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        ))
    }

    /// Descriptor for xattr calls: only regular files and directories carry user xattrs
    /// reachable without following a link.
    fn xattr_fd(&self, ino: Ino) -> Result<Option<OwnedFd>> {
        let st = self.stat_node(ino)?;
        match kind_of(st.st_mode) {
            FileType::RegularFile | FileType::Directory => Ok(Some(
                self.node_fd(ino, OFlags::RDONLY | OFlags::NONBLOCK)?.0,
            )),
            _ => Ok(None),
        }
    }

    fn do_getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        if size == 0 {
            let n = rustix::fs::fgetxattr_query(&fd, name)?;
            return Ok(vec![0u8; n]);
        }
        let mut buf = vec![0u8; size as usize];
        let n = rustix::fs::fgetxattr(&fd, name, &mut buf[..])?;
        buf.truncate(n);
        Ok(buf)
    }

    fn do_listxattr(&self, ino: Ino, size: u32) -> Result<Vec<u8>> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Ok(Vec::new());
        };
        if size == 0 {
            let n = rustix::fs::flistxattr_query(&fd)?;
            return Ok(vec![0u8; n]);
        }
        let mut buf = vec![0u8; size as usize];
        let n = rustix::fs::flistxattr(&fd, &mut buf[..])?;
        buf.truncate(n);
        Ok(buf)
    }

    fn do_setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::EPERM));
        };
        let f = rustix::fs::XattrFlags::from_bits_retain(flags as _);
        rustix::fs::fsetxattr(&fd, name, value, f)?;
        self.meta_durable(&[&fd])
    }

    fn do_removexattr(&self, ino: Ino, name: &OsStr) -> Result<()> {
        let Some(fd) = self.xattr_fd(ino)? else {
            return Err(FsError::Errno(libc::ENODATA));
        };
        rustix::fs::fremovexattr(&fd, name)?;
        self.meta_durable(&[&fd])
    }

    fn do_fallocate(
        &self,
        caller: &Caller,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let obj = self.handle_obj(fh)?;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let end = offset
            .checked_add(length)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        let rest = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let supported = rest == 0
            || (rest == libc::FALLOC_FL_PUNCH_HOLE && keep)
            || rest == libc::FALLOC_FL_ZERO_RANGE;
        if !supported {
            return Err(FsError::Errno(libc::EOPNOTSUPP));
        }
        // The kernel's file_modified() before FALLOCATE sends no set-id kill to a
        // KILLPRIV_V2 server, and the request carries no flag: decide here.
        let fd = obj.backing().file().as_fd();
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        if rest == 0 {
            // Allocation: the RAM tier holds the data; only the size matters to readers.
            if !keep && end > obj.len() {
                obj.set_len(end)?;
            }
            return Ok(());
        }
        if rest == libc::FALLOC_FL_PUNCH_HOLE {
            let stop = end.min(obj.len());
            if stop > offset {
                obj.zero_range(offset, stop - offset)?;
            }
            return Ok(());
        }
        // FALLOC_FL_ZERO_RANGE
        let len = obj.len();
        let stop = end.min(len);
        if stop > offset {
            obj.zero_range(offset, stop - offset)?;
        }
        if !keep && end > len {
            obj.set_len(end)?;
        }
        Ok(())
    }

    /// COPY_FILE_RANGE inside the mount: the source bytes come from its RAM tier (or its
    /// backing where not loaded) and go through the destination's ordinary write path in
    /// steps of `COPY_STEP_BYTES`, so every durability mode keeps its meaning (in `sync`
    /// mode each step is durable before the next starts; a crash leaves a copied prefix,
    /// like a crash during `cp`). The kernel has already refused overlapping ranges of one
    /// file and copies between mounts. Stops at the source's end; a failure after some
    /// bytes were copied returns the short count, as write(2) does, and the caller's next
    /// call meets the error.
    #[allow(clippy::too_many_arguments)] // mirrors the FUSE copy_file_range request
    fn do_copy_file_range(
        &self,
        caller: &Caller,
        fh_in: FileHandle,
        offset_in: u64,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<u32> {
        if flags != 0 {
            return Err(FsError::Errno(libc::EINVAL));
        }
        let src = self.handle_source(fh_in)?;
        let dst = self.handle_obj(fh_out)?;
        let want = len
            .min(COPY_REQUEST_BYTES_MAX)
            .min(src.len().saturating_sub(offset_in));
        if want == 0 {
            return Ok(0);
        }
        offset_out
            .checked_add(want)
            .filter(|end| *end <= i64::MAX as u64)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        // Like fallocate: the kernel's file_modified() sends a KILLPRIV_V2 server no
        // set-id kill for this request, so the daemon decides.
        let fd = dst.backing().file().as_fd();
        self.drop_setid_bits(fd, sys::mode_owner(fd)?, caller, Fsetid::LookUp)?;
        let mut buf = vec![0u8; want.min(COPY_STEP_BYTES) as usize];
        let mut done = 0u64;
        while done < want {
            let n = (want - done).min(buf.len() as u64) as usize;
            let step = src
                .read_at(&mut buf[..n], offset_in + done)
                .and_then(|(got, _)| {
                    dst.write_at(&buf[..got], offset_out + done)
                        .map(|()| got)
                        .map_err(FsError::from)
                });
            match step {
                Ok(0) => break,
                Ok(got) => {
                    done += got as u64;
                    if got < n {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        let s = &self.stats;
        s.copies.fetch_add(1, Ordering::Relaxed);
        s.copy_bytes.fetch_add(done, Ordering::Relaxed);
        Ok(done as u32)
    }
}

/// The `fuser::Filesystem` adapter; all state lives in [`Shared`].
pub struct DhrdFs {
    pub sh: Arc<Shared>,
}

impl DhrdFs {
    /// Replies to a request that creates a directory entry (mknod, mkdir, symlink, link).
    fn reply_new_entry(&self, r: Result<FileAttr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&ATTR_TTL, &a, Generation(0)),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }
}

impl Filesystem for DhrdFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        if caps.contains(InitFlags::FUSE_PARALLEL_DIROPS) {
            let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        }
        // A symlink's target never changes (a new target is a new inode), so the kernel
        // may keep it: following a symlink again costs no READLINK round trip.
        if caps.contains(InitFlags::FUSE_CACHE_SYMLINKS) {
            let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        }
        if caps.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok()
        {
            self.sh.mmap_on_direct.store(true, Ordering::Release);
        }
        let want_pt = matches!(
            self.sh.cfg.read_path,
            ReadPath::Auto | ReadPath::Passthrough
        );
        if want_pt
            && caps.contains(InitFlags::FUSE_PASSTHROUGH)
            && config.set_max_stack_depth(PASSTHROUGH_STACK_DEPTH).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            self.sh
                .passthrough_negotiated
                .store(true, Ordering::Release);
        }
        // Listing a directory then stat'ing its entries (ls -l, find, rsync, du) costs one
        // LOOKUP round trip per entry; READDIRPLUS returns the attributes with the names.
        let plus = match self.sh.cfg.readdirplus {
            ReaddirPlus::Auto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            ReaddirPlus::Always => InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Off => InitFlags::empty(),
        };
        if !plus.is_empty() && caps.contains(plus) {
            let _ = config.add_capabilities(plus);
        }
        // The daemon drops set-id bits itself (killpriv.rs). In return the kernel sets
        // SB_NOSEC, so cached writes stop asking for security.capability (one GETXATTR
        // round trip per write before).
        if caps.contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            && config
                .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
                .is_ok()
        {
            self.sh.killpriv_negotiated.store(true, Ordering::Release);
        }
        // open(O_TRUNC) of an existing file (shell `>`, editors, log rotation) is then one
        // OPEN instead of an OPEN and a SETATTR round trip.
        if caps.contains(InitFlags::FUSE_ATOMIC_O_TRUNC)
            && config
                .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
                .is_ok()
        {
            self.sh.atomic_o_trunc.store(true, Ordering::Release);
        }
        if let Err(max) = config.set_max_write(MAX_WRITE_BYTES) {
            let _ = config.set_max_write(max);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.sh.shutdown.store(true, Ordering::Release);
        if let Err(e) = self.sh.objects.close_everything() {
            self.sh
                .record_final_error(format!("flushing file data at unmount failed: {e}"));
        }
        if let Err(e) = self.sh.flush_all() {
            self.sh
                .record_final_error(format!("syncing metadata at unmount failed: {e}"));
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.sh.stats.lookups.fetch_add(1, Ordering::Relaxed);
        let r = sys::check_name(name)
            .and_then(|_| self.sh.dir_fd(Ino(parent.0)))
            .and_then(|pfd| self.sh.lookup_in(Ino(parent.0), &pfd, name));
        match r {
            Ok(attr) => reply.entry(&ATTR_TTL, &attr, Generation(0)),
            // A negative entry (node 0) that the kernel may keep as long as a positive one:
            // names appear only through this daemon (create, mkdir, link, rename...), and
            // the kernel replaces the negative dentry itself when they do. Saves a round
            // trip for every repeated probe of a missing name (PATH and include-path
            // searches, Python imports, build tools checking outputs).
            Err(e) if errno(&e) == Errno::ENOENT => {
                reply.entry(&ATTR_TTL, &self.sh.placeholder_attr(), Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.sh.nodes.lock().forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = match fh.and_then(|f| self.sh.handle_obj(f).ok()) {
            Some(o) => sys::fstat(o.backing().file().as_fd()).map_err(FsError::from),
            None => self.sh.stat_node(Ino(ino.0)),
        };
        match r {
            Ok(st) => reply.attr(&ATTR_TTL, &self.sh.attr(&st)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.sh.stats.setattrs.fetch_add(1, Ordering::Relaxed);
        match self.sh.do_setattr(
            &Caller::of(req),
            Ino(ino.0),
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        ) {
            Ok(a) => reply.attr(&ATTR_TTL, &a),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.sh.stats.readlinks.fetch_add(1, Ordering::Relaxed);
        let r = self
            .sh
            .node_fd(Ino(ino.0), OFlags::PATH)
            .and_then(|(fd, _)| Ok(rustix::fs::readlinkat(&fd, "", Vec::new())?));
        match r {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.reply_new_entry(
            self.sh
                .do_mknod(req, Ino(parent.0), name, mode, umask, rdev),
            reply,
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.reply_new_entry(
            self.sh.do_mkdir(req, Ino(parent.0), name, mode, umask),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.sh.do_unlink(Ino(parent.0), name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.sh.do_unlink(Ino(parent.0), name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.reply_new_entry(
            self.sh.do_symlink(req, Ino(parent.0), link_name, target),
            reply,
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .sh
            .do_rename(Ino(parent.0), name, Ino(newparent.0), newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_new_entry(
            self.sh.do_link(Ino(ino.0), Ino(newparent.0), newname),
            reply,
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let sh = &self.sh;
        let ino = Ino(ino.0);
        let key = sh.dir.backing_ino(ino.0);
        let name = sh.display_name(ino);
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        // The kernel has checked write permission for O_TRUNC, whatever the access mode,
        // and passes it only once FUSE_ATOMIC_O_TRUNC is negotiated.
        let truncate = flags.0 & libc::O_TRUNC != 0;
        if !writable && !truncate {
            if let Some(r) = sh.parked_reader(ino, key) {
                let fh = sh.new_fh();
                let flags = sh.data_open_flags();
                sh.stats.opens_parked.fetch_add(1, Ordering::Relaxed);
                sh.handles.write().insert(
                    fh,
                    Handle {
                        key,
                        data: HandleData::Parked(r),
                        kind: OpenKind::PlainReader,
                    },
                );
                reply.opened(FileHandle(fh.0), flags);
                return;
            }
        }
        let mut mode = 0u32;
        let r = sh.objects.acquire(key, &name, writable, || {
            let f = sh.open_backing_file(ino)?;
            Ok(f)
        });
        // What the SETATTR of a non-atomic open(O_TRUNC) would do: size 0, mtime and ctime
        // now (even when the file was empty already), set-id bits dropped, durable in sync
        // mode; after the ETXTBSY check, so a refused open changes nothing.
        let r = r.and_then(|obj| {
            if truncate {
                let caller = Caller::of(req);
                let done = sh.do_setattr(
                    &caller,
                    ino,
                    None,
                    None,
                    None,
                    Some(0),
                    None,
                    Some(TimeOrNow::Now),
                    None,
                );
                if let Err(e) = done {
                    drop(obj);
                    let kind = if writable {
                        OpenKind::Writer
                    } else {
                        OpenKind::Undecided
                    };
                    sh.objects.release(key, kind);
                    return Err(e);
                }
                sh.stats.open_truncates.fetch_add(1, Ordering::Relaxed);
            }
            Ok(obj)
        });
        match r {
            Ok(obj) => {
                if let Ok(st) = sys::fstat(obj.backing().file().as_fd()) {
                    mode = st.st_mode;
                }
                sh.open_reply(key, obj, writable, mode, reply);
            }
            Err(e) => reply.error(sh.count_err(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.sh.do_read(fh, offset, size) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.sh.do_write(&Caller::of(req), fh, offset, data, kill) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) does not promise durability (fsync does, and sync mode already has it)
        // and no POSIX locks are held here, so there is nothing to do. ENOSYS makes the
        // kernel stop sending FLUSH (fc->no_flush) and report success to close: one daemon
        // round trip less per close, which small-file workloads feel.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self.sh.handles.write().remove(&Fh(fh.0));
        if let Some(h) = h {
            match h.data {
                HandleData::Object(obj) => {
                    drop(obj);
                    self.sh.objects.release(h.key, h.kind);
                }
                HandleData::Parked(r) => self.sh.objects.release_parked(&r),
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.sh.do_fsync(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.sh.do_opendir(Ino(ino.0)) {
            // The kernel may keep the listing in the directory's page cache across opens:
            // it drops it itself when a create, unlink, rename... through the mount changes
            // the directory (or its mtime changes), and nothing else changes it (see the
            // rule on changes behind the daemon's back). Repeated listings then cost no
            // READDIR round trip (`ls`, find, git status walking a tree again).
            Ok(fh) => reply.opened(
                FileHandle(fh.0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if let Err(e) = self.sh.dir_entries_ready(Ino(ino.0), Fh(fh.0)) {
            reply.error(errno(&e));
            return;
        }
        let dirs = self.sh.dirs.lock();
        let Some(d) = dirs.get(&Fh(fh.0)) else {
            reply.error(Errno::EBADF);
            return;
        };
        for (i, (ino, kind, name)) in d.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        drop(dirs);
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if let Err(e) = self.sh.dir_entries_ready(Ino(ino.0), Fh(fh.0)) {
            reply.error(errno(&e));
            return;
        }
        // Copy one batch out so the directory lock is not held while stat'ing entries.
        let batch: Vec<(u64, FileType, OsString)> = {
            let dirs = self.sh.dirs.lock();
            let Some(d) = dirs.get(&Fh(fh.0)) else {
                reply.error(Errno::EBADF);
                return;
            };
            d.entries
                .iter()
                .skip(offset as usize)
                .take(READDIRPLUS_BATCH_MAX)
                .cloned()
                .collect()
        };
        let pfd = match self.sh.dir_fd(Ino(ino.0)) {
            Ok(fd) => fd,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        for (i, (eino, kind, name)) in batch.iter().enumerate() {
            let next = offset + i as u64 + 1;
            if name == "." || name == ".." {
                // The kernel links neither and counts no lookup for them.
                let attr = FileAttr {
                    ino: INodeNo(*eino),
                    kind: *kind,
                    ..self.sh.placeholder_attr()
                };
                if reply.add(INodeNo(*eino), next, name, &ATTR_TTL, &attr, Generation(0)) {
                    break;
                }
                continue;
            }
            // Gone since opendir: left out, as a later readdir would. On another file
            // system (not part of the tree; LOOKUP says EXDEV): inode 0, which the kernel
            // does not link and readdir(3) skips.
            let Ok(st) = sys::stat_at(pfd.as_fd(), name) else {
                continue;
            };
            let attr = if st.st_dev == self.sh.dir.dev() {
                self.sh.attr(&st)
            } else {
                FileAttr {
                    ino: INodeNo(0),
                    kind: *kind,
                    ..self.sh.placeholder_attr()
                }
            };
            if reply.add(attr.ino, next, name, &ATTR_TTL, &attr, Generation(0)) {
                break;
            }
            if attr.ino.0 != 0 {
                // Counted only once the entry is in the reply: the kernel takes one lookup
                // reference per entry it receives.
                self.sh
                    .nodes
                    .lock()
                    .remember(Ino(attr.ino.0), Ino(ino.0), name);
                self.sh
                    .stats
                    .readdirplus_entries
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.sh.do_lseek(fh, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.sh.dirs.lock().remove(&Fh(fh.0));
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self
            .sh
            .node_fd(Ino(ino.0), OFlags::RDONLY | OFlags::DIRECTORY)
            .and_then(|(fd, _)| sys::fsync(fd.as_fd()).map_err(FsError::from))
            .and_then(|_| {
                if self.sh.sync_mode() {
                    Ok(())
                } else {
                    self.sh.meta_dirty.store(true, Ordering::Release);
                    self.sh.sync_metadata()
                }
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.sh.do_statfs() {
            Ok((b, bf, ba, f, ff, bs, nl, fr)) => reply.statfs(b, bf, ba, f, ff, bs, nl, fr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.sh.do_setxattr(Ino(ino.0), name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.sh.do_getxattr(Ino(ino.0), name, size) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.sh.do_listxattr(Ino(ino.0), size) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.sh.do_removexattr(Ino(ino.0), name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel has already checked the mode bits.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let sh = &self.sh;
        match sh.do_create(req, Ino(parent.0), name, mode, umask, flags) {
            Ok((attr, key, obj)) => {
                let fh = sh.new_fh();
                let fl = sh.data_open_flags();
                sh.handles.write().insert(
                    fh,
                    Handle {
                        key,
                        data: HandleData::Object(obj),
                        kind: OpenKind::Writer,
                    },
                );
                reply.created(&ATTR_TTL, &attr, Generation(0), FileHandle(fh.0), fl);
            }
            Err(e) => reply.error(sh.count_err(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self
            .sh
            .do_fallocate(&Caller::of(req), fh, offset, length, mode)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.sh.do_copy_file_range(
            &Caller::of(req),
            fh_in,
            offset_in,
            fh_out,
            offset_out,
            len,
            flags.bits(),
        ) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.sh.count_err(&e)),
        }
    }
}
