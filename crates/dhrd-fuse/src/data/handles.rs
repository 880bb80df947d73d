//! The table of open files: what each handle the kernel holds stands for.
//!
//! Invariants:
//! - A handle holds what its requests need (the backing file, or the engine object), so a
//!   request copies it out and never holds the table's lock across I/O.
//! - Handle numbers are never reused while the mount lives.
//!
//! No disk state and no crash semantics.

use crate::engine::objects::{Obj, OpenKind};
use crate::error::{FsError, Result};
use crate::kernel::{Fh, WriteSync};
use crate::page::PageOpen;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a handle's requests use, on the data path of the mount.
#[derive(Clone)]
pub enum HandleData {
    Page(PageOpen),
    Engine { obj: Obj, kind: OpenKind },
}

impl HandleData {
    /// The backing file's descriptor behind the handle.
    pub fn backing_fd(&self) -> BorrowedFd<'_> {
        match self {
            HandleData::Page(o) => o.file.as_fd(),
            HandleData::Engine { obj, .. } => obj.backing().file().as_fd(),
        }
    }
}

/// One open file.
struct Handle {
    /// The backing inode number.
    key: u64,
    data: HandleData,
    /// What the open's flags (O_DSYNC, O_SYNC) ask of every change made through it.
    sync: WriteSync,
}

/// Open files by handle.
pub struct Handles {
    map: RwLock<HashMap<Fh, Handle>>,
    next: AtomicU64,
}

impl Default for Handles {
    fn default() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl Handles {
    /// The backing inode, data and write durability of handle `fh`.
    pub fn get(&self, fh: Fh) -> Result<(u64, HandleData, WriteSync)> {
        let map = self.map.read();
        let h = map.get(&fh).ok_or(FsError::Errno(libc::EBADF))?;
        Ok((h.key, h.data.clone(), h.sync))
    }

    /// A new handle for an open of backing inode `key` with open(2) flags `open_flags`.
    pub fn insert(&self, key: u64, data: HandleData, open_flags: i32) -> Fh {
        let fh = Fh(self.next.fetch_add(1, Ordering::Relaxed));
        let sync = WriteSync::of_flags(open_flags);
        let old = self.map.write().insert(fh, Handle { key, data, sync });
        assert!(old.is_none(), "handle {fh:?} given out twice");
        fh
    }

    /// Takes handle `fh` out of the table (RELEASE).
    pub fn remove(&self, fh: Fh) -> Option<(u64, HandleData)> {
        self.map.write().remove(&fh).map(|h| (h.key, h.data))
    }
}
