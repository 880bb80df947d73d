//! What dhrd changed to hold a directory, recorded on the directory itself (the xattr
//! `trusted.dhrd.attach`), so that detach restores exactly that and an attach after a
//! daemon crash knows which changes are its own.
//!
//! The record is written, and made durable, before the change it names, and removed after
//! every change it names is undone. A crash in between leaves a record naming a change
//! that may or may not have happened; undoing it is then safe either way: dhrd remounts
//! `async` only a file system it found without `sync` (so `sync` there is its own), and
//! clears only sync flags it marked or that files inherited from a directory it flagged.
//! Per-file marks (`trusted.dhrd.sync`, as the FUSE mount sets) record which flags are its
//! own; the record says whether to look for them.
//!
//! Invariants: one record per directory; only the daemon holding the directory's lock
//! writes it. Crash semantics: as above; it is durable when `write` returns.

use std::io;
use std::os::fd::BorrowedFd;

/// The xattr holding the record.
pub const RECORD_XATTR: &str = "trusted.dhrd.attach";
/// Longest record read.
const RECORD_BYTES_MAX: usize = 4096;

/// The changes dhrd has made (or is about to make) to the directory and its file system.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The file system was remounted `sync` by dhrd (it was not before).
    pub remounted_sync: bool,
    /// Sync flags were set on files and directories (each marked, or inherited from a
    /// marked directory).
    pub inode_flags: bool,
    /// The mode of the daemon that wrote it, and its pid (for people reading it).
    pub durability: String,
    pub pid: u32,
}

impl Record {
    fn to_text(&self) -> String {
        format!(
            "dhrd-attach 1\nremounted_sync={}\ninode_flags={}\ndurability={}\npid={}\n",
            u8::from(self.remounted_sync),
            u8::from(self.inode_flags),
            self.durability,
            self.pid
        )
    }

    fn from_text(t: &str) -> Record {
        let mut r = Record::default();
        for l in t.lines() {
            match l.split_once('=') {
                Some(("remounted_sync", v)) => r.remounted_sync = v == "1",
                Some(("inode_flags", v)) => r.inode_flags = v == "1",
                Some(("durability", v)) => r.durability = v.to_owned(),
                Some(("pid", v)) => r.pid = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        r
    }

    /// Whether it names any change to undo.
    pub fn names_changes(&self) -> bool {
        self.remounted_sync || self.inode_flags
    }

    /// The record on `dir`, if there is one.
    pub fn read(dir: BorrowedFd<'_>) -> io::Result<Option<Record>> {
        let mut buf = vec![0u8; RECORD_BYTES_MAX];
        match rustix::fs::fgetxattr(dir, RECORD_XATTR, &mut buf) {
            Ok(n) => Ok(Some(Record::from_text(&String::from_utf8_lossy(&buf[..n])))),
            Err(rustix::io::Errno::NODATA) => Ok(None),
            // A file system without xattrs (proc, sysfs, some FUSE ones) cannot hold one.
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the record and makes it durable (fsync of the directory).
    pub fn write(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        rustix::fs::fsetxattr(
            dir,
            RECORD_XATTR,
            self.to_text().as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )?;
        rustix::fs::fsync(dir)?;
        Ok(())
    }

    /// Removes the record (every change it named is undone) and makes that durable.
    pub fn remove(dir: BorrowedFd<'_>) -> io::Result<()> {
        match rustix::fs::fremovexattr(dir, RECORD_XATTR) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
        rustix::fs::fsync(dir)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn the_text_round_trips_and_unknown_lines_are_ignored() {
        let r = Record {
            remounted_sync: true,
            inode_flags: false,
            durability: "sync".into(),
            pid: 77,
        };
        assert_eq!(Record::from_text(&r.to_text()), r);
        let later = format!("{}future=1\n", r.to_text());
        assert_eq!(Record::from_text(&later), r);
        assert!(!Record::default().names_changes());
    }
}
