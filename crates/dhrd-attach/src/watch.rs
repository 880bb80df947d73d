//! What the daemon learns from the kernel while it holds a directory, through one
//! fanotify group (`fanotify.rs`), and what it does about it:
//!
//! - a file opened during the warm-up goes to the front of the warm-up (`FAN_OPEN`, only
//!   until the warm-up completes: after that every open would cost an event for nothing);
//! - a file made (or linked in) is handed to the warm-up after a delay, at a bounded rate,
//!   oldest first (`FAN_CREATE`; a file deleted meanwhile costs a failed open;
//!   `dhrd_pagecache::resident::Changed`);
//! - every file handed to the warm-up is followed first: a mark of its own asks for its
//!   closes after writing, after which it may have grown or shrunk and its pin is
//!   refreshed the same way (`FAN_CLOSE_WRITE`), and for changes of its attributes, which
//!   its unlink or a rename over it is to the file itself (`FAN_ATTRIB`: its link count
//!   dropped). A file that lost its last name gives back its pin and budget: the pin's
//!   mapping would otherwise keep the deleted file's space for good. A file that cannot be
//!   followed (`fs.fanotify.max_user_marks`) is not handed on: it stays unpinned;
//! - in a subdirectory (`Scope::Tree`), each directory carries an inode mark, so the
//!   daemon hears of new files and directories (marked, and flagged when `sync` is by
//!   flags, see below), of files and directories moved in (flagged, marked, warmed) or out
//!   (forgotten, unmarked, each file's own mark removed too, or its next write outside
//!   would pin it again), and of its own removal; with `sync` by flags, every created or
//!   linked-in file is checked for its flag;
//! - a directory made in the tree is adopted (marked, walked: the directories below it
//!   marked, its files handed on through the changed files' delay) `CHANGED_DELAY` after
//!   its creation is heard, at once where `sync` is kept by flags. An extraction or a build
//!   fills a new directory in about a millisecond, long before an adoption could help
//!   it; adopted at once, 420 new directories of 20,000 files cost 40-70 ms of daemon CPU
//!   on the other CPU during a 0.3 s `tar -xf`, adopted later none (docs/attach.md,
//!   "Directories adopted after the delay"). Nothing is missed meanwhile: the walk marks
//!   each directory before it reads it, so what was made or moved in before is found
//!   and what comes after is heard. Until then a made directory is not the tree's for
//!   renames: a file moved from it into the tree counts as moved in (pinned now), one
//!   moved into it as moved out (let go, found again by the adoption);
//! - where files are made in a burst, a directory stops hearing their creations for a
//!   while and is read again for them (`dirs.rs`, which says when; not with `sync` by
//!   flags, where each creation is checked for its flag).
//!
//! Why files are followed one by one and not through their directory's mark
//! (`FAN_EVENT_ON_CHILD`): a directory mark that asks for its children's closes and
//! deletions queues an event for every file written or deleted, most of which are never
//! pinned (they live less than the delay), in the application's own call; and the kernel
//! then takes the slow path of `__fsnotify_parent` for every access to a child, a read
//! too. A file's own mark costs events only for files the warm-up knows. The creation of a
//! file is the one event a file costs, outside a burst (docs/attach.md, "Files followed
//! one by one").
//!
//! Where the directory is the root of its file system (`Scope::Filesystem`) one mark covers
//! every directory and nothing can move in from outside.
//!
//! Why events are read in batches (`EVENT_BATCH_PAUSE`): the thread sleeps between
//! batches instead of waiting in `poll`, so an application's call that queues an event
//! does not also wake the daemon (a wake-up of a halted vCPU costs the caller an
//! interrupt); events meanwhile wait in the kernel's queue. It bounds how late a repair
//! comes after a rename in (docs/crash-model.md).
//!
//! Invariants: a file the warm-up knows carries its own mark (it was followed before its
//! hand-off, and an inode mark lasts as long as the inode), so a later hand-on adds none;
//! the daemon's own opens (warm-up, flag walks) are skipped by pid; the watch only reads
//! files, sets flags and marks, and tells the warm-up; it never blocks an application
//! (notification events only); what it held of a deleted file goes to the reaper with the
//! file's pin (freeing an inode with the sync flag waits for a journal commit, and the
//! watch must stay free to repair flags); at most `CHANGED_MAX` changed files wait (past
//! it the oldest is handed on at once), and at most `MADE_MAX` made directories (past it
//! the oldest is adopted at once). Crash semantics: none; the group and its marks
//! vanish with the process (flags stay, see `flags.rs`).

use crate::dirs::Dirs;
use crate::fanotify::{Event, Group, MarkOn, EVENT_BUF_BYTES};
use crate::flags::{self, FlagStats};
use crate::handle::Handle;
use crate::tree::{self, Kind};
use dhrd_pagecache::resident::{Changed, Resident, CHANGED_DELAY, CHANGED_MAX};
use dhrd_pagecache::{double_sysctl, SysctlRaise};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Pause between batches of events (see the module header) where a late event leaves a
/// window: `sync` kept by flags (a file renamed in waits this long for its flag), and the
/// warm-up's demand of opened files.
pub const EVENT_BATCH_PAUSE: Duration = Duration::from_millis(2);
/// Pause between batches where lateness only delays a pin or its release (`fsync` and
/// `periodic`, `sync` by the mount's option, once the warm-up is done). Longer batches
/// cost the daemon fewer wake-ups, and the kernel merges an event into a queued one of
/// the same file and process (a file closed after writing ten times may be one event). On
/// the fileserver workload (50 threads, 2,000 files) the daemon's CPU fell from 0.92-0.95 s
/// to 0.30-0.34 s in 10 s.
pub const EVENT_BATCH_PAUSE_RELAXED: Duration = Duration::from_millis(20);
/// Fault injection for tests: while the file this names exists, events wait in the
/// kernel's queue unread, which holds every repair back (the window a rename in opens,
/// made as long as a test needs to show it).
pub const WATCH_STALL_ENV: &str = "DHRD_FAULT_WATCH_STALL_FILE";

/// How events are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The directory is the root of its file system: one filesystem mark.
    Filesystem,
    /// A subdirectory: an inode mark on every directory of the tree.
    Tree,
}

/// What the mark of a followed file asks (`Watch::follow`): its closes after writing and
/// changes of its attributes (an unlink, a rename over it: its link count).
pub const FILE_MASK: u64 = libc::FAN_CLOSE_WRITE | libc::FAN_ATTRIB;
/// The per-user limit on fanotify marks, which following a file one by one spends one of.
pub const MAX_USER_MARKS_SYSCTL: &str = "/proc/sys/fs/fanotify/max_user_marks";
/// Highest value the watch raises `fs.fanotify.max_user_marks` to, as root (a mark and its
/// share of an inode's connector cost the kernel about 150 bytes: 600 MiB at this bound).
pub const MAX_USER_MARKS_RAISE_MAX: u64 = 1 << 22;

/// What the filesystem mark asks (`Scope::Filesystem`): files made.
const FS_MASK: u64 = libc::FAN_CREATE;
/// What each directory's mark asks (`Scope::Tree`): entries made and renamed, directories
/// too, and the directory's own removal.
const TREE_MASK: u64 =
    libc::FAN_CREATE | libc::FAN_RENAME | libc::FAN_ONDIR | libc::FAN_DELETE_SELF;

/// How a directory joined the tree (`Watch::adopt_dir`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopt {
    /// Made in the tree: its files are new and still being written.
    Made,
    /// Moved in from elsewhere on the file system.
    MovedIn,
}

/// Counters for status.
#[derive(Debug, Default)]
pub struct WatchStats {
    pub events: AtomicU64,
    pub demanded: AtomicU64,
    pub refreshed: AtomicU64,
    pub forgotten: AtomicU64,
    pub dirs_marked: AtomicU64,
    /// Times a directory stopped hearing creations for a while (`dirs.rs`).
    pub dirs_muted: AtomicU64,
    /// Reads of a directory whose creations went unheard (`Watch::rescan`).
    pub rescans: AtomicU64,
    /// Directories that could not be marked (`fs.fanotify.max_user_marks`): files moved
    /// into them are not seen; files created there still inherit their flags.
    pub mark_failures: AtomicU64,
    /// Marks added to files (`follow`): one before a file's first hand-off to the warm-up;
    /// the hand-on of a known file's later changes adds none (a demanded open during the
    /// warm-up may add one to a file its walk marked already).
    pub files_followed: AtomicU64,
    /// Files that could not be followed (`fs.fanotify.max_user_marks`), so not handed to
    /// the warm-up: they stay unpinned.
    pub follow_failures: AtomicU64,
    /// `fs.fanotify.max_user_marks` before the watch first raised it (0: never raised).
    pub marks_limit_raised_from: AtomicU64,
    pub moved_in: AtomicU64,
    pub moved_out: AtomicU64,
}

/// What a handler needs of the attached directory.
pub struct Ctx<'a> {
    pub root: BorrowedFd<'a>,
    /// The attached directory's canonical path.
    pub dir: &'a Path,
    pub resident: &'a Resident,
    /// `Some` when `sync` is kept by inode flags: created and moved-in files get theirs.
    pub flags: Option<&'a FlagStats>,
}

pub struct Watch {
    group: Group,
    pub scope: Scope,
    /// `sync` is kept by inode flags: a late event leaves a window (`EVENT_BATCH_PAUSE`),
    /// and a file made or linked in is checked for its flag at once.
    sync_by_flags: bool,
    /// Tree scope: the marked directories (with their handles, to change or remove their
    /// marks), those that hear no creations for now, and the made ones waiting.
    dirs: Mutex<Dirs>,
    open_events: AtomicBool,
    /// Files closed after writing, by key, waiting `CHANGED_DELAY` (in due order).
    changed: Mutex<Changed<Handle>>,
    pub stats: WatchStats,
    me: i32,
}

impl Watch {
    /// A watch through `group` (the check's, see `check::Plan`) with `FAN_OPEN` on (the
    /// warm-up runs first); `sync_by_flags`: see the field.
    pub fn new(group: Group, scope: Scope, sync_by_flags: bool) -> Self {
        Self {
            group,
            scope,
            sync_by_flags,
            dirs: Mutex::new(Dirs::new()),
            open_events: AtomicBool::new(true),
            changed: Mutex::new(Changed::new()),
            stats: WatchStats::default(),
            me: std::process::id() as i32,
        }
    }

    fn mask(&self) -> u64 {
        let open = if self.open_events.load(Ordering::Acquire) {
            self.open_mask()
        } else {
            0
        };
        match self.scope {
            Scope::Filesystem => FS_MASK | open,
            Scope::Tree => TREE_MASK | open,
        }
    }

    /// What the warm-up's demand adds to a mark until it completes: opens, of a
    /// directory's children in the tree scope.
    fn open_mask(&self) -> u64 {
        match self.scope {
            Scope::Filesystem => libc::FAN_OPEN,
            Scope::Tree => libc::FAN_OPEN | libc::FAN_EVENT_ON_CHILD,
        }
    }

    /// Follows the file `f` by a mark of its own (`FILE_MASK`) before it is handed to the
    /// warm-up, so that any close after writing that the warm-up's size could miss is
    /// heard. False if it cannot be (the caller then leaves it unpinned).
    fn follow(&self, f: BorrowedFd<'_>) -> bool {
        self.counted_follow(|| self.group.add(MarkOn::File, f, FILE_MASK))
    }

    /// `follow` of the file `name` in directory `dir`, without opening it (the walks).
    pub fn follow_at(&self, dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> bool {
        self.counted_follow(|| self.group.add_at(dir, name, FILE_MASK))
    }

    /// Runs `add`; out of marks (ENOSPC), raises the per-user limit once as far as
    /// doubling allows (root only) and tries again.
    fn counted_follow(&self, add: impl Fn() -> io::Result<()>) -> bool {
        let mut r = add();
        if r.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::ENOSPC))
            && self.raise_marks_limit()
        {
            r = add();
        }
        match r {
            Ok(()) => {
                self.stats.files_followed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.stats.follow_failures.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Doubles `fs.fanotify.max_user_marks` up to `MAX_USER_MARKS_RAISE_MAX`, as the
    /// warm-up raises `vm.max_map_count` for its pins (and for the same reason: a file
    /// that cannot be followed cannot be pinned). Never lowered: other groups of the same
    /// user may rely on it by then. Whether it was raised.
    fn raise_marks_limit(&self) -> bool {
        let Ok(SysctlRaise::Raised { from, .. }) =
            double_sysctl(Path::new(MAX_USER_MARKS_SYSCTL), MAX_USER_MARKS_RAISE_MAX)
        else {
            return false;
        };
        let _ = self.stats.marks_limit_raised_from.compare_exchange(
            0,
            from,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        true
    }

    /// Stops following a file that left the tree (its mark would keep reporting it, and
    /// its next change would pin it again). Through a real open: `fanotify_mark` takes no
    /// O_PATH descriptor as its object (EBADF).
    fn unfollow(&self, ctx: &Ctx<'_>, target: &Handle) {
        if let Some(f) = open_regular(ctx.root, target) {
            let _ = self.group.remove(MarkOn::File, f.as_fd(), FILE_MASK);
        }
    }

    /// Filesystem scope: marks the file system of `root`. Tree scope: nothing (each
    /// directory is marked by `add_dir`).
    pub fn start(&self, root: BorrowedFd<'_>) -> io::Result<()> {
        match self.scope {
            Scope::Filesystem => self.group.add(MarkOn::Filesystem, root, self.mask()),
            Scope::Tree => Ok(()),
        }
    }

    /// Tree scope: marks directory `fd` (already part of the tree).
    pub fn add_dir(&self, fd: BorrowedFd<'_>) {
        if self.scope != Scope::Tree {
            return;
        }
        let Ok(h) = Handle::of(fd, None) else {
            self.stats.mark_failures.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match self.group.add(MarkOn::Inode, fd, self.mask()) {
            Ok(()) => {
                self.stats.dirs_marked.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().mark(h, Instant::now());
            }
            Err(_) => {
                self.stats.mark_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Files closed after writing that wait for their hand-off to the warm-up (their pin).
    pub fn changed_waiting(&self) -> usize {
        self.changed.lock().len()
    }

    /// Directories made in the tree that wait for their adoption (tree scope).
    pub fn dirs_waiting(&self) -> usize {
        self.dirs.lock().made_waiting()
    }

    /// Directories marked now (tree scope).
    pub fn dirs_marked(&self) -> usize {
        self.dirs.lock().marked_count()
    }

    /// The warm-up completed: no more `FAN_OPEN` events.
    pub fn stop_open_events(&self, root: BorrowedFd<'_>) {
        if !self.open_events.swap(false, Ordering::AcqRel) {
            return;
        }
        // With the open events goes `FAN_EVENT_ON_CHILD`: no directory mark is then
        // interested in its children, and reading a child costs nothing for it.
        let open = self.open_mask();
        match self.scope {
            Scope::Filesystem => {
                let _ = self.group.remove(MarkOn::Filesystem, root, open);
            }
            Scope::Tree => {
                let handles = self.dirs.lock().handles();
                for h in handles {
                    if let Ok(fd) = h.open(root, libc::O_RDONLY | libc::O_DIRECTORY) {
                        let _ = self.group.remove(MarkOn::Inode, fd.as_fd(), open);
                    }
                }
            }
        }
    }

    /// Reads and handles events until `stop` is set; `wake` (an eventfd) interrupts the
    /// wait.
    pub fn run(&self, ctx: &Ctx<'_>, wake: BorrowedFd<'_>, stop: &AtomicBool) {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut buf = vec![0u8; EVENT_BUF_BYTES];
        let stall = std::env::var_os(WATCH_STALL_ENV).map(PathBuf::from);
        let stalled = || stall.as_deref().is_some_and(Path::exists);
        while !stop.load(Ordering::Acquire) {
            if stalled() {
                std::thread::sleep(EVENT_BATCH_PAUSE);
                continue;
            }
            let mut fds = [
                PollFd::new(&self.group, PollFlags::IN),
                PollFd::new(&wake, PollFlags::IN),
            ];
            // Wake for the next changed file, made directory or muted one that comes due.
            let next_file = self.changed.lock().next_at();
            let next_dir = self.dirs.lock().next_due();
            let timeout = [next_file, next_dir].into_iter().flatten().min().map(|t| {
                let d = t.saturating_duration_since(Instant::now());
                rustix::event::Timespec {
                    tv_sec: d.as_secs() as i64,
                    tv_nsec: i64::from(d.subsec_nanos()),
                }
            });
            if poll(&mut fds, timeout.as_ref()).is_err() {
                std::thread::sleep(EVENT_BATCH_PAUSE);
                continue;
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
            // The fault hook is checked again once awake: the event that woke the
            // thread may be the very one a test holds back, and it stays queued.
            loop {
                if stalled() {
                    break;
                }
                let evs = match self.group.read(&mut buf) {
                    Ok(evs) if !evs.is_empty() => evs,
                    _ => break,
                };
                for ev in &evs {
                    self.handle(ctx, ev);
                }
            }
            self.adopt_made(ctx, false);
            self.unmute_due(ctx);
            self.hand_on_changed(ctx, false);
            std::thread::sleep(self.pause());
        }
    }

    /// How long to let events gather before the next batch (`EVENT_BATCH_PAUSE_RELAXED`).
    fn pause(&self) -> Duration {
        if self.sync_by_flags || self.open_events.load(Ordering::Acquire) {
            EVENT_BATCH_PAUSE
        } else {
            EVENT_BATCH_PAUSE_RELAXED
        }
    }

    fn handle(&self, ctx: &Ctx<'_>, ev: &Event) {
        if ev.pid == self.me {
            return;
        }
        self.stats.events.fetch_add(1, Ordering::Relaxed);
        if ev.is(libc::FAN_DELETE_SELF) && ev.on_dir() {
            // A directory's own event names it as a directory record, not a target.
            if let Some(h) = ev.target.as_ref().or(ev.dir.as_ref().map(|(h, _)| h)) {
                self.dirs.lock().unmark(h.key());
            }
            return;
        }
        let Some(target) = &ev.target else {
            return;
        };
        if self.scope == Scope::Tree && ev.is(libc::FAN_RENAME) {
            self.renamed(ctx, ev, target);
        }
        if ev.is(libc::FAN_CREATE) {
            if ev.on_dir() {
                if self.scope == Scope::Tree {
                    self.dir_made(ctx, target);
                }
            } else {
                if ctx.flags.is_some() {
                    // Made here (inherits the flags) or linked in from outside (may not).
                    if let Some(f) = open_regular(ctx.root, target) {
                        self.give_flags(ctx, &f);
                    }
                }
                self.note_changed(ctx, target);
                self.heard_create(ctx, ev);
            }
        }
        if ev.on_dir() {
            return;
        }
        if ev.is(libc::FAN_OPEN) {
            if let Some(f) = open_regular(ctx.root, target) {
                if self.follow(f.as_fd()) {
                    ctx.resident.demand(target.key(), &f);
                    self.stats.demanded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if ev.is(libc::FAN_ATTRIB) {
            self.attributes_changed(ctx, target);
        }
        if ev.is(libc::FAN_CLOSE_WRITE) {
            self.note_changed(ctx, target);
        }
    }

    /// Tree scope: a directory made in the tree is adopted `CHANGED_DELAY` later, or at
    /// once where `sync` is kept by flags (a file moved into it needs its flag now).
    fn dir_made(&self, ctx: &Ctx<'_>, target: &Handle) {
        if self.sync_by_flags {
            self.adopt_dir(ctx, target, Adopt::Made);
            return;
        }
        let full = self.dirs.lock().made(target.clone(), Instant::now());
        if full {
            self.adopt_made(ctx, true);
        }
    }

    /// Adopts the made directories that are due; with `oldest`, the oldest one whether or
    /// not it is (the waiting set is full).
    fn adopt_made(&self, ctx: &Ctx<'_>, oldest: bool) {
        let now = Instant::now();
        let mut first = oldest;
        loop {
            let Some(h) = self.dirs.lock().take_made(now, first) else {
                return;
            };
            first = false;
            self.adopt_dir(ctx, &h, Adopt::Made);
        }
    }

    /// Tree scope, not `sync_by_flags`: a file's creation was heard in its directory, which
    /// may stop hearing creations for a while (`dirs.rs`; with `sync` by flags every
    /// creation is checked for its flag at once).
    fn heard_create(&self, ctx: &Ctx<'_>, ev: &Event) {
        if self.scope != Scope::Tree || self.sync_by_flags {
            return;
        }
        let Some((dir, _)) = &ev.dir else {
            return;
        };
        let Some(h) = self.dirs.lock().heard_create(dir.key(), Instant::now()) else {
            return;
        };
        let Ok(fd) = h.open(ctx.root, libc::O_RDONLY | libc::O_DIRECTORY) else {
            return;
        };
        if self
            .group
            .remove(MarkOn::Inode, fd.as_fd(), libc::FAN_CREATE)
            .is_ok()
        {
            self.dirs.lock().muted(h.key(), Instant::now());
            self.stats.dirs_muted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Puts `FAN_CREATE` back on the marks of the muted directories that are due, then
    /// reads each for what was made meanwhile (in that order: a file made between the two
    /// is heard or read, or both).
    fn unmute_due(&self, ctx: &Ctx<'_>) {
        let now = Instant::now();
        loop {
            let Some(h) = self.dirs.lock().take_unmuted(now) else {
                return;
            };
            let Ok(fd) = h.open(ctx.root, libc::O_RDONLY | libc::O_DIRECTORY) else {
                // Gone: its removal's event unmarks it.
                continue;
            };
            if self
                .group
                .add(MarkOn::Inode, fd.as_fd(), libc::FAN_CREATE)
                .is_err()
            {
                // Creations in it go unheard from here on; it is read once more below
                // and then only by a later walk of the tree (counted: status shows it).
                self.stats.mark_failures.fetch_add(1, Ordering::Relaxed);
            }
            let entries = self.rescan(ctx, fd.as_fd());
            self.dirs.lock().rescanned(h.key(), entries, Instant::now());
        }
    }

    /// Reads directory `dir` (a muted one, just unmuted) for the files and directories
    /// made while its creations went unheard: files the warm-up does not know take the
    /// changed files' delay, directories not marked or waiting are made ones. Returns the
    /// entries read.
    fn rescan(&self, ctx: &Ctx<'_>, dir: BorrowedFd<'_>) -> u64 {
        use rustix::fs::FileType;
        self.stats.rescans.fetch_add(1, Ordering::Relaxed);
        let Ok(mut d) = rustix::fs::Dir::read_from(dir) else {
            return 0;
        };
        let mut entries = 0u64;
        while let Some(Ok(ent)) = d.read() {
            let name = ent.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            entries += 1;
            let kind = match ent.file_type() {
                FileType::RegularFile => Kind::File,
                FileType::Directory => Kind::Dir,
                FileType::Unknown => {
                    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => Kind::of_mode(st.st_mode),
                        Err(_) => continue,
                    }
                }
                _ => continue,
            };
            if kind == Kind::Other {
                continue;
            }
            let Ok(h) = Handle::of(dir, Some(name)) else {
                continue;
            };
            match kind {
                Kind::File if !ctx.resident.is_known(h.key()) => self.note_changed(ctx, &h),
                Kind::Dir => {
                    let known = self.dirs.lock().knows(h.key());
                    if !known {
                        self.dir_made(ctx, &h);
                    }
                }
                _ => {}
            }
        }
        entries
    }

    /// A file closed after writing: handed to the warm-up `CHANGED_DELAY` later, unless it
    /// is deleted first.
    fn note_changed(&self, ctx: &Ctx<'_>, target: &Handle) {
        let mut c = self.changed.lock();
        c.add(target.key(), target.clone(), Instant::now() + CHANGED_DELAY);
        let full = c.len() > CHANGED_MAX;
        drop(c);
        if full {
            self.hand_on_changed(ctx, true);
        }
    }

    /// Hands the changed files that are due to the warm-up, as many as the rate allows
    /// (`CHANGED_HANDOFFS_PER_S`); with `oldest`, the oldest one whatever the rate (the
    /// waiting set is full).
    fn hand_on_changed(&self, ctx: &Ctx<'_>, oldest: bool) {
        let now = Instant::now();
        let mut first = oldest;
        loop {
            let Some(h) = self.changed.lock().take(now, first) else {
                return;
            };
            let forced = std::mem::replace(&mut first, false);
            let Some(f) = open_regular(ctx.root, &h) else {
                // Gone (most files made are deleted before their delay ends, and only
                // followed files report their deletion): no hand-off used.
                if !forced {
                    self.changed.lock().refund();
                }
                continue;
            };
            // A file the warm-up knows was followed before it was handed over, and its
            // mark lasts as long as the inode: only a new file needs one.
            if ctx.resident.is_known(h.key()) || self.follow(f.as_fd()) {
                ctx.resident.refresh(h.key(), &f);
                self.stats.refreshed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A followed file's attributes changed, its link count perhaps: forget it if it has
    /// no name left (our pin would keep it).
    fn attributes_changed(&self, ctx: &Ctx<'_>, target: &Handle) {
        let key = target.key();
        if !ctx.resident.is_known(key) {
            // Not handed to the warm-up yet (waiting for its delay): nothing holds it, and
            // its hand-on finds it gone.
            return;
        }
        let fd = target.open(ctx.root, libc::O_PATH).ok();
        let linked = fd
            .as_ref()
            .and_then(|fd| dhrd_pagecache::link_count(fd.as_fd()).ok())
            .is_some_and(|n| n > 0);
        if !linked {
            // The descriptor may be the file's last reference once its pin goes: both are
            // let go by the reaper, since freeing the inode may wait for a journal commit.
            ctx.resident.forget_with(key, fd);
            self.stats.forgotten.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tree scope: a rename into, out of, or within the tree.
    fn renamed(&self, ctx: &Ctx<'_>, ev: &Event, target: &Handle) {
        let ours = |d: &Option<(Handle, std::ffi::OsString)>| {
            d.as_ref()
                .is_some_and(|(h, _)| self.dirs.lock().is_marked(h.key()))
        };
        match (ours(&ev.old), ours(&ev.new)) {
            (false, true) => {
                self.stats.moved_in.fetch_add(1, Ordering::Relaxed);
                if ev.on_dir() {
                    self.adopt_dir(ctx, target, Adopt::MovedIn);
                } else if let Some(f) = open_regular(ctx.root, target) {
                    self.give_flags(ctx, &f);
                    if self.follow(f.as_fd()) {
                        ctx.resident.demand(target.key(), &f);
                    }
                }
            }
            (true, false) => {
                self.stats.moved_out.fetch_add(1, Ordering::Relaxed);
                if ev.on_dir() {
                    self.abandon_dir(ctx, target);
                } else {
                    self.changed.lock().remove(target.key());
                    self.unfollow(ctx, target);
                    ctx.resident.forget(target.key());
                }
            }
            (true, true) => {
                // Within the tree. What a muted directory left unheard and its rescan can
                // no longer find (it moved) is taken here; a known file or directory needs
                // nothing.
                if ev.on_dir() {
                    let known = self.dirs.lock().knows(target.key());
                    if !known {
                        self.dir_made(ctx, target);
                    }
                } else if !ctx.resident.is_known(target.key()) {
                    self.note_changed(ctx, target);
                }
            }
            (false, false) => {}
        }
    }

    /// `sync` by flags: gives a file its flag if it lacks it (counted as a repair).
    fn give_flags(&self, ctx: &Ctx<'_>, f: &File) {
        if let Some(stats) = ctx.flags {
            match flags::ensure(f.as_fd(), false) {
                Ok(true) => {
                    stats.repaired.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {}
                Err(_) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// A directory made in (after `dir_made`'s delay), or moved into, the tree: flags (by
    /// flags), a mark on it and on every directory below, and its files to the warm-up: at
    /// once for a directory moved in (its data is old and may be wanted now), through the
    /// changed files' delay for one made here (an extraction or a build may still be
    /// writing its files; pinning each as it appears would cost the writer a map, a lock
    /// and a read per file on the same CPUs, and its close would ask for the pin again).
    fn adopt_dir(&self, ctx: &Ctx<'_>, target: &Handle, how: Adopt) {
        let Ok(fd) = target.open(ctx.root, libc::O_RDONLY | libc::O_DIRECTORY) else {
            return;
        };
        let Some(rel) = rel_path(ctx.dir, fd.as_fd()) else {
            return;
        };
        let repaired_before = ctx.flags.map(|s| FlagStats::get(&s.set));
        let resident = ctx.resident;
        let walked = |dir: BorrowedFd<'_>, e: &tree::Entry<'_>| {
            if e.kind != Kind::File {
                return;
            }
            let Ok(h) = Handle::of(dir, Some(e.name)) else {
                return;
            };
            match how {
                Adopt::MovedIn => {
                    if self.follow_at(dir, e.name) {
                        resident.submit_walked(
                            dhrd_pagecache::resident::FileRef {
                                key: h.key(),
                                path: e.rel.clone(),
                            },
                            e.size,
                        );
                    }
                }
                Adopt::Made => self.note_changed(ctx, &h),
            }
        };
        match ctx.flags {
            Some(stats) => {
                flags::set_tree(ctx.root, &rel, stats, &|| false, |d, _| self.add_dir(d));
                // Files again for the warm-up (the flag walk does not hand them in).
                tree::walk(
                    ctx.root,
                    &rel,
                    (),
                    &|| false,
                    |_, _, _| {},
                    |d, _, e| {
                        walked(d, e);
                        (e.kind == Kind::Dir).then_some(())
                    },
                );
            }
            None => {
                tree::walk(
                    ctx.root,
                    &rel,
                    (),
                    &|| false,
                    |d, _, _| self.add_dir(d),
                    |d, _, e| {
                        walked(d, e);
                        (e.kind == Kind::Dir).then_some(())
                    },
                );
            }
        }
        if let (Some(s), Some(before)) = (ctx.flags, repaired_before) {
            let set = FlagStats::get(&s.set) - before;
            s.repaired.fetch_add(set, Ordering::Relaxed);
        }
    }

    /// A directory moved out of the tree: its marks go, its files are forgotten (their
    /// flags stay: more durable, never less).
    fn abandon_dir(&self, ctx: &Ctx<'_>, target: &Handle) {
        let Ok(fd) = target.open(ctx.root, libc::O_RDONLY | libc::O_DIRECTORY) else {
            return;
        };
        let all = self.mask();
        tree::walk(
            fd.as_fd(),
            Path::new(""),
            (),
            &|| false,
            |d, _, _| {
                if let Ok(h) = Handle::of(d, None) {
                    self.dirs.lock().unmark(h.key());
                }
                let _ = self.group.remove(MarkOn::Inode, d, all);
            },
            |d, _, e| match e.kind {
                Kind::Dir => Some(()),
                Kind::File => {
                    if let Ok(h) = Handle::of(d, Some(e.name)) {
                        self.changed.lock().remove(h.key());
                        let _ = self.group.remove_at(d, e.name, FILE_MASK);
                        ctx.resident.forget(h.key());
                    }
                    None
                }
                Kind::Other => None,
            },
        );
    }
}

/// Opens the regular file a handle names, read-only; None for anything else (a FIFO or a
/// device is never opened for reading: opening some devices does things).
pub fn open_regular(root: BorrowedFd<'_>, h: &Handle) -> Option<File> {
    let path_fd: OwnedFd = h.open(root, libc::O_PATH).ok()?;
    let st = rustix::fs::fstat(&path_fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let fd = dhrd_pagecache::sys::open_noatime(|noatime| {
        h.open(root, libc::O_RDONLY | libc::O_NONBLOCK | noatime)
    })
    .ok()?;
    Some(File::from(fd))
}

/// The path of an open directory relative to the attached directory, if it is inside.
fn rel_path(dir: &Path, fd: BorrowedFd<'_>) -> Option<PathBuf> {
    let abs = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        fd.as_raw_fd()
    }))
    .ok()?;
    abs.strip_prefix(dir).ok().map(Path::to_path_buf)
}
