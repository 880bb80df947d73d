//! What a writable open knows of its hold on the image, and when RAM may serve reads.
//!
//! RAM may serve a read only while no other client can have changed the image. That ends
//! for good (it is never regained: a blocklisted client cannot write again, and what
//! another owner wrote meanwhile is unknown) when:
//! - a request returns ESHUTDOWN (EBLOCKLISTED: another client broke the lock), or a write
//!   returns EROFS (librbd lost the lock);
//! - the lock is seen with another owner, or none, by the keeper thread, which asks the
//!   OSD every [`LOCK_CHECK_INTERVAL`] (or a quarter of the lease) whether this client
//!   still owns it;
//! - the image is found smaller than this process made it (another client shrank it,
//!   `rbd resize --allow-shrink`, which the lock owner carries out for it): RAM past the
//!   new end holds bytes the image no longer has.
//!
//! With a read lease of `period`, reads also stop once the last confirmation of the lock
//! is older than `period`. A confirmation counts from when its request was sent, not from
//! when the reply arrived, and time is CLOCK_BOOTTIME, which goes on while the machine or
//! VM is suspended (CLOCK_MONOTONIC stops, which would stretch a lease over a pause).
//! Another client may break the lock only after this client's watch expired on the OSD,
//! `osd_client_watch_timeout` after the OSD last heard a ping of it; librados pings every
//! `objecter_tick_interval`. A lock confirmed at T therefore stays ours until at least
//! T + watch timeout - ping interval, and the lease must be shorter than that by a margin
//! ([`lease_bound`]), else another client may write while this one still serves RAM.
//!
//! Without a lease the window is open between the loss and the moment this process learns
//! of it (its next request, or the keeper's next check): reads of RAM in that window may
//! return bytes older than the other client's writes.
//!
//! Crash semantics: none; the hold lives in memory and dies with the process, whose
//! lock the cluster frees once its watch expires.

use crate::ffi::{self, ImageT};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How often the keeper confirms the lock without a lease.
pub(crate) const LOCK_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest interval between two confirmations of a read lease.
pub(crate) const LEASE_CHECK_MIN: Duration = Duration::from_millis(100);
/// Least margin a lease keeps below what the watch timeout allows (clock drift between
/// this host and the OSD, scheduling delays).
pub(crate) const LEASE_MARGIN_MIN: Duration = Duration::from_secs(1);

/// Nanoseconds of CLOCK_BOOTTIME.
pub(crate) fn boottime_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_BOOTTIME)");
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// The longest sound lease for a watch timeout and ping interval: the timeout less one
/// ping interval less a margin (a tenth of the timeout, at least [`LEASE_MARGIN_MIN`]).
pub fn lease_bound(watch_timeout: Duration, ping_interval: Duration) -> Duration {
    let margin = (watch_timeout / 10).max(LEASE_MARGIN_MIN);
    watch_timeout
        .saturating_sub(ping_interval)
        .saturating_sub(margin)
}

/// The hold of one writable open (see the module header).
pub(crate) struct Hold {
    /// The read lease, if one was asked for.
    pub lease: Option<Duration>,
    /// This client as the lock's owner (the address librbd reports).
    pub me: String,
    /// CLOCK_BOOTTIME when the request of the last confirmation was sent.
    confirmed_sent_ns: AtomicU64,
    /// Why RAM may no longer serve reads, set once.
    lost: OnceLock<String>,
    /// The keeper stops (the backing closes or released its lock).
    pub stop: AtomicBool,
}

impl Hold {
    /// A hold whose lock was just taken (the open's lock request counts as confirmation).
    pub fn new(lease: Option<Duration>, me: String, taken_at_ns: u64) -> Hold {
        Hold {
            lease,
            me,
            confirmed_sent_ns: AtomicU64::new(taken_at_ns),
            lost: OnceLock::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// The lock was confirmed by a request sent at `sent_ns`.
    pub fn confirm(&self, sent_ns: u64) {
        self.confirmed_sent_ns.fetch_max(sent_ns, Ordering::AcqRel);
    }

    /// RAM may no longer serve reads, for good; the first reason is kept and logged.
    pub fn lose(&self, name: &str, why: String) {
        if self.lost.set(why.clone()).is_ok() {
            eprintln!("dhrd-rbd: {name}: {why}; reads from RAM refused from now on");
        }
    }

    /// This open gave the lock up itself (a clean close of a cache over it): reads of RAM
    /// stop, quietly.
    pub fn release(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self
            .lost
            .set(String::from("the image's lock was released at close"));
    }

    pub fn is_lost(&self) -> bool {
        self.lost.get().is_some()
    }

    /// Whether RAM may serve reads at boottime `now_ns`.
    pub fn check_at(&self, now_ns: u64) -> io::Result<()> {
        if let Some(why) = self.lost.get() {
            return Err(io::Error::other(format!("{why}: RAM may be stale")));
        }
        let Some(period) = self.lease else {
            return Ok(());
        };
        let since = now_ns.saturating_sub(self.confirmed_sent_ns.load(Ordering::Acquire));
        if Duration::from_nanos(since) > period {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "could not confirm the image's exclusive lock within the read lease",
            ));
        }
        Ok(())
    }

    pub fn check(&self) -> io::Result<()> {
        self.check_at(boottime_ns())
    }

    /// How often the keeper asks.
    pub fn interval(&self) -> Duration {
        match self.lease {
            Some(p) => (p / 4).clamp(LEASE_CHECK_MIN, LOCK_CHECK_INTERVAL),
            None => LOCK_CHECK_INTERVAL,
        }
    }
}

/// Whether a librbd result on a writable open means the lock is gone: ESHUTDOWN is
/// EBLOCKLISTED (another client broke the lock); EROFS from a write means librbd no longer
/// holds the lock and may not take it back.
pub(crate) fn means_lock_lost(errno: i32, is_write: bool) -> bool {
    errno == libc::ESHUTDOWN || (is_write && errno == libc::EROFS)
}

/// The image's size as librbd knows it now.
pub(crate) fn image_size(lib: &ffi::Lib, image: ImageT) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: an open image; out-pointer.
    let r = unsafe { (lib.rbd_get_size)(image, &mut size) };
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_counts_from_its_send_time() {
        let s = 1_000_000_000u64;
        let h = Hold::new(Some(Duration::from_secs(2)), "me".into(), 0);
        // Sent at 10 s, answered much later: the lease runs from 10 s.
        h.confirm(10 * s);
        assert!(h.check_at(12 * s).is_ok());
        assert!(h.check_at(12 * s + 1).is_err());
        // An older confirmation arriving late never moves the lease back.
        h.confirm(5 * s);
        assert!(h.check_at(12 * s).is_ok());
    }

    #[test]
    fn a_lost_lock_is_lost_for_good_lease_or_not() {
        let h = Hold::new(None, "me".into(), 0);
        assert!(h.check_at(u64::MAX).is_ok(), "no lease: no expiry");
        h.lose("img", "blocklisted".into());
        h.confirm(1);
        assert!(h.check_at(1).is_err());
        assert!(means_lock_lost(libc::ESHUTDOWN, false));
        assert!(means_lock_lost(libc::EROFS, true));
        assert!(!means_lock_lost(libc::EROFS, false));
    }

    #[test]
    fn the_lease_bound_leaves_a_ping_and_a_margin() {
        let b = lease_bound(Duration::from_secs(30), Duration::from_secs(5));
        assert_eq!(b, Duration::from_secs(22));
        let b = lease_bound(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(b, Duration::from_secs(3));
        assert_eq!(
            lease_bound(Duration::from_secs(1), Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    #[test]
    fn boottime_advances() {
        let a = boottime_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(boottime_ns() > a);
    }
}
