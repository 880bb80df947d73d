//! What the two fast-device layers (`writeback.rs`, `tiered/`) share: the header
//! checksum, formatting a device, the fixed-size rule, and the background write-back
//! loop with its drain.
//!
//! Invariants: a device is formatted by truncating it, sizing it, syncing, then writing
//! and syncing the header, so a crash in between leaves no header and the next open
//! formats again. The write-back loop holds no lock while it works on a unit, retries a
//! failed unit with doubling back-off, and can always be stopped within one wait; a panic
//! while it works fails the layer for good (never a write-back thread gone unnoticed).
//!
//! Crash semantics: none of its own; the callers' modules state theirs.

use dhrd_io::Durable;
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Back-off after a failed write-back, doubling up to the maximum.
const RETRY_BASE: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long an idle write-back thread sleeps before it looks again (it is also woken).
const IDLE_WAIT: Duration = Duration::from_millis(500);

pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// FNV-1a: detects a torn or foreign header or table entry.
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The message of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        return (*s).to_string();
    }
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| "no message".into())
}

/// Formats `dev` to `dev_bytes` of zeros with `header` (padded to `header_bytes`) at 0.
pub(crate) fn format<F: Durable>(
    dev: &F,
    mut header: Vec<u8>,
    header_bytes: u64,
    dev_bytes: u64,
) -> io::Result<()> {
    dev.set_len(0)?;
    dev.set_len(dev_bytes)?;
    dev.sync()?;
    header.resize(header_bytes as usize, 0);
    dev.write_at(&header, 0)?;
    dev.sync()
}

/// Fills `buf` from `dev` at `offset`; bytes past the device's end read as zero (the last
/// chunk of a device need not be whole).
pub(crate) fn read_padded<F: Durable + ?Sized>(
    dev: &F,
    buf: &mut [u8],
    offset: u64,
) -> io::Result<()> {
    let n = dhrd_io::read_full(dev, buf, offset)?;
    buf[n..].fill(0);
    Ok(())
}

/// `set_len` of a device whose size is its backing's: only the same size is accepted.
pub(crate) fn fixed_size(len: u64, size: u64, msg: &'static str) -> io::Result<()> {
    if len == size {
        return Ok(());
    }
    Err(io::Error::new(io::ErrorKind::Unsupported, msg))
}

/// A fast device's sticky failure (SPEC C4) and the lock that runs its syncs one at a
/// time. A failed sync may drop any write made before it, another thread's too, and that
/// thread's own later sync of the same descriptor would not report it (the kernel reports
/// a write-back error once per open file). So once a write or sync of the device failed,
/// every later sync fails too, and syncs never overlap: a sync that returns Ok vouches for
/// every write made before it.
///
/// Group commit: callers that wait while a sync runs share the next one. A caller's writes
/// were made before it asked, so any sync that began after it asked covers them; when the
/// caller gets the lock and such a sync has already succeeded, it returns without one of
/// its own. (Concurrent writers of the tier otherwise queued one device flush each behind
/// the lock.)
pub(crate) struct StickyFailure {
    failed: AtomicBool,
    /// Held while a sync runs.
    sync_lock: Mutex<()>,
    /// The number of the last sync begun (syncs are numbered from 1 as they begin).
    begun: AtomicU64,
    /// The number of the last sync that succeeded.
    synced: AtomicU64,
    /// What `check` says once failed.
    why: &'static str,
    /// What `check` says instead, when the failure was not the device's (a panic of the
    /// write-back).
    cause: OnceLock<String>,
}

impl StickyFailure {
    pub(crate) fn new(why: &'static str) -> Self {
        Self {
            failed: AtomicBool::new(false),
            sync_lock: Mutex::new(()),
            begun: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            why,
            cause: OnceLock::new(),
        }
    }

    /// Fails for good for a reason other than the device's (the first reason given stays).
    pub(crate) fn fail_because(&self, cause: String) {
        let _ = self.cause.set(cause);
        self.failed.store(true, Ordering::Release);
    }

    /// Why it failed, once it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.is_failed()
            .then(|| self.cause.get().cloned().unwrap_or_else(|| self.why.into()))
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records the outcome of a write to the device: a failure is sticky.
    pub(crate) fn write(&self, r: io::Result<()>) -> io::Result<()> {
        r.inspect_err(|_| self.failed.store(true, Ordering::Release))
    }

    /// Makes every write made before this call durable: with a sync of `dev` of its own, or
    /// with one that began after the call and succeeded (group commit). One sync at a time;
    /// refuses once any write or sync of the device failed.
    pub(crate) fn sync<F: Durable>(&self, dev: &F) -> io::Result<()> {
        // Syncs numbered above this one begin after this call, so after its writes.
        let begun_before = self.begun.load(Ordering::SeqCst);
        let _g = self.sync_lock.lock();
        self.check()?;
        if self.synced.load(Ordering::SeqCst) > begun_before {
            return Ok(());
        }
        let number = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        dev.sync()
            .inspect_err(|_| self.failed.store(true, Ordering::Release))?;
        self.synced.store(number, Ordering::SeqCst);
        Ok(())
    }

    /// A number for the writes made before this call: once [`Self::covered`] says so for
    /// it, a sync that began after them succeeded.
    pub(crate) fn ticket(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether a sync numbered above `ticket` (so begun after the ticket was taken)
    /// succeeded.
    pub(crate) fn covered(&self, ticket: u64) -> bool {
        self.synced.load(Ordering::SeqCst) > ticket
    }

    /// Err once the device failed.
    pub(crate) fn check(&self) -> io::Result<()> {
        if let Some(why) = self.failure() {
            return Err(io::Error::other(why));
        }
        Ok(())
    }
}

/// The shared parts of a layer with background write-back.
pub(crate) struct Background<'a, S> {
    pub state: &'a Mutex<S>,
    pub cv: &'a Condvar,
    pub stop: &'a AtomicBool,
    pub failures: &'a AtomicU64,
    /// The layer's sticky failure: a panic of `work` sets it, and `drain` gives up once it
    /// is set (nothing is written back after it).
    pub failed: &'a StickyFailure,
}

impl<S> Background<'_, S> {
    /// Runs until `stop`: `pick` claims a unit under the state lock, `work` writes it back
    /// with no lock held, `release` gives the claim back under the lock.
    pub(crate) fn run(
        &self,
        mut pick: impl FnMut(&mut S) -> Option<usize>,
        work: impl Fn(usize) -> io::Result<()>,
        release: impl Fn(&mut S, usize),
    ) {
        let mut backoff = RETRY_BASE;
        loop {
            let unit = {
                let mut st = self.state.lock();
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(u) = pick(&mut st) {
                        break u;
                    }
                    self.cv.wait_for(&mut st, IDLE_WAIT);
                }
            };
            // A panic here is a broken invariant (or a device that panics). Caught, so that it
            // cannot stop the write-back unnoticed: the layer fails for good, as after a
            // device failure (writes refused, reads go on), with the panic as the cause, and
            // the dirty units stay where they are for the next open.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(unit)));
            release(&mut self.state.lock(), unit);
            let r = match r {
                Ok(r) => r,
                Err(payload) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    self.failed.fail_because(format!(
                        "the write-back stopped on a panic ({}): writes are refused, and the \
                         dirty data on the fast device is written back when it is opened again",
                        panic_text(payload.as_ref())
                    ));
                    self.cv.notify_all();
                    return;
                }
            };
            self.cv.notify_all();
            match r {
                Ok(()) => backoff = RETRY_BASE,
                Err(_) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    // Interruptible: dropping the device must not wait out a back-off.
                    let mut st = self.state.lock();
                    if !self.stop.load(Ordering::Acquire) {
                        self.cv.wait_for(&mut st, backoff);
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Waits until `dirty` says nothing is left (or `timeout` passes); true when clean.
    pub(crate) fn drain(&self, timeout: Duration, dirty: impl Fn(&S) -> u64) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        while dirty(&st) > 0 {
            if self.failed.is_failed() {
                return false; // nothing is written back any more
            }
            self.cv.notify_all();
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return dirty(&st) == 0;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A device whose syncs wait for a permit, so a test decides when each one ends.
    #[derive(Default)]
    struct Gated {
        syncs: AtomicU64,
        permits: Mutex<u64>,
        cv: Condvar,
    }

    impl Gated {
        fn permit(&self) {
            *self.permits.lock() += 1;
            self.cv.notify_all();
        }
        /// Waits until `n` syncs began; panics if they do not within a minute (a hang guard,
        /// not a timing assertion).
        fn wait_syncs(&self, n: u64) {
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.syncs.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "sync {n} never began");
                std::thread::yield_now();
            }
        }
    }

    impl Durable for Gated {
        fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
            Ok(0)
        }
        fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            self.syncs.fetch_add(1, Ordering::SeqCst);
            let mut p = self.permits.lock();
            while *p == 0 {
                self.cv.wait(&mut p);
            }
            *p -= 1;
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(0)
        }
        fn set_len(&self, _len: u64) -> io::Result<()> {
            Ok(())
        }
    }

    /// Two callers that arrive while a sync runs share the next sync; neither returns
    /// before a sync that began after it asked.
    #[test]
    fn callers_waiting_during_a_sync_share_the_next() -> io::Result<()> {
        let joined = |h: std::thread::JoinHandle<io::Result<()>>| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("a syncing thread panicked")))
        };
        let dev = Arc::new(Gated::default());
        let f = Arc::new(StickyFailure::new("failed"));
        let spawn = |dev: &Arc<Gated>, f: &Arc<StickyFailure>| {
            let (dev, f) = (dev.clone(), f.clone());
            std::thread::spawn(move || f.sync(&*dev))
        };
        let first = spawn(&dev, &f);
        dev.wait_syncs(1);
        let waiters = [spawn(&dev, &f), spawn(&dev, &f)];
        // Time for both to note that the running sync began before they asked (not a
        // timing assertion: a late waiter would only make a sync of its own).
        std::thread::sleep(Duration::from_millis(200));
        dev.permit();
        joined(first)?;
        dev.wait_syncs(2);
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "returned before a later sync"
        );
        // Enough permits for a sync each, so that a waiter that did not share cannot hang.
        dev.permit();
        dev.permit();
        for w in waiters {
            joined(w)?;
        }
        assert_eq!(dev.syncs.load(Ordering::SeqCst), 2);
        // Once a sync failed, nobody is told a later one covered them.
        f.failed.store(true, Ordering::SeqCst);
        assert!(f.sync(&*dev).is_err());
        Ok(())
    }
}
