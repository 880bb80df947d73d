//! The single writer of one connection's replies.
//!
//! Invariants:
//! - each reply is written whole under the writer lock, so replies never interleave on
//!   the wire; the client matches them by handle;
//! - a reply must be written within the connection's reply timeout, counted for the
//!   whole reply from the moment its writing starts (not per system call); a reply that
//!   misses it, or fails, marks the connection broken and closes the socket, which ends
//!   the connection and releases what its replies hold;
//! - bytes borrowed from the target's memory (a zero-copy view of the RAM tier) are held
//!   while waiting (for the writer lock, for the client to take bytes) for at most
//!   [`BORROWED_WAIT_MAX`] per reply: whatever the client has not taken by then is copied
//!   out, the view ends, and only then is the client waited for up to the reply deadline.
//!   A view pins RAM and delays the engine's reclaim of evicted chunks for the whole
//!   object, so a client that stops reading must not pin it. Asserted: a thread sending
//!   borrowed bytes panics if it would wait past that bound ([`Borrowing`]);
//! - a reply of at most [`QUEUED_REPLY_MAX_BYTES`] does not wait for the writer lock: when
//!   the lock is taken it is queued whole, and the thread that holds the lock sends the
//!   queue (several replies in one `sendmsg`) before it lets go. Every holder looks at the
//!   queue again after letting go and takes the lock back if it is not empty, and every
//!   thread that queues tries the lock after queueing, so no queued reply is left behind
//!   by the last holder. The queue holds at most [`QUEUE_MAX_BYTES`]; a reply that does
//!   not fit waits for the lock as any larger one does. A thread holding borrowed bytes
//!   never sends the queue (that could mean waiting for the client): it keeps the lock
//!   until its borrow has ended ([`Replier::finish`]).
//!
//! Crash semantics: none; a reply is sent (or queued) only after the target call it
//! reports on returned (see `conn.rs`).

use crate::limits::BORROWED_WAIT_MAX;
use crate::socket::{send_parts, Progress, Stream};
use parking_lot::{Mutex, MutexGuard};
use std::cell::Cell;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

thread_local! {
    /// While this thread sends bytes borrowed from the target's memory: the instant up to
    /// which it may wait with them.
    static BORROWING: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Marks the current thread as sending borrowed bytes until dropped.
pub(crate) struct Borrowing(());

impl Borrowing {
    /// From now on the thread holds borrowed bytes, for at most [`BORROWED_WAIT_MAX`] of
    /// waiting.
    pub(crate) fn start() -> Self {
        BORROWING.with(|b| b.set(Some(Instant::now() + BORROWED_WAIT_MAX)));
        Borrowing(())
    }

    /// How long the current thread may wait: until `deadline`, or sooner if it holds
    /// borrowed bytes.
    fn wait_limit(deadline: Instant) -> Instant {
        BORROWING
            .with(|b| b.get())
            .map_or(deadline, |l| l.min(deadline))
    }

    /// Panics if the current thread would wait past `until` with borrowed bytes.
    fn assert_may_wait(until: Instant, what: &str) {
        if let Some(limit) = BORROWING.with(|b| b.get()) {
            assert!(
                until <= limit,
                "{what} with bytes borrowed from the target's memory, past the bound"
            );
        }
    }
}

impl Drop for Borrowing {
    fn drop(&mut self) {
        BORROWING.with(|b| b.set(None));
    }
}

/// Replies up to this size (a write's or a flush's, an error, a read of up to 4 KiB with
/// its structured header) are queued rather than wait for the writer lock; larger ones
/// wait, since copying them would cost more than the wait.
const QUEUED_REPLY_MAX_BYTES: usize = 4096 + 64;
/// Most bytes queued at once. Replies to executed requests are bounded by the in-flight
/// bound, but error replies to requests refused at once are not; past this, a reply waits
/// for the lock, which holds back a client that sends faster than it takes replies.
const QUEUE_MAX_BYTES: usize = 1 << 20;

pub(crate) struct Replier {
    stream: Mutex<Stream>,
    /// Whole replies, back to back, that found the writer lock taken; its holder sends
    /// them before it lets go.
    queued: Mutex<Vec<u8>>,
    /// Set when a reply could not be sent; the reader then stops.
    broken: AtomicBool,
    /// Set when that was because the client did not take a reply by its deadline.
    deadline_missed: AtomicBool,
    /// Time one reply may take to be written.
    timeout: Duration,
}

/// The part of a reply with borrowed data that the socket did not take at once, copied
/// out, to be sent by [`Replier::finish`] once the borrow has ended.
pub(crate) struct Unsent<'a> {
    /// The writer lock, held since part of the reply went out (so no other reply can
    /// come between), with that reply's deadline; `None` if the lock was busy and
    /// nothing was sent.
    held: Option<(MutexGuard<'a, Stream>, Instant)>,
    bytes: Vec<u8>,
}

impl Replier {
    pub(crate) fn new(stream: Stream, timeout: Duration) -> Self {
        Self {
            stream: Mutex::new(stream),
            queued: Mutex::new(Vec::new()),
            broken: AtomicBool::new(false),
            deadline_missed: AtomicBool::new(false),
            timeout,
        }
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// A reply was not taken by the client within the reply timeout.
    pub(crate) fn deadline_missed(&self) -> bool {
        self.deadline_missed.load(Ordering::Relaxed)
    }

    pub(crate) fn send(&self, bytes: &[u8]) {
        self.send_parts(&[bytes]);
    }

    /// Writes the parts as one reply (one `sendmsg` in the common case, with any queued
    /// replies), waiting for the client as needed, up to the reply timeout. A small reply
    /// that finds the writer lock taken is queued for its holder instead of waiting.
    pub(crate) fn send_parts(&self, parts: &[&[u8]]) {
        if self.is_broken() {
            return;
        }
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        if bytes <= QUEUED_REPLY_MAX_BYTES {
            if let Some(s) = self.stream.try_lock() {
                return self.send_with_queue(s, parts);
            }
            let queued = {
                let mut q = self.queued.lock();
                let room = q.len() + bytes <= QUEUE_MAX_BYTES;
                if room {
                    for p in parts {
                        q.extend_from_slice(p);
                    }
                }
                room
            };
            if queued {
                // The holder may have looked at the queue and let go before the reply was
                // in it: then the lock is free, and this thread sends the queue.
                if let Some(s) = self.stream.try_lock() {
                    self.send_with_queue(s, &[]);
                }
                return;
            }
            // The queue is full (error replies to a client that sends requests faster than
            // it takes replies): wait for the lock, which holds that client back.
        }
        Borrowing::assert_may_wait(Instant::now() + self.timeout, "waiting for the lock");
        let s = self.stream.lock();
        self.send_with_queue(s, parts);
    }

    /// With the writer lock: sends `parts` and the queued replies, lets go of the lock,
    /// and takes it back for replies queued meanwhile (see the module's invariants).
    fn send_with_queue<'a>(&'a self, mut s: MutexGuard<'a, Stream>, parts: &[&[u8]]) {
        Borrowing::assert_may_wait(Instant::now() + self.timeout, "sending queued replies");
        let mut own = parts;
        loop {
            let queued = std::mem::take(&mut *self.queued.lock());
            let mut all: Vec<&[u8]> = own.to_vec();
            if !queued.is_empty() {
                all.push(&queued);
            }
            if !all.is_empty() && !self.is_broken() {
                let deadline = Instant::now() + self.timeout;
                self.complete(&mut s, &all, 0, deadline);
            }
            drop(s);
            if self.queued.lock().is_empty() {
                return;
            }
            match self.stream.try_lock() {
                Some(again) => s = again,
                // Another holder will look at the queue when it lets go.
                None => return,
            }
            own = &[];
        }
    }

    /// Starts a reply whose `data` is borrowed from the target's memory: sends what the
    /// client takes within the borrowing thread's bound ([`Borrowing`]). `None`: the
    /// connection is broken; otherwise the rest, copied (perhaps nothing), and the writer
    /// lock when this thread took it, for [`Replier::finish`] once the borrow has ended:
    /// only then may the lock's holder send queued replies.
    pub(crate) fn send_borrowed(&self, head: &[u8], data: &[u8]) -> Option<Unsent<'_>> {
        if self.is_broken() {
            return None;
        }
        let copy_from = |from: usize| {
            let mut v = Vec::with_capacity(head.len() + data.len() - from);
            if from < head.len() {
                v.extend_from_slice(&head[from..]);
            }
            v.extend_from_slice(&data[from.saturating_sub(head.len())..]);
            v
        };
        let started = Instant::now();
        let deadline = started + self.timeout;
        let borrow_until = Borrowing::wait_limit(deadline);
        let Some(mut s) = self.stream.try_lock_until(borrow_until) else {
            // Another reply of this connection is still being written, perhaps to a slow
            // client: copy rather than wait longer with the bytes borrowed.
            return Some(Unsent {
                held: None,
                bytes: copy_from(0),
            });
        };
        match send_parts(&mut *s, &[head, data], 0, Some(borrow_until)) {
            Ok(Progress::Whole) => Some(Unsent {
                held: Some((s, deadline)),
                bytes: Vec::new(),
            }),
            Ok(Progress::Partial(sent)) => Some(Unsent {
                held: Some((s, deadline)),
                bytes: copy_from(sent),
            }),
            Err(_) => {
                self.fail(&s);
                None
            }
        }
    }

    /// Sends the rest of a reply started by [`Replier::send_borrowed`]; call it after the
    /// borrow has ended.
    pub(crate) fn finish(&self, unsent: Unsent<'_>) {
        match unsent.held {
            Some((mut s, deadline)) => {
                if !unsent.bytes.is_empty() {
                    self.complete(&mut s, &[&unsent.bytes], 0, deadline);
                }
                self.send_with_queue(s, &[]);
            }
            None => self.send(&unsent.bytes),
        }
    }

    /// Writes the rest of a reply by its deadline; a reply not written whole by then ends
    /// the connection.
    fn complete(&self, s: &mut Stream, parts: &[&[u8]], skip: usize, deadline: Instant) {
        Borrowing::assert_may_wait(deadline, "waiting for a client");
        match send_parts(s, parts, skip, Some(deadline)) {
            Ok(Progress::Whole) => {}
            Ok(Progress::Partial(_)) => {
                self.deadline_missed.store(true, Ordering::Relaxed);
                self.fail(s);
            }
            Err(_) => self.fail(s),
        }
    }

    /// The client is gone, or did not take a reply by its deadline. Closing both
    /// directions wakes the reader, so the connection winds down.
    fn fail(&self, s: &Stream) {
        self.broken.store(true, Ordering::Relaxed);
        s.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    #[should_panic(expected = "borrowed from the target's memory")]
    fn waiting_for_a_client_with_borrowed_bytes_is_refused() {
        let (a, _b) = UnixStream::pair().unwrap_or_else(|e| panic!("pair: {e}"));
        let r = Replier::new(Stream::Unix(a), Duration::from_secs(60));
        let _borrowing = Borrowing::start();
        r.send(b"a reply that may wait for its client");
    }

    /// Counted, not timed: while one reply waits for its client with the writer lock, a
    /// small reply of another request is handed to that lock's holder and its thread goes
    /// on (the bound below is liveness only); the client then receives both, whole and
    /// one after the other.
    #[test]
    fn a_small_reply_never_waits_for_the_writer_lock() {
        let (a, mut b) = UnixStream::pair().unwrap_or_else(|e| panic!("pair: {e}"));
        let r = std::sync::Arc::new(Replier::new(Stream::Unix(a), Duration::from_secs(60)));
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let (r1, big1) = (std::sync::Arc::clone(&r), big.clone());
        let first = std::thread::spawn(move || r1.send(&big1));
        // The first reply holds the lock until the client reads: 8 MiB do not fit the
        // socket's buffer.
        while !r.stream.is_locked() {
            std::thread::yield_now();
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let r2 = std::sync::Arc::clone(&r);
        let second = std::thread::spawn(move || {
            r2.send(b"a small reply");
            let _ = done_tx.send(());
        });
        let returned = done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; (8 << 20) + 13];
            std::io::Read::read_exact(&mut b, &mut got).map(|_| got)
        });
        let _ = (first.join(), second.join());
        assert!(
            returned,
            "a small reply waited for the writer lock while another reply waited for its client"
        );
        let got = reader.join().ok().and_then(Result::ok);
        let mut want = big;
        want.extend_from_slice(b"a small reply");
        assert!(got == Some(want), "the replies arrived changed");
    }

    #[test]
    fn a_borrowed_reply_the_client_does_not_take_is_copied_out() {
        let (a, mut b) = UnixStream::pair().unwrap_or_else(|e| panic!("pair: {e}"));
        let r = Replier::new(Stream::Unix(a), Duration::from_secs(60));
        let data: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let rest = {
            let _borrowing = Borrowing::start();
            r.send_borrowed(b"head", &data)
        };
        let rest = rest.unwrap_or_else(|| panic!("8 MiB fit in the socket at once"));
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut b, &mut got).map(|_| got)
        });
        r.finish(rest);
        drop(r);
        let got = reader.join().ok().and_then(Result::ok);
        let mut want = b"head".to_vec();
        want.extend_from_slice(&data);
        assert!(got == Some(want), "the reply arrived changed");
    }
}
