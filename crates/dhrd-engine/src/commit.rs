//! Group commit and sticky failure.
//!
//! A writer first `pwrite`s its data, then takes a ticket (`issue`): the ticket proves the
//! bytes were handed to the backing before any sync that starts later. `wait_durable(t)`
//! returns once a sync that started after ticket `t` was issued has succeeded. At most one
//! sync runs at a time; writers arriving meanwhile wait and are covered together by the
//! next one, so N concurrent writers cost about one sync per round instead of N.
//!
//! Failure rules (C4, C5):
//! - a sync failing with anything but ENOSPC makes the object read-only for good
//!   (`Failure`); no later sync is attempted, so a failed fsync is never retried and
//!   mistaken for success;
//! - a sync failing with ENOSPC is sticky as well, but the requests it covered report
//!   ENOSPC itself. A full disk normally shows at `pwrite` (C5, handled per request by
//!   the object); at sync time it means the kernel could not write back pages it already
//!   accepted, and may have dropped them: a later successful sync would not bring them
//!   back, and the bytes could revert once the page cache lets them go.

use crate::error::{is_enospc, BackingOp, Error, FailureCause, Result};
use crate::stats::{Lat, Stats, C};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How many failed (ENOSPC) batches are remembered for slow waiters.
const FAILED_BATCHES_KEPT: usize = 64;
/// Longest a sync leader waits for the writers of recent batches to rejoin before it
/// syncs. Without it, the first writer back after a sync starts the next one alone and
/// batches stay small; with one writer the wait never happens (batches are 1).
const COMMIT_GATHER_MAX: Duration = Duration::from_micros(200);

/// The sticky read-only state of an object.
#[derive(Default)]
pub(crate) struct Failure {
    failed: AtomicBool,
    cause: Mutex<Option<FailureCause>>,
}

impl Failure {
    #[inline]
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(crate) fn check(&self) -> Result<()> {
        if !self.is_failed() {
            return Ok(());
        }
        // `fail` stores the cause before it raises the flag (Release, read with Acquire).
        let Some(cause) = self.cause() else {
            unreachable!("a sticky failure without its cause");
        };
        Err(Error::ReadOnly(cause))
    }

    /// Records the first failure; later ones keep the original cause.
    pub(crate) fn fail(&self, op: BackingOp, e: &io::Error) {
        let mut c = self.cause.lock();
        if c.is_none() {
            *c = Some(FailureCause {
                op,
                errno: e.raw_os_error(),
                message: e.to_string(),
                at: SystemTime::now(),
            });
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(crate) fn cause(&self) -> Option<FailureCause> {
        self.cause.lock().clone()
    }
}

/// A write's place in the commit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

#[derive(Default)]
struct State {
    issued: u64,
    synced: u64,
    syncing: bool,
    /// A leader is waiting for writers to join its batch; `issue` wakes it.
    gathering: bool,
    /// Decaying high-water mark of batch sizes, in sixteenths of a write: how many writers
    /// are around to wait for. "As many as last time" would lock in small batches.
    batch_hw_x16: u64,
    sync_ns_avg: u64,
    /// `(after, through]` ticket ranges whose sync failed with ENOSPC.
    failed_batches: Vec<(u64, u64)>,
    /// A sync failed: none may start again (C4), whatever `Failure` says meanwhile.
    sync_failed: bool,
}

#[derive(Default)]
pub(crate) struct GroupCommit {
    m: Mutex<State>,
    /// Sync waiters; woken when a sync finishes.
    cv: Condvar,
    /// The gathering leader alone; woken by each new ticket (waking every waiter per
    /// ticket would only churn the CPU).
    gather_cv: Condvar,
}

impl GroupCommit {
    pub(crate) fn issue(&self) -> Ticket {
        let mut g = self.m.lock();
        g.issued += 1;
        if g.gathering {
            self.gather_cv.notify_one();
        }
        Ticket(g.issued)
    }

    /// The newest ticket issued so far (what a flush must cover).
    pub(crate) fn current(&self) -> Ticket {
        Ticket(self.m.lock().issued)
    }

    pub(crate) fn is_clean(&self) -> bool {
        let g = self.m.lock();
        g.synced >= g.issued
    }

    pub(crate) fn wait_durable(
        &self,
        t: Ticket,
        sync: impl Fn() -> io::Result<()>,
        failure: &Failure,
        stats: &Stats,
    ) -> Result<()> {
        let mut g = self.m.lock();
        loop {
            if g.failed_batches.iter().any(|(a, b)| t.0 > *a && t.0 <= *b) {
                return Err(Error::NoSpace);
            }
            if g.synced >= t.0 {
                return Ok(());
            }
            failure.check()?;
            if g.syncing {
                self.cv.wait(&mut g);
                continue;
            }
            g.syncing = true;
            let want = g.batch_hw_x16 / 16;
            if want > 1 {
                let wait = Duration::from_nanos(g.sync_ns_avg / 2).min(COMMIT_GATHER_MAX);
                let deadline = Instant::now() + wait;
                g.gathering = true;
                while g.issued - g.synced < want {
                    if self.gather_cv.wait_until(&mut g, deadline).timed_out() {
                        break;
                    }
                }
                g.gathering = false;
            }
            let target = g.issued;
            let prev = g.synced;
            // C4: a failed sync is never retried. `failure.check()` above saw no failure
            // under this mutex, and every sync failure is recorded under it.
            assert!(!g.sync_failed, "a sync was attempted after a failed one");
            assert!(
                prev < target && target >= t.0,
                "a sync covers the waiter's ticket"
            );
            drop(g);
            let started = Instant::now();
            let r = sync();
            let took = started.elapsed();
            stats.record(Lat::Sync, took);
            g = self.m.lock();
            g.syncing = false;
            let batch_x16 = (target - prev) * 16;
            g.batch_hw_x16 = batch_x16.max(g.batch_hw_x16 - g.batch_hw_x16 / 16);
            let ns = took.as_nanos() as u64;
            g.sync_ns_avg = if g.sync_ns_avg == 0 {
                ns
            } else {
                (g.sync_ns_avg * 7 + ns) / 8
            };
            match r {
                Ok(()) => {
                    stats.add(C::Syncs, 1);
                    stats.record_batch(target - prev);
                    g.synced = g.synced.max(target);
                    debug_assert!(g.synced <= g.issued, "synced past what was issued");
                }
                Err(e) => {
                    stats.add(C::SyncFailures, 1);
                    if is_enospc(&e) {
                        // The covered requests report ENOSPC itself.
                        if g.failed_batches.len() >= FAILED_BATCHES_KEPT {
                            g.failed_batches.remove(0);
                        }
                        g.failed_batches.push((prev, target));
                    }
                    g.sync_failed = true;
                    failure.fail(BackingOp::Sync, &e);
                }
            }
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn concurrent_writers_share_syncs() {
        let gc = Arc::new(GroupCommit::default());
        let failure = Arc::new(Failure::default());
        let stats = Arc::new(Stats::new());
        let syncs = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gc, failure, stats, syncs) =
                    (gc.clone(), failure.clone(), stats.clone(), syncs.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let t = gc.issue();
                        let r = gc.wait_durable(
                            t,
                            || {
                                syncs.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                Ok(())
                            },
                            &failure,
                            &stats,
                        );
                        assert!(r.is_ok());
                    }
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok());
        }
        assert!(syncs.load(Ordering::Relaxed) < 400, "no sharing happened");
        assert!(gc.is_clean());
    }

    #[test]
    fn sync_failures_are_sticky_and_enospc_reported_to_its_batch() {
        let called = AtomicBool::new(false);
        let ok = || {
            called.store(true, Ordering::Relaxed);
            Ok(())
        };
        for errno in [libc::ENOSPC, libc::EIO] {
            let (gc, failure, stats) = (GroupCommit::default(), Failure::default(), Stats::new());
            let t1 = gc.issue();
            let fail = || Err(io::Error::from_raw_os_error(errno));
            let r = gc.wait_durable(t1, fail, &failure, &stats);
            match errno {
                libc::ENOSPC => assert!(matches!(r, Err(Error::NoSpace))),
                _ => assert!(matches!(r, Err(Error::ReadOnly(_)))),
            }
            // Later tickets fail without a new sync: it could not bring lost pages back.
            called.store(false, Ordering::Relaxed);
            let t2 = gc.issue();
            assert!(matches!(
                gc.wait_durable(t2, ok, &failure, &stats),
                Err(Error::ReadOnly(_))
            ));
            assert!(
                !called.load(Ordering::Relaxed),
                "a sync was retried after a failure"
            );
            assert_eq!(failure.cause().map(|c| c.errno), Some(Some(errno)));
        }
    }
}
