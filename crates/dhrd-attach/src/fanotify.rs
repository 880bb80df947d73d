//! A fanotify notification group that names files by handle (FID reporting), and the
//! parsing of its events.
//!
//! Why notification events only: a notification is queued by the kernel and the call that
//! caused it returns at once, whether or not the daemon ever reads it; permission events
//! would make applications wait for the daemon (SPEC A3). The group reports the parent
//! directory and name of each directory entry event and the file itself
//! (`FAN_REPORT_DFID_NAME_TARGET`, Linux 5.17), so a created, renamed or deleted file is
//! named by its own handle too. The queue is unlimited (root): a dropped event would be a
//! file renamed in and never repaired, and the queue only grows while the daemon is
//! slower than the events it asked for.
//!
//! Invariants: events are parsed from the bytes the kernel wrote, never trusted beyond
//! the lengths they state; a record that does not fit is skipped. No crash semantics: the
//! group and its marks vanish with the process.

use crate::handle::Handle;
use std::ffi::{CStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

/// Bytes of one `read` of events.
pub const EVENT_BUF_BYTES: usize = 64 * 1024;
/// Length of `struct fanotify_event_metadata`.
const METADATA_BYTES: usize = 24;
/// `FAN_EVENT_METADATA_VERSION`.
const METADATA_VERSION: u8 = 3;

/// The group's flags: notifications, FID reporting of parent, name and target.
const INIT_FLAGS: u32 = libc::FAN_CLASS_NOTIF
    | libc::FAN_CLOEXEC
    | libc::FAN_NONBLOCK
    | libc::FAN_UNLIMITED_QUEUE
    | libc::FAN_REPORT_DFID_NAME_TARGET;

/// What a mark is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOn {
    /// Every inode of the file system of the object.
    Filesystem,
    /// The directory itself, and (with `FAN_EVENT_ON_CHILD`) its entries.
    Inode,
    /// One regular file: its own events only.
    File,
}

/// One event, with the records the group reports.
#[derive(Debug, Clone, Default)]
pub struct Event {
    pub mask: u64,
    pub pid: i32,
    /// The file or directory the event is about.
    pub target: Option<Handle>,
    /// Parent directory and name (entry events, and events on a child of a mark).
    pub dir: Option<(Handle, OsString)>,
    /// A rename's old and new parent and name.
    pub old: Option<(Handle, OsString)>,
    pub new: Option<(Handle, OsString)>,
}

impl Event {
    pub fn is(&self, mask: u64) -> bool {
        self.mask & mask != 0
    }
    pub fn on_dir(&self) -> bool {
        self.is(libc::FAN_ONDIR)
    }
}

pub struct Group {
    fd: OwnedFd,
}

impl Group {
    /// A new group. Fails with EINVAL on kernels without target FID reporting (< 5.17)
    /// and EPERM without CAP_SYS_ADMIN.
    pub fn new() -> io::Result<Self> {
        // SAFETY: fanotify_init takes two flag words and returns a new descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                INIT_FLAGS,
                (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Adds `mask` to the mark on `obj`: a directory, a file, or for `MarkOn::Filesystem`
    /// anything on the file system; a real open, since `fanotify_mark` refuses O_PATH
    /// descriptors (EBADF).
    pub fn add(&self, on: MarkOn, obj: BorrowedFd<'_>, mask: u64) -> io::Result<()> {
        self.mark(libc::FAN_MARK_ADD, on, obj, mask)
    }

    /// Adds `mask` to the mark on the file `name` in directory `dir` (`MarkOn::File`),
    /// without opening it.
    pub fn add_at(&self, dir: BorrowedFd<'_>, name: &CStr, mask: u64) -> io::Result<()> {
        self.mark_at(libc::FAN_MARK_ADD, MarkOn::File, dir, Some(name), mask)
    }

    /// Removes `mask` from the file mark of `name` in directory `dir`, without opening it.
    pub fn remove_at(&self, dir: BorrowedFd<'_>, name: &CStr, mask: u64) -> io::Result<()> {
        self.mark_at(libc::FAN_MARK_REMOVE, MarkOn::File, dir, Some(name), mask)
    }

    /// Removes `mask` from the mark on `obj` (the mark goes when its mask is empty). `obj`
    /// must be a real open, as for `add`: `fanotify_mark` refuses O_PATH descriptors.
    pub fn remove(&self, on: MarkOn, obj: BorrowedFd<'_>, mask: u64) -> io::Result<()> {
        self.mark(libc::FAN_MARK_REMOVE, on, obj, mask)
    }

    fn mark(&self, op: u32, on: MarkOn, obj: BorrowedFd<'_>, mask: u64) -> io::Result<()> {
        self.mark_at(op, on, obj, None, mask)
    }

    /// `fanotify_mark` of `obj` itself, or of `name` in directory `obj`. A name is taken
    /// as it is, never followed if it is a symbolic link.
    fn mark_at(
        &self,
        op: u32,
        on: MarkOn,
        obj: BorrowedFd<'_>,
        name: Option<&CStr>,
        mask: u64,
    ) -> io::Result<()> {
        let how = match on {
            MarkOn::Filesystem => libc::FAN_MARK_FILESYSTEM,
            MarkOn::Inode => libc::FAN_MARK_INODE | libc::FAN_MARK_ONLYDIR,
            MarkOn::File => libc::FAN_MARK_INODE | libc::FAN_MARK_DONT_FOLLOW,
        };
        let path = name.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: fanotify_mark on our group with a descriptor and either a NULL path (the
        // descriptor itself is the object) or a NUL-terminated name that outlives the call.
        let r = unsafe {
            libc::fanotify_mark(self.fd.as_raw_fd(), op | how, mask, obj.as_raw_fd(), path)
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads what is queued (non-blocking); an empty list when nothing is.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Vec<Event>> {
        match rustix::io::read(&self.fd, &mut *buf) {
            Ok(n) => Ok(parse(&buf[..n])),
            Err(rustix::io::Errno::AGAIN) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsFd for Group {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses a buffer of events (`struct fanotify_event_metadata` each, then its info
/// records). Stops at the first event that does not fit.
pub fn parse(mut b: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    while b.len() >= METADATA_BYTES {
        let Some(len) = u32_at(b, 0).map(|l| l as usize) else {
            break;
        };
        if len < METADATA_BYTES || len > b.len() {
            break;
        }
        let meta_len = u16_at(b, 6).map_or(METADATA_BYTES, usize::from);
        if b[4] == METADATA_VERSION && meta_len <= len {
            let mut ev = Event {
                mask: u64_at(b, 8).unwrap_or(0),
                pid: u32_at(b, 20).map_or(0, |p| p as i32),
                ..Event::default()
            };
            parse_records(&b[meta_len..len], &mut ev);
            out.push(ev);
        }
        b = &b[len..];
    }
    out
}

/// Info records: header (type u8, pad u8, len u16), then for FID records the file
/// system id (8 bytes) and a file handle, followed by a NUL-terminated name for the
/// `*_DFID_NAME` types.
fn parse_records(mut b: &[u8], ev: &mut Event) {
    while b.len() >= 4 {
        let kind = b[0];
        let len = usize::from(u16_at(b, 2).unwrap_or(0));
        if len < 4 || len > b.len() {
            return;
        }
        let rec = &b[4..len];
        if let Some((h, rest)) = rec.get(8..).and_then(Handle::parse) {
            let name = || {
                let end = rest.iter().position(|c| *c == 0).unwrap_or(rest.len());
                OsString::from_vec(rest[..end].to_vec())
            };
            match kind {
                libc::FAN_EVENT_INFO_TYPE_FID => ev.target = Some(h),
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME => ev.dir = Some((h, name())),
                libc::FAN_EVENT_INFO_TYPE_DFID => ev.dir = Some((h, OsString::new())),
                libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME => ev.old = Some((h, name())),
                libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => ev.new = Some((h, name())),
                _ => {}
            }
        }
        b = &b[len..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    fn fid_record(kind: u8, h: &Handle, name: Option<&[u8]>) -> Vec<u8> {
        let mut body = vec![0u8; 8]; // fsid
        body.extend((h.bytes.len() as u32).to_ne_bytes());
        body.extend(h.handle_type.to_ne_bytes());
        body.extend(&h.bytes);
        if let Some(n) = name {
            body.extend(n);
            body.push(0);
        }
        while !body.len().is_multiple_of(4) {
            body.push(0);
        }
        let mut rec = vec![kind, 0];
        rec.extend(((body.len() + 4) as u16).to_ne_bytes());
        rec.extend(body);
        rec
    }

    fn event(mask: u64, pid: i32, records: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = records.concat();
        let mut e = ((METADATA_BYTES + body.len()) as u32)
            .to_ne_bytes()
            .to_vec();
        e.push(METADATA_VERSION);
        e.push(0);
        e.extend((METADATA_BYTES as u16).to_ne_bytes());
        e.extend(mask.to_ne_bytes());
        e.extend((-1i32).to_ne_bytes());
        e.extend(pid.to_ne_bytes());
        e.extend(body);
        e
    }

    #[test]
    fn events_and_their_records_are_parsed_and_a_short_one_ends_the_batch() {
        let d = Handle {
            handle_type: 1,
            bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
        };
        let f = Handle {
            handle_type: 1,
            bytes: vec![9; 8],
        };
        let mut buf = event(
            libc::FAN_CREATE,
            42,
            &[
                fid_record(libc::FAN_EVENT_INFO_TYPE_DFID_NAME, &d, Some(b"new")),
                fid_record(libc::FAN_EVENT_INFO_TYPE_FID, &f, None),
            ],
        );
        buf.extend(event(
            libc::FAN_RENAME | libc::FAN_ONDIR,
            7,
            &[
                fid_record(libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME, &d, Some(b"a")),
                fid_record(libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME, &f, Some(b"b")),
            ],
        ));
        let whole = buf.len();
        buf.extend(&event(libc::FAN_OPEN, 1, &[])[..10]);
        let evs = parse(&buf);
        assert_eq!(evs.len(), 2, "{evs:?}");
        assert_eq!((evs[0].mask, evs[0].pid), (libc::FAN_CREATE, 42));
        assert_eq!(evs[0].dir, Some((d.clone(), "new".into())));
        assert_eq!(evs[0].target, Some(f.clone()));
        assert!(evs[1].on_dir() && evs[1].is(libc::FAN_RENAME));
        assert_eq!(evs[1].old, Some((d, "a".into())));
        assert_eq!(evs[1].new, Some((f, "b".into())));
        assert_eq!(parse(&buf[..whole - 1]).len(), 1);
    }
}
