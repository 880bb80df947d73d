//! What the server knows of one connection's use: whether a request is in flight (so the
//! server closes a connection only between requests), how long it has been idle, whether
//! it left writes unflushed, and its traffic for the statistics.
//!
//! Invariants:
//! - a request is in flight from the moment its header has been read until its reply is
//!   written; the decision to close a connection ([`Activity::try_close`]) and the start
//!   of a request exclude each other (one atomic word);
//! - counters are per connection, so counting costs no cache line shared between clients.
//!
//! Crash semantics: none; volatile bookkeeping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the server's registry knows of a connection's use, for choosing one to close when
/// every slot is taken or an idle timeout is set (see `server.rs`). Updated by the
/// connection's threads, read by the accept loop.
pub(crate) struct Activity {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last request header read or reply sent.
    last_ms: AtomicU64,
    /// Requests whose header was read and whose reply is not written yet, plus
    /// [`CLOSING`] once the server decided to close the connection. One word, so the
    /// decision to close ([`Activity::try_close`]) and the start of a request exclude
    /// each other.
    state: AtomicU64,
    /// Negotiation is over; before that the handshake timeout bounds the connection.
    transmitting: AtomicBool,
    /// A write, trim or zero was executed after the start of this connection's last
    /// successful FLUSH (or there was no FLUSH).
    pub(crate) unflushed: AtomicBool,
    /// What the connection asked for (the server's statistics).
    pub(crate) traffic: Traffic,
}

/// Requests and bytes of one connection. Per connection, so that counting costs no
/// cache line shared between clients; the server adds them up when asked.
#[derive(Default)]
pub(crate) struct Traffic {
    /// Request headers read (answered or not, valid or not).
    pub requests: AtomicU64,
    /// Bytes of successful reads sent.
    pub bytes_read: AtomicU64,
    /// Bytes of successful writes executed.
    pub bytes_written: AtomicU64,
    /// Block status requests answered.
    pub block_status: AtomicU64,
    /// Waits for a request header that polling ended: the bytes arrived while the reader
    /// polled, so no kernel wake-up was needed (`conn.rs`, `poll_before_block`).
    pub polls_caught: AtomicU64,
    /// Waits where the poll budget ran out first: the reader then blocked, and the
    /// request cost a wake-up.
    pub polls_missed: AtomicU64,
    /// Requests whose reader gave its role up without waking another thread, the
    /// connection being serial (`gate.rs`).
    pub quiet_handoffs: AtomicU64,
    /// Quiet vacancies of the reader role that lasted past their bound and were taken by
    /// the waiting thread (`gate.rs`).
    pub takeovers: AtomicU64,
}

/// Bit of `Activity::state`: the server closed the connection's read side to free its
/// slot (eviction) or because it was idle past the idle timeout.
const CLOSING: u64 = 1 << 63;

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            state: AtomicU64::new(0),
            transmitting: AtomicBool::new(false),
            unflushed: AtomicBool::new(false),
            traffic: Traffic::default(),
        }
    }

    pub(crate) fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Acquire));
        self.epoch.elapsed().saturating_sub(last)
    }

    pub(crate) fn set_transmitting(&self) {
        self.touch();
        self.transmitting.store(true, Ordering::Release);
    }

    /// Still negotiating (bounded by the handshake timeout, never chosen to be closed).
    pub(crate) fn is_negotiating(&self) -> bool {
        !self.transmitting.load(Ordering::Acquire)
    }

    /// A request header was read: from now until [`Activity::end`] the connection is busy.
    pub(crate) fn begin(&self) {
        let before = self.state.fetch_add(1, Ordering::AcqRel);
        debug_assert!(
            (before & !CLOSING) + 1 < CLOSING,
            "in-flight count ran into the flag"
        );
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    /// The request's reply was written (or it was answered with an error, or dropped).
    pub(crate) fn end(&self) {
        self.touch();
        let before = self.state.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before & !CLOSING > 0, "a request ended that never began");
    }

    /// How long the connection has been idle, if it may be closed at all: past
    /// negotiation, not already being closed, and with no request between header and
    /// reply.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.is_negotiating() || self.state.load(Ordering::Acquire) != 0 {
            return None;
        }
        Some(self.idle())
    }

    /// Marks the connection as being closed by the server if it has been idle for at
    /// least `min_idle` with no request in flight; returns how long it was idle. After
    /// `Some`, the caller closes its read side. A request whose header was read before
    /// this call makes it fail, so a request is never cut by the decision; one whose
    /// header comes later arrived after the connection was chosen, like a request sent
    /// at shutdown.
    pub(crate) fn try_close(&self, min_idle: Duration) -> Option<Duration> {
        let idle = self.idle_for().filter(|d| *d >= min_idle)?;
        self.state
            .compare_exchange(0, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        // A whole request may have started and finished between the idle check and the
        // exchange: it was answered, but the connection is not idle after all.
        if self.idle() < min_idle {
            self.state.fetch_and(!CLOSING, Ordering::AcqRel);
            return None;
        }
        Some(idle)
    }

    /// The server ends this connection because the client missed a reply or payload
    /// deadline: like a connection chosen by [`Activity::try_close`], it no longer holds a
    /// slot, and its unflushed writes are flushed for it.
    pub(crate) fn cut(&self) {
        self.state.fetch_or(CLOSING, Ordering::AcqRel);
    }

    /// The server, not the client, ended this connection: it chose to close it
    /// ([`Activity::try_close`] succeeded) or the client missed a deadline.
    pub(crate) fn closed_by_server(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSING != 0
    }

    /// Whether the connection executed a write, trim or zero that no FLUSH of its own
    /// has covered for certain.
    pub(crate) fn has_unflushed_writes(&self) -> bool {
        self.unflushed.load(Ordering::Acquire)
    }
}
