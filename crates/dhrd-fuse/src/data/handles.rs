//! The table of open files: what each handle the kernel holds stands for.
//!
//! Invariants:
//! - A handle holds what its requests need (the backing file, or the engine object), so a
//!   request copies it out and never holds the table's lock across I/O.
//! - Handle numbers are never reused while the mount lives.
//! - `executing` counts, per backing inode, the handles of opens made to execute the file
//!   (the kernel's FMODE_EXEC in the OPEN's flags), so it is non-zero exactly while one
//!   of them is in the table.
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
    /// The open was made to execute the file.
    exec: bool,
}

/// The kernel's flag in an OPEN's flags for the open of a program by execve(2)
/// (`__FMODE_EXEC`, include/linux/fcntl.h; no open(2) flag has this bit).
pub const OPEN_FOR_EXEC: i32 = 0o40;

/// Open files by handle.
pub struct Handles {
    map: RwLock<Table>,
    next: AtomicU64,
}

#[derive(Default)]
struct Table {
    handles: HashMap<Fh, Handle>,
    /// Handles of opens to execute, per backing inode (never a zero entry).
    executing: HashMap<u64, u32>,
}

impl Default for Handles {
    fn default() -> Self {
        Self {
            map: RwLock::new(Table::default()),
            next: AtomicU64::new(1),
        }
    }
}

impl Handles {
    /// The backing inode, data and write durability of handle `fh`.
    pub fn get(&self, fh: Fh) -> Result<(u64, HandleData, WriteSync)> {
        let map = self.map.read();
        let h = map.handles.get(&fh).ok_or(FsError::Errno(libc::EBADF))?;
        Ok((h.key, h.data.clone(), h.sync))
    }

    /// A new handle for an open of backing inode `key` with open(2) flags `open_flags`.
    pub fn insert(&self, key: u64, data: HandleData, open_flags: i32) -> Fh {
        let fh = Fh(self.next.fetch_add(1, Ordering::Relaxed));
        let sync = WriteSync::of_flags(open_flags);
        let exec = open_flags & OPEN_FOR_EXEC != 0;
        let mut map = self.map.write();
        let h = Handle {
            key,
            data,
            sync,
            exec,
        };
        let old = map.handles.insert(fh, h);
        assert!(old.is_none(), "handle {fh:?} given out twice");
        if exec {
            *map.executing.entry(key).or_insert(0) += 1;
        }
        fh
    }

    /// Takes handle `fh` out of the table (RELEASE).
    pub fn remove(&self, fh: Fh) -> Option<(u64, HandleData)> {
        let mut map = self.map.write();
        let h = map.handles.remove(&fh)?;
        if h.exec {
            let left = match map.executing.get_mut(&h.key) {
                Some(n) => {
                    // Never a zero entry: the last exec handle removes it below.
                    debug_assert!(*n > 0, "a zero count of exec handles");
                    *n -= 1;
                    *n
                }
                None => unreachable!("an exec handle of an inode not counted as executing"),
            };
            if left == 0 {
                map.executing.remove(&h.key);
            }
        }
        Some((h.key, h.data))
    }

    /// Whether backing inode `key` has a handle of an open to execute it.
    pub fn executing(&self, key: u64) -> bool {
        self.map.read().executing.contains_key(&key)
    }
}
