//! The reader role of one connection: which of its threads reads the next request, and
//! whether giving the role up costs a thread wake-up.
//!
//! A thread that has read a request gives the role up before it executes the request, so
//! that a client with several requests in flight has them read and executed in parallel.
//! Handing the role to a parked thread is a `futex` wake on the path of the request just
//! read, before its device write starts; on these VMs that wake is a cross-CPU interrupt
//! of tens of microseconds. A client that never has two requests in flight (QD 1) does
//! not need the hand-off at all: nothing arrives while its one request executes.
//!
//! So the gate learns, per connection, whether the client overlaps its requests. After
//! [`SERIAL_AFTER_QUIET_REQUESTS`] requests in a row that showed no overlap (no other
//! request of the connection in flight when it was read, no bytes read behind it, and,
//! for a request executed after a quiet hand-off, nothing sent by the client before its
//! reply: a QD 1 client cannot send before it has the reply), the connection is
//! *serial*: a request with a small reply (write, flush, trim, write-zeroes, and a read
//! under 64 KiB, which is copied out with its header) gives the role up *quietly*,
//! waking nobody, and its thread takes the role back when it is done.
//!
//! Invariants:
//! - at most one thread holds the role ([`ReaderGate::claim`] to [`ReaderGate::release`]);
//! - a quiet vacancy lasts at most [`QUIET_HOLD_MAX`] plus a scheduling delay: while the
//!   connection is serial one parked thread (the *watcher*) waits with that deadline and
//!   takes a vacancy that old, so a request that arrives while another executes (a client
//!   turning from QD 1 to a deeper queue, or a device write that stalls) waits for one
//!   hold at most, never for a request that cannot finish until it is read (a connection
//!   left with no second thread by the process's thread limit waits for the request
//!   executing, as it would for any thread);
//! - any sign of overlap, and any takeover by the watcher, ends serial mode at once; it
//!   returns only after another [`SERIAL_AFTER_QUIET_REQUESTS`] quiet requests;
//! - the watcher stops its deadline wake-ups once the role has been held for
//!   [`WATCH_IDLE_MAX`] by a reader (an idle client), by ending serial mode, so an idle
//!   connection costs no timer wake-ups;
//! - once [`ReaderGate::end`] is called every present and future claim fails, so every
//!   thread of the connection sees the end;
//! - at most one thread spins for the role at a time (a thread back from executing, before
//!   it parks), and a role given up with a wake-up while one spins wakes nobody: the
//!   spinner takes it, because it looks at the role under the lock again before it
//!   parks. So a vacancy is never left with parked threads unwoken and no spinner.
//!   Without the limit, every thread back from a request spun through its `sched_yield`s
//!   while a reader waited in `recv` (2.6 yields per request at QD 8 here), and each
//!   hand-off woke a parked thread that then found the role taken by a spinner.
//!
//! Crash semantics: none; volatile scheduling state.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Quiet requests in a row after which a connection is treated as serial.
pub(crate) const SERIAL_AFTER_QUIET_REQUESTS: u32 = 16;
/// Longest a quiet vacancy of the role lasts before the watcher takes it. Far above a
/// device write on an SSD (80-400 us here), so a QD 1 client never sees a takeover, and
/// short enough that a request arriving behind a stalled one waits little.
pub(crate) const QUIET_HOLD_MAX: Duration = Duration::from_millis(1);
/// A reader waiting this long for a request means the client is idle: serial mode ends,
/// so the watcher's deadline wake-ups stop.
pub(crate) const WATCH_IDLE_MAX: Duration = Duration::from_millis(50);

#[derive(Debug)]
struct GateState {
    /// A thread holds the role.
    taken: bool,
    /// When the current holder took the role.
    taken_at: Instant,
    /// Set while the role is vacant because its last holder gave it up quietly.
    quiet_since: Option<Instant>,
    quiet_streak: u32,
    serial: bool,
    /// A parked thread waits with a deadline (only while serial).
    watching: bool,
    waiting: usize,
    /// A thread spins for the role (unlocked) and will look at it again before it parks.
    spinning: bool,
    /// Wake-ups sent to parked threads (for the tests).
    wakes: u64,
    ended: bool,
}

/// What [`ReaderGate::decide`] made of a request just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// Wake a parked thread to read the next request while this one executes.
    Wake,
    /// The connection is serial and the reply small: give the role up without a wake-up.
    Quiet,
}

/// How a claim got the role, for the connection's statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The claim took a quiet vacancy left by another thread after [`QUIET_HOLD_MAX`].
    pub takeover: bool,
}

pub(crate) struct ReaderGate {
    st: Mutex<GateState>,
    cv: Condvar,
    /// Set while the role is vacant and may be taken by anyone (given up with a wake-up):
    /// what a thread about to park spins on first, so that a role handed on while it
    /// still spins costs no `futex` wake.
    open: AtomicBool,
}

/// Rounds a thread spins on [`ReaderGate::open`] before it parks: three short busy waits,
/// then `sched_yield`s, a few microseconds in all (the shape of parking_lot's own).
const SPIN_ROUNDS: u32 = 10;

impl ReaderGate {
    pub(crate) fn new() -> Self {
        Self {
            st: Mutex::new(GateState {
                taken: false,
                taken_at: Instant::now(),
                quiet_since: None,
                quiet_streak: 0,
                serial: false,
                watching: false,
                waiting: 0,
                spinning: false,
                wakes: 0,
                ended: false,
            }),
            cv: Condvar::new(),
            open: AtomicBool::new(true),
        }
    }

    fn spin_for_open(&self) {
        for round in 0..SPIN_ROUNDS {
            if self.open.load(Ordering::Acquire) {
                return;
            }
            if round < 3 {
                for _ in 0..(4 << round) {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn take(&self, st: &mut MutexGuard<'_, GateState>) {
        st.taken = true;
        st.taken_at = Instant::now();
        st.quiet_since = None;
        self.open.store(false, Ordering::Release);
    }

    /// Waits for the role. `None`: the connection's reading has ended. A caller coming
    /// from executing a request (or a new thread) takes any vacancy at once, a quiet one
    /// included; a parked thread takes a quiet vacancy only once it is
    /// [`QUIET_HOLD_MAX`] old (the watcher).
    pub(crate) fn claim(&self) -> Option<Taken> {
        let mut st = self.st.lock();
        let mut first = true;
        loop {
            if st.ended {
                return None;
            }
            if !st.taken {
                let quiet_for = st.quiet_since.map(|t| t.elapsed());
                let takeover = !first && quiet_for.is_some_and(|d| d >= QUIET_HOLD_MAX);
                if first || quiet_for.is_none() || takeover {
                    if takeover {
                        // A hold that long: the device is slow or the client overlaps
                        // requests after all; either way serial mode does not pay.
                        st.serial = false;
                        st.quiet_streak = 0;
                    }
                    self.take(&mut st);
                    return Some(Taken { takeover });
                }
            }
            if first && !st.spinning {
                // Before parking: the holder often gives the role up within microseconds.
                // One spinner is enough to take it; a second would only take a CPU from
                // the threads that have work.
                first = false;
                st.spinning = true;
                MutexGuard::unlocked(&mut st, || self.spin_for_open());
                st.spinning = false;
                continue;
            }
            first = false;
            st.waiting += 1;
            if st.serial && !st.watching {
                st.watching = true;
                let deadline = match st.quiet_since {
                    Some(t) if !st.taken => t + QUIET_HOLD_MAX,
                    _ => Instant::now() + QUIET_HOLD_MAX,
                };
                self.cv.wait_until(&mut st, deadline);
                st.watching = false;
                if st.serial && st.taken && st.taken_at.elapsed() >= WATCH_IDLE_MAX {
                    // The reader has waited that long for a request: the client is idle.
                    st.serial = false;
                    st.quiet_streak = 0;
                }
            } else {
                self.cv.wait(&mut st);
            }
            st.waiting -= 1;
        }
    }

    /// Called by the holder once it has read a request: records whether the request
    /// showed overlap and says how to give the role up. `small_reply`: the request's
    /// reply cannot be large (so it cannot block for long on a client that is busy
    /// sending requests nobody reads).
    pub(crate) fn decide(&self, overlap: bool, small_reply: bool) -> Handoff {
        let mut st = self.st.lock();
        debug_assert!(st.taken, "decide without holding the reader role");
        if overlap {
            st.quiet_streak = 0;
            st.serial = false;
        } else if small_reply {
            // Only requests that could leave quietly count towards serial mode: a stream
            // of large reads would only pay for the watcher's timer.
            st.quiet_streak = st.quiet_streak.saturating_add(1);
            if !st.serial && st.quiet_streak >= SERIAL_AFTER_QUIET_REQUESTS {
                st.serial = true;
                if st.waiting > 0 && !st.watching {
                    // One wake-up per entry into serial mode: a parked thread becomes the
                    // watcher.
                    self.cv.notify_one();
                }
            }
        }
        if st.serial && small_reply {
            Handoff::Quiet
        } else {
            Handoff::Wake
        }
    }

    /// A request executing after a quiet hand-off saw bytes the client sent meanwhile:
    /// the client overlaps its requests, so serial mode ends (the next request read wakes
    /// a thread as usual).
    pub(crate) fn note_overlap(&self) {
        let mut st = self.st.lock();
        st.serial = false;
        st.quiet_streak = 0;
    }

    /// Gives the role up; with [`Handoff::Wake`] a parked thread is woken to take it.
    pub(crate) fn release(&self, how: Handoff) {
        let mut st = self.st.lock();
        debug_assert!(st.taken, "release without holding the reader role");
        st.taken = false;
        match how {
            Handoff::Quiet => st.quiet_since = Some(Instant::now()),
            Handoff::Wake => {
                st.quiet_since = None;
                self.open.store(true, Ordering::Release);
                // A spinner looks at the role under this lock before it parks, so it
                // takes the role; a wake-up would find it taken.
                if st.waiting > 0 && !st.spinning {
                    st.wakes += 1;
                    self.cv.notify_one();
                }
            }
        }
    }

    /// Reading has ended: every claim from now on fails, and parked threads wake to see it.
    pub(crate) fn end(&self) {
        let mut st = self.st.lock();
        st.ended = true;
        st.taken = false;
        self.open.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    #[cfg(test)]
    fn is_serial(&self) -> bool {
        self.st.lock().serial
    }

    #[cfg(test)]
    fn wakes(&self) -> u64 {
        self.st.lock().wakes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn quiet_requests(g: &ReaderGate, n: u32) {
        for _ in 0..n {
            assert!(g.claim().is_some());
            let h = g.decide(false, true);
            g.release(h);
        }
    }

    #[test]
    fn serial_after_a_run_of_quiet_requests_and_not_before() {
        let g = ReaderGate::new();
        quiet_requests(&g, SERIAL_AFTER_QUIET_REQUESTS - 1);
        assert!(!g.is_serial());
        // Reads (large replies) neither count towards serial mode nor end it.
        for _ in 0..SERIAL_AFTER_QUIET_REQUESTS {
            assert!(g.claim().is_some());
            assert_eq!(g.decide(false, false), Handoff::Wake);
            g.release(Handoff::Wake);
        }
        assert!(!g.is_serial());
        assert!(g.claim().is_some());
        assert_eq!(g.decide(false, true), Handoff::Quiet);
        g.release(Handoff::Quiet);
        // A large reply never leaves quietly, even when serial.
        assert!(g.claim().is_some());
        assert_eq!(g.decide(false, false), Handoff::Wake);
        g.release(Handoff::Wake);
        // Overlap ends serial mode at once.
        assert!(g.claim().is_some());
        assert_eq!(g.decide(true, true), Handoff::Wake);
        g.release(Handoff::Wake);
        assert!(!g.is_serial());
    }

    #[test]
    fn a_quiet_vacancy_is_taken_by_the_watcher_and_ends_serial_mode() {
        let g = Arc::new(ReaderGate::new());
        quiet_requests(&g, SERIAL_AFTER_QUIET_REQUESTS);
        assert!(g.is_serial());
        // The holder reads a request and gives the role up quietly, then "executes" for
        // as long as the test needs: only the watcher can read the next request.
        assert!(g.claim().is_some());
        assert_eq!(g.decide(false, true), Handoff::Quiet);
        let follower_took = Arc::new(AtomicBool::new(false));
        let f = {
            let (g, took) = (Arc::clone(&g), Arc::clone(&follower_took));
            std::thread::spawn(move || {
                let Some(t) = g.claim() else {
                    panic!("the gate ended")
                };
                took.store(true, Ordering::SeqCst);
                t
            })
        };
        // The follower parks while the holder still holds the role.
        while g.st.lock().waiting == 0 {
            std::thread::yield_now();
        }
        g.release(Handoff::Quiet);
        let t = f.join().unwrap_or_else(|_| panic!("the follower panicked"));
        assert!(follower_took.load(Ordering::SeqCst));
        assert!(
            t.takeover,
            "the vacancy was taken only after the hold bound"
        );
        assert!(!g.is_serial(), "a takeover ends serial mode");
        // The old holder, back from its request, waits for the role like anyone.
        g.release(Handoff::Wake);
        assert_eq!(g.claim(), Some(Taken { takeover: false }));
    }

    #[test]
    fn a_returning_holder_takes_its_quiet_vacancy_at_once() {
        let g = ReaderGate::new();
        quiet_requests(&g, SERIAL_AFTER_QUIET_REQUESTS + 3);
        assert!(g.is_serial());
        assert_eq!(g.claim(), Some(Taken { takeover: false }));
    }

    #[test]
    fn a_role_given_up_while_a_thread_spins_wakes_nobody_and_the_spinner_takes_it() {
        let g = Arc::new(ReaderGate::new());
        assert!(g.claim().is_some());
        let parked = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || g.claim())
        };
        while g.st.lock().waiting == 0 {
            std::thread::yield_now();
        }
        // A thread back from a request spins (set by hand: a real spin lasts microseconds).
        g.st.lock().spinning = true;
        g.release(Handoff::Wake);
        assert_eq!(g.wakes(), 0, "a spinner was there to take the role");
        // The spinner's look under the lock before it parks: the role is its own.
        g.st.lock().spinning = false;
        assert_eq!(g.claim(), Some(Taken { takeover: false }));
        // With nobody spinning, giving the role up wakes the parked thread, which takes it.
        g.release(Handoff::Wake);
        assert_eq!(g.wakes(), 1);
        let took = parked
            .join()
            .unwrap_or_else(|_| panic!("the parked thread panicked"));
        assert_eq!(took, Some(Taken { takeover: false }));
    }

    #[test]
    fn end_fails_every_claim_and_wakes_parked_threads() {
        let g = Arc::new(ReaderGate::new());
        assert!(g.claim().is_some());
        let parked: Vec<_> = (0..3)
            .map(|_| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || g.claim())
            })
            .collect();
        while g.st.lock().waiting < 3 {
            std::thread::yield_now();
        }
        g.end();
        for p in parked {
            let claimed = p
                .join()
                .unwrap_or_else(|_| panic!("a parked thread panicked"));
            assert_eq!(claimed, None);
        }
        assert_eq!(g.claim(), None);
    }
}
