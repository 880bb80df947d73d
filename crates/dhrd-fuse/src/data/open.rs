//! Opens and closes of regular files on the mount's data path: OPEN in two steps (the
//! namespace may change the file in between: open(O_TRUNC)), CREATE's open of the file it
//! made, and RELEASE.
//!
//! Invariants: an open counted by its data path (a registration's opens, an object's
//! opens) is either in the handle table or given back (`abandon`, `release`), so no
//! count outlives the open it stands for. No crash semantics of its own.

use super::handles::HandleData;
use super::{Files, Tier};
use crate::engine::objects::OpenKind;
use crate::error::Result;
use crate::kernel::{Fh, OpenReply, Register, ReplyFlags};
use crate::killpriv::Caller;
use crate::page::Opened;
use std::fs::File;

/// An open of a regular file its data path has counted, not yet in the handle table
/// (`Files::finish_open`, or `Files::abandon` if the request fails before).
pub struct Opening {
    key: u64,
    writable: bool,
    data: HandleData,
    /// The page cache path's reply; the engine decides its own at `finish_open`.
    reply: OpenReply,
}

impl Files {
    /// First step of OPEN of backing inode `key` with open(2) `flags`: the data path
    /// counts the open. `open_backing` opens the backing file read-write (with the status
    /// its check took) where the data path holds none of it yet; `label` names the file
    /// for the engine's messages.
    pub fn open(
        &self,
        key: u64,
        flags: i32,
        caller: &Caller,
        open_backing: impl FnOnce() -> Result<(File, libc::stat)>,
        label: impl FnOnce() -> String,
        register: Register<'_>,
    ) -> Result<Opening> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        match self.tier() {
            Tier::Page(t) => {
                let opened = || {
                    let (file, st) = open_backing()?;
                    Ok(Opened {
                        file,
                        mode: st.st_mode,
                        fresh: false,
                        size: st.st_size as u64,
                    })
                };
                let (open, reply) =
                    t.open(key, flags, writable.then_some(*caller), opened, register)?;
                self.count_page_open(&open);
                Ok(Opening {
                    key,
                    writable,
                    data: HandleData::Page(open),
                    reply,
                })
            }
            Tier::Engine(t) => {
                let open_file = || open_backing().map(|(f, _)| f);
                let obj = t.objects().acquire(key, &label(), writable, open_file)?;
                let kind = if writable {
                    OpenKind::Writer
                } else {
                    OpenKind::Undecided
                };
                Ok(Opening {
                    key,
                    writable,
                    data: HandleData::Engine { obj, kind },
                    reply: OpenReply::Plain(ReplyFlags::empty()),
                })
            }
        }
    }

    /// Second step of OPEN: the handle, and how the kernel reaches the file's data.
    pub fn finish_open(&self, o: Opening, flags: i32, register: Register<'_>) -> (Fh, OpenReply) {
        match o.data {
            HandleData::Page(open) => {
                let fh = self.handles.insert(o.key, HandleData::Page(open), flags);
                (fh, o.reply)
            }
            HandleData::Engine { obj, .. } => {
                let Tier::Engine(t) = self.tier() else {
                    unreachable!("an engine handle on the page cache path");
                };
                let (kind, reply) = t.choose_reply(&self.stats, o.key, &obj, o.writable, register);
                let fh = self
                    .handles
                    .insert(o.key, HandleData::Engine { obj, kind }, flags);
                (fh, reply)
            }
        }
    }

    /// An open that failed between its two steps: the data path forgets it.
    pub fn abandon(&self, o: Opening) {
        self.release_data(o.key, o.data);
    }

    /// The open of CREATE: `opened` is the file the namespace just made or found (`fresh`
    /// when made). `label` names it for the engine's messages.
    pub fn open_created(
        &self,
        key: u64,
        flags: i32,
        caller: &Caller,
        opened: Opened,
        label: impl FnOnce() -> String,
        register: Register<'_>,
    ) -> Result<(Fh, OpenReply)> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (data, reply) = match self.tier() {
            Tier::Page(t) => {
                let writer = writable.then_some(*caller);
                let (open, reply) = t.open(key, flags, writer, || Ok(opened), register)?;
                self.count_page_open(&open);
                (HandleData::Page(open), reply)
            }
            Tier::Engine(t) => {
                let obj = t
                    .objects()
                    .acquire(key, &label(), true, || Ok(opened.file))?;
                let kind = OpenKind::Writer;
                let reply = OpenReply::Plain(t.data_open_flags(&self.stats));
                (HandleData::Engine { obj, kind }, reply)
            }
        };
        Ok((self.handles.insert(key, data, flags), reply))
    }

    /// Whether backing inode `key` is being executed: an open of it made by execve(2) is
    /// still open (its RELEASE is still to come).
    pub fn executing(&self, key: u64) -> bool {
        self.handles.executing(key)
    }

    /// RELEASE: drops the handle and counts the close on its data path.
    pub fn release(&self, fh: Fh) {
        if let Some((key, data)) = self.handles.remove(fh) {
            self.release_data(key, data);
        }
    }

    fn release_data(&self, key: u64, data: HandleData) {
        match (self.tier(), data) {
            (Tier::Page(t), HandleData::Page(open)) => t.release(key, open),
            (Tier::Engine(t), HandleData::Engine { kind, .. }) => t.objects().release(key, kind),
            _ => unreachable!("a handle of the other data path"),
        }
    }
}
