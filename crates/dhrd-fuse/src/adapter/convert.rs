//! Conversions between fuser's types and the core's (`kernel.rs`): the adapter decides
//! nothing, it only translates.
//!
//! No state and no crash semantics.

use crate::error::FsError;
use crate::kernel::{Attr, BackingId, Entry, FileKind, Invalidate, ReplyFlags, SetTime};
use crate::killpriv::Caller;
use fuser::{Errno, FileAttr, FileType, FopenFlags, Generation, INodeNo, Request, TimeOrNow};

/// The caller's credentials as the core takes them.
pub fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

pub fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

pub fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::NamedPipe => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::RegularFile => FileType::RegularFile,
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: std::time::UNIX_EPOCH,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// An entry's attributes and generation as fuser's replies take them.
pub fn entry(e: &Entry) -> (FileAttr, Generation) {
    (file_attr(&e.attr), Generation(e.generation))
}

pub fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(at),
    })
}

pub fn fopen(f: ReplyFlags) -> FopenFlags {
    FopenFlags::from_bits_retain(f.bits())
}

/// The fuser token inside a backing id this adapter made (`open_backing` of a reply).
pub fn fuser_backing(id: &BackingId) -> &fuser::BackingId {
    #[allow(clippy::expect_used)] // only this adapter makes backing ids for its session
    id.get::<fuser::BackingId>()
        .expect("a backing id made by another transport")
}

/// The core's notices to the kernel, sent through the session's notifier.
pub struct Notices(pub fuser::Notifier);

impl Invalidate for Notices {
    fn inode_attrs(&self, ino: u64) {
        // Offset -1: attributes only, no page cache, no inode lock. A failure leaves
        // stale attributes, not a wrong file.
        let _ = self.0.inval_inode(INodeNo(ino), -1, 0);
    }
}
