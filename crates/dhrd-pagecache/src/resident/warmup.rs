//! The warm-up threads: each takes a segment of a file being warmed, or starts the next
//! file (due refreshed files, then demanded ones, then walked ones), and reads it into the
//! page cache; the thread that finishes a file's last segment pins it (`finish.rs`).
//!
//! Invariants:
//! - A file is read within its reservation: the whole file if the [`RamBudget`] allows,
//!   else the page-aligned prefix it allows (SPEC I11, counted as over budget).
//! - The warm-up reads through descriptions opened with O_NOATIME where the daemon may
//!   (walked files by the [`Opener`], demanded ones by `demanded_description`): warming
//!   leaves files' access times as applications left them.
//! - A segment whose pages are all cached already is not read (cachestat): a restart finds
//!   its data cached, and reading it again would only copy it.
//! - This module only ever reads files; warming never changes what a reader sees, since the
//!   page cache is the one copy every reader and writer goes through (D3 by construction).
//!   Writes racing a warm-up are the page cache's business: a warm-up read sees old or new
//!   bytes and throws them away.
//!
//! Crash semantics: none; what was read stays in the page cache after the process dies.
//!
//! [`RamBudget`]: dhrd_io::RamBudget
//! [`Opener`]: super::Opener

use super::config::{
    Folios, RESIDENT_NICE, WARM_POPULATE_BYTES, WARM_READ_BYTES, WARM_SEGMENT_BYTES,
};
use super::finish::finish_file;
use super::populate::{Mapped, Populated};
use super::state::{check_complete, page_ceil, page_floor, Entry, Inner, Job, Queues, Warming};
use dhrd_io::PAGE_BYTES;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A unit of work a thread took: a segment of a file being warmed.
pub(super) struct Segment {
    pub(super) key: u64,
    pub(super) file: Arc<File>,
    pub(super) offset: u64,
    pub(super) len: u64,
}

pub(super) fn worker(inner: &Arc<Inner>) {
    set_nice(RESIDENT_NICE);
    let mut buf = vec![0u8; WARM_READ_BYTES];
    loop {
        let seg = {
            let mut q = inner.q.lock();
            loop {
                if q.shutdown {
                    return;
                }
                if let Some(s) = next_segment(&mut q) {
                    break s;
                }
                // Start the next file: demanded ones first. Opening and sizing happen
                // outside the lock.
                let now = Instant::now();
                let due = q.deferred.front().is_some_and(|(t, _)| *t <= now);
                let job = if due {
                    q.deferred.pop_front().map(|(_, j)| j)
                } else {
                    q.demand.pop_front().or_else(|| q.walked.pop_front())
                };
                match job {
                    Some(job) => {
                        q.starting += 1;
                        inner.state.notify_all(); // room for the walk
                        drop(q);
                        start_file(inner, job);
                        q = inner.q.lock();
                        q.starting -= 1;
                    }
                    None => {
                        check_complete(inner, &mut q);
                        match q.deferred.front().map(|(t, _)| *t) {
                            Some(t) if !q.timer => {
                                q.timer = true;
                                inner.work.wait_until(&mut q, t);
                                q.timer = false;
                            }
                            _ => inner.work.wait(&mut q),
                        }
                    }
                }
            }
        };
        let ok = warm_range(inner, &seg.file, seg.offset, seg.len, &mut buf);
        let mut q = inner.q.lock();
        let Some(w) = q
            .warming
            .iter_mut()
            .find(|w| w.key == seg.key && Arc::ptr_eq(&w.file, &seg.file))
        else {
            continue;
        };
        w.running -= 1;
        if !ok {
            w.failed = true;
        }
        if w.running == 0 && w.next >= w.len {
            let pos = q
                .warming
                .iter()
                .position(|w| w.key == seg.key && Arc::ptr_eq(&w.file, &seg.file));
            if let Some(pos) = pos {
                let w = q.warming.swap_remove(pos);
                q.finishing += 1;
                drop(q);
                finish_file(inner, w);
                let mut q = inner.q.lock();
                q.finishing -= 1;
                check_complete(inner, &mut q);
            }
        }
    }
}

/// Hands out the next segment of a file being warmed, if any.
pub(super) fn next_segment(q: &mut Queues) -> Option<Segment> {
    for w in q.warming.iter_mut() {
        if w.next < w.len {
            let len = (w.len - w.next).min(WARM_SEGMENT_BYTES);
            let s = Segment {
                key: w.key,
                file: w.file.clone(),
                offset: w.next,
                len,
            };
            w.next += len;
            w.running += 1;
            return Some(s);
        }
    }
    None
}

/// Opens (walked files), sizes and reserves a file, then queues its segments.
pub(super) fn start_file(inner: &Inner, job: Job) {
    let (key, demanded, file) = match job {
        Job::Demand { key, file } => (key, true, Ok(file)),
        Job::Walked { f } => (f.key, false, inner.opener.open(&f)),
    };
    let Ok((file, size)) = file.and_then(|f| f.metadata().map(|m| (f, m.len()))) else {
        start_failed(inner, key);
        return;
    };
    let got = reserve(inner, size);
    // A description of the warm-up's own where there is something to read (a new file is
    // demanded empty, and most of a file server's die so).
    let file = if demanded && got > 0 {
        match demanded_description(inner, file) {
            Ok(f) => f,
            Err(_) => {
                inner.budget.release(got);
                start_failed(inner, key);
                return;
            }
        }
    } else {
        file
    };
    if inner.cfg.folios == Folios::Order0 && got > 0 {
        advise_order0(&file);
    }
    let mut q = inner.q.lock();
    if !matches!(q.entries.get(&key), Some(Entry::Busy)) || q.shutdown {
        // Forgotten meanwhile.
        drop(q);
        inner.budget.release(got);
        return;
    }
    if got == 0 {
        // Nothing held, so nothing stale: a later refresh finds it done.
        q.entries.insert(key, Entry::NOTHING_HELD);
        let changed = q.changed.remove(&key);
        drop(q);
        inner.dispose(changed);
        return;
    }
    q.warming.push(Warming {
        key,
        file: Arc::new(file),
        len: got,
        next: 0,
        running: 0,
        failed: false,
    });
    drop(q);
    if got > WARM_SEGMENT_BYTES {
        // More than this thread's first segment: idle threads share the file.
        inner.work.notify_all();
    }
}

/// A file that could not be opened or sized: forgotten (its next open or write hands it
/// in again) and counted.
fn start_failed(inner: &Inner, key: u64) {
    inner.files_failed.fetch_add(1, Ordering::Relaxed);
    let mut q = inner.q.lock();
    q.entries.remove(&key);
    let changed = q.changed.remove(&key);
    drop(q);
    inner.dispose(changed);
}

/// Reserves a file of `size` bytes in the budget: the whole file if the budget allows,
/// else the page-aligned prefix it allows (I11, counted as over budget). Returns the
/// bytes reserved.
fn reserve(inner: &Inner, size: u64) -> u64 {
    let want = page_ceil(size);
    let mut got = want;
    while got > 0 && !inner.budget.try_reserve(got) {
        let left = inner
            .budget
            .limit_bytes()
            .saturating_sub(inner.budget.used_bytes());
        got = page_floor(left.min(got.saturating_sub(PAGE_BYTES)));
    }
    if got < want {
        inner.files_over_budget.fetch_add(1, Ordering::Relaxed);
        inner
            .bytes_over_budget
            .fetch_add(want - got, Ordering::Relaxed);
    }
    got
}

/// Brings `len` bytes from `offset` into the page cache: nothing to do where every page is
/// cached already; else through a mapping (`populate.rs`) where the kernel's large folios
/// are wanted and the range is more than one of them, else by reading (and throwing the
/// bytes away). False on an I/O error or at shutdown.
pub(super) fn warm_range(
    inner: &Inner,
    file: &File,
    offset: u64,
    len: u64,
    buf: &mut [u8],
) -> bool {
    if cached_whole(file, offset, len) {
        inner.bytes_warmed.fetch_add(len, Ordering::Relaxed);
        return true;
    }
    if inner.cfg.folios == Folios::Large && len > WARM_POPULATE_BYTES {
        if let Ok(mapped) = Mapped::new(file, offset, len) {
            return populate_range(inner, file, &mapped, len);
        }
    }
    read_range(inner, file, offset, len, buf)
}

/// Whether every page of the range (page-aligned: a segment of a reservation) is cached,
/// by cachestat(2). Then reading it would only copy it out to throw it away: a re-attach
/// or remount after the daemon restarted finds all its data cached (the page cache is the
/// kernel's), and a file an application just wrote is cached whole. False where only
/// mincore could tell (kernels before 6.5: mapping the range to ask would cost what the
/// read's populating costs) and on any error, which leaves the read to find out.
fn cached_whole(file: &File, offset: u64, len: u64) -> bool {
    debug_assert!(
        offset.is_multiple_of(PAGE_BYTES) && len.is_multiple_of(PAGE_BYTES),
        "{offset} {len}"
    );
    crate::sys::cachestat_exact(file.as_fd(), offset, len).is_ok_and(|c| c.cached_bytes() == len)
}

fn populate_range(inner: &Inner, file: &File, mapped: &Mapped, len: u64) -> bool {
    let mut at = 0;
    while at < len {
        let n = (len - at).min(WARM_POPULATE_BYTES);
        throttle(inner, n);
        // `at` and `n` are below `len`, which the mapping's usize length holds.
        match mapped.populate(file, at as usize, n as usize) {
            Ok(Populated::Done) => {
                at += n;
                inner.bytes_warmed.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Populated::PastEnd) => break, // shrank meanwhile
            Err(_) => return false,
        }
        if inner.q.lock().shutdown {
            return false;
        }
    }
    true
}

fn read_range(inner: &Inner, file: &File, offset: u64, len: u64, buf: &mut [u8]) -> bool {
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = ((end - at) as usize).min(buf.len());
        throttle(inner, n as u64);
        match file.read_at(&mut buf[..n], at) {
            Ok(0) => break, // shrank meanwhile
            Ok(got) => {
                at += got as u64;
                inner.bytes_warmed.fetch_add(got as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
        if inner.q.lock().shutdown {
            return false;
        }
    }
    true
}

/// A demanded file comes as a duplicate of its caller's descriptor, which shares the
/// caller's open file description. The warm-up reads through a description of its own,
/// opened with O_NOATIME (through /proc/self/fd, which reaches a file whose last name is
/// gone too), unless the caller's already has the flag and large folios are wanted:
/// - reads and the pin's `mmap` through the caller's description would set the file's
///   access time, which the application did not do (`sys::open_noatime`);
/// - order-0 reads must leave the caller's read-ahead alone (`advise_order0` advises the
///   description it is given).
fn demanded_description(inner: &Inner, file: File) -> io::Result<File> {
    if inner.cfg.folios == Folios::Large && crate::sys::reads_keep_atime(file.as_fd())? {
        return Ok(file);
    }
    crate::sys::reopen_noatime(&file)
}

/// Makes the reads through `file`'s own open file description leave order-0 pages
/// ([`Folios::Order0`]); other opens of the file keep their read-ahead.
fn advise_order0(file: &File) {
    // SAFETY: advice on a descriptor we hold open; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    // Fails only for a descriptor that is not an open regular file (EBADF, ESPIPE) or an
    // unknown advice (EINVAL): none can happen for a file the warm-up just opened.
    debug_assert_eq!(rc, 0, "posix_fadvise(POSIX_FADV_RANDOM) of a warmed file");
}

/// Waits as long as the configured rate requires before reading `bytes`.
pub(super) fn throttle(inner: &Inner, bytes: u64) {
    let Some(rate) = inner.cfg.rate_bytes_per_s.filter(|r| *r > 0) else {
        return;
    };
    let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
    let wait_until = {
        let mut next = inner.rate_next_free.lock();
        let now = Instant::now();
        let start = (*next).max(now);
        *next = start + cost;
        start
    };
    let now = Instant::now();
    if wait_until > now {
        std::thread::sleep(wait_until - now);
    }
}

pub(super) fn set_nice(nice: i32) {
    // SAFETY: setpriority on this thread's own id; failure only leaves the default nice.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
}
