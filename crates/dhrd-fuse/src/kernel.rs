//! What the mount's core hears from the kernel and answers it, in types of its own: node
//! ids, file handles, attributes, entries, open replies, backing ids, the callers'
//! credentials stay in `killpriv`. The transport that carries requests (the fuser adapter
//! over /dev/fuse today) turns its own types into these and back, so that the core never
//! names a transport's type and another transport can be put beneath the same core.
//!
//! Invariants: every value here is what the FUSE protocol means by it (node 1 is the root,
//! reply flags are the protocol's FOPEN_* bits, rdev is the kernel's `new_encode_dev`
//! form); a transport converts without deciding anything.
//!
//! No state and no crash semantics.

use std::any::Any;
use std::ffi::OsString;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::SystemTime;

/// A FUSE node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

/// A FUSE file handle (of an open file, or of an open directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fh(pub u64);

/// The kind of a node, as entries and attributes carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Directory,
    Symlink,
    NamedPipe,
    Socket,
    CharDevice,
    BlockDevice,
    RegularFile,
}

impl FileKind {
    /// From `st_mode`.
    pub fn of_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::NamedPipe,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => FileKind::RegularFile,
        }
    }

    /// From a directory entry's type.
    pub fn of_dirent(t: rustix::fs::FileType) -> Self {
        use rustix::fs::FileType as T;
        match t {
            T::Directory => FileKind::Directory,
            T::Symlink => FileKind::Symlink,
            T::Fifo => FileKind::NamedPipe,
            T::Socket => FileKind::Socket,
            T::CharacterDevice => FileKind::CharDevice,
            T::BlockDevice => FileKind::BlockDevice,
            _ => FileKind::RegularFile,
        }
    }
}

/// Attributes of a node as the kernel is told them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Node id; 0 for an entry the kernel must not link (see `Attr::placeholder`).
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    /// Permission bits, with the set-id and sticky bits.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number of a device node, in the kernel's `new_encode_dev` form.
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// Attributes for an entry the kernel will not link: READDIRPLUS's ".", "..", an entry
    /// on another file system, and negative LOOKUP replies; node 0, nothing else is read.
    pub fn placeholder(blksize: u32) -> Self {
        Attr {
            ino: 0,
            size: 0,
            blocks: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            kind: FileKind::RegularFile,
            perm: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize,
        }
    }
}

/// A directory entry for the kernel: the node's attributes and its generation
/// (`NodeTable::generation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub attr: Attr,
    pub generation: u64,
}

/// One name of a directory listing: node id, kind, name.
pub type DirEntry = (u64, FileKind, OsString);

/// A time a SETATTR asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// The daemon's clock at the change (UTIME_NOW).
    Now,
    At(SystemTime),
}

/// What a SETATTR changes; `None` leaves that attribute alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// The open file the request came through, if any (ftruncate, futimens).
    pub fh: Option<Fh>,
}

/// Flags of an open or create reply: the protocol's FOPEN_* bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplyFlags(u32);

impl ReplyFlags {
    /// Reads and writes go to the daemon, never through the mount's page cache.
    pub const DIRECT_IO: ReplyFlags = ReplyFlags(1 << 0);
    /// The mount's page cache of the file stays valid across opens.
    pub const KEEP_CACHE: ReplyFlags = ReplyFlags(1 << 1);
    /// The kernel may keep a directory's listing in its cache.
    pub const CACHE_DIR: ReplyFlags = ReplyFlags(1 << 3);
    /// Direct writes of one file may run in parallel.
    pub const PARALLEL_DIRECT_WRITES: ReplyFlags = ReplyFlags(1 << 6);

    pub const fn empty() -> Self {
        ReplyFlags(0)
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    pub const fn union(self, other: ReplyFlags) -> Self {
        ReplyFlags(self.0 | other.0)
    }

    pub const fn contains(self, other: ReplyFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for ReplyFlags {
    type Output = ReplyFlags;
    fn bitor(self, rhs: ReplyFlags) -> ReplyFlags {
        self.union(rhs)
    }
}

/// A file registered with the kernel for passthrough, made by the transport
/// (`Register`); the registration is closed when the last holder drops it. The core only
/// keeps it and hands it back in replies: what is inside is the transport's own.
pub struct BackingId(Box<dyn Any + Send + Sync>);

impl BackingId {
    pub fn new<T: Any + Send + Sync>(token: T) -> Self {
        BackingId(Box::new(token))
    }

    /// The transport's token, if it is of type `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

/// Registers a descriptor with the kernel for passthrough (one registration per call).
pub type Register<'a> = &'a dyn Fn(BorrowedFd<'_>) -> io::Result<BackingId>;

/// What the reply to an open or create carries. `B`: the backing id's type (tests of a
/// data path use plain numbers).
pub enum OpenReply<B = BackingId> {
    Plain(ReplyFlags),
    Passthrough(ReplyFlags, Arc<B>),
}

/// Notices the core sends the kernel outside a reply.
pub trait Invalidate: Send + Sync {
    /// The kernel's cached attributes of node `ino` are stale (its data cache is not).
    fn inode_attrs(&self, ino: u64);
}

/// What the kernel's INIT and the transport agreed on, once, before any other request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// FUSE_PASSTHROUGH: opens may carry a backing id.
    pub passthrough: bool,
    /// FUSE_DIRECT_IO_ALLOW_MMAP: opens with DIRECT_IO may be mapped.
    pub mmap_on_direct: bool,
    /// FUSE_HANDLE_KILLPRIV_V2: the daemon drops set-id bits (killpriv.rs).
    pub killpriv_v2: bool,
    /// FUSE_ATOMIC_O_TRUNC: OPEN carries O_TRUNC and the daemon truncates.
    pub atomic_o_trunc: bool,
}

/// What a change of file data asks of its own durability, beyond the mount's mode: the
/// open's O_DSYNC or O_SYNC, or RWF_DSYNC / RWF_SYNC of one write (the kernel adds those
/// to the write request's flags, `fuse_write_flags`). Opens the kernel serves itself
/// (passthrough, or a page cache write followed by its own FSYNC) never need it; opens
/// with FOPEN_DIRECT_IO leave the sync to the daemon (`fuse_direct_write_iter` calls no
/// `generic_write_sync`), and so do fallocate, copy_file_range and truncate through any
/// open, which always reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteSync {
    /// Durable per the mount's mode (at once in `sync` mode, else at a later fsync).
    Mode,
    /// O_DSYNC: the data, and the metadata needed to read it back, durable on return.
    Data,
    /// O_SYNC: the data and all of the inode's metadata durable on return.
    File,
}

impl WriteSync {
    /// From open(2) flags, or a write request's flags.
    pub fn of_flags(flags: i32) -> Self {
        // O_SYNC is __O_SYNC | O_DSYNC.
        if flags & libc::O_SYNC == libc::O_SYNC {
            WriteSync::File
        } else if flags & libc::O_DSYNC != 0 {
            WriteSync::Data
        } else {
            WriteSync::Mode
        }
    }
}

/// The answer to STATFS, from the backing file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub block_bytes: u32,
    pub name_bytes_max: u32,
    pub fragment_bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::WriteSync;

    #[test]
    fn write_sync_follows_o_sync_and_o_dsync() {
        assert_eq!(WriteSync::of_flags(libc::O_RDWR), WriteSync::Mode);
        assert_eq!(
            WriteSync::of_flags(libc::O_WRONLY | libc::O_DSYNC),
            WriteSync::Data
        );
        assert_eq!(
            WriteSync::of_flags(libc::O_RDWR | libc::O_SYNC),
            WriteSync::File
        );
        assert_eq!(
            WriteSync::of_flags(libc::O_DIRECT | libc::O_DSYNC),
            WriteSync::Data
        );
        assert!(WriteSync::File > WriteSync::Data && WriteSync::Data > WriteSync::Mode);
    }
}
