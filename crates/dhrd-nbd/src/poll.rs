//! Waiting for a client's next request without a kernel wake-up: a reader polls its
//! socket with non-blocking peeks before it blocks in `read` (`--poll-us`).
//!
//! Invariants:
//! - polling never consumes bytes (peeks only), so the reader's next `read` sees every
//!   byte the client sent;
//! - at most [`POLLERS_MAX`] threads of the process poll at a time, and none while more
//!   than [`POLL_WHILE_EXECUTING_MAX`] requests execute, so polling spends CPU only when
//!   the server would otherwise sleep between one client's requests;
//! - a poll ends at its budget, counted from its start.
//!
//! Crash semantics: none; no state beyond two process-wide counters.

use crate::socket::Stream;
use std::io::{self, BufReader};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Threads of the whole process that are polling a socket now; at most
/// [`POLLERS_MAX`], so polling never takes more than one CPU however many clients are
/// connected.
static POLLERS: AtomicUsize = AtomicUsize::new(0);
const POLLERS_MAX: usize = 1;
/// Threads of the whole process executing a request now. A reader polls only while at
/// most one does: polling pays when the server would otherwise sleep between requests,
/// and would take CPU from the requests of other clients when it is busy.
pub(crate) static EXECUTING: AtomicUsize = AtomicUsize::new(0);
const POLL_WHILE_EXECUTING_MAX: usize = 1;

/// How a reader's wait for the next request header began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    /// No polling: bytes already buffered, another thread polls, the server is busy, or
    /// polling is off.
    Skipped,
    /// The bytes arrived (or the peer closed) while polling: no wake-up needed.
    Caught,
    /// The budget ran out: the reader blocks and the request will cost a wake-up.
    Missed,
    /// Other requests started executing: polling stopped to leave them the CPU.
    Yielded,
}

/// Waits for the next request by polling the socket (a non-blocking peek) for up to
/// `budget` before the caller blocks in `read`. A reader blocked in `read` must be woken
/// by the kernel when the request arrives, which on a VM costs a cross-CPU interrupt
/// (about 20 us here, half of a 4 KiB read's round trip); a reader that is still polling
/// sees the bytes without one. Returns at once when data is buffered, when another thread
/// polls, or when the budget is zero.
pub(crate) fn poll_before_block(reader: &BufReader<Stream>, budget: Duration) -> Poll {
    if budget.is_zero()
        || bytes_buffered(reader)
        || EXECUTING.load(Ordering::Relaxed) > POLL_WHILE_EXECUTING_MAX
    {
        return Poll::Skipped;
    }
    if POLLERS.fetch_add(1, Ordering::AcqRel) >= POLLERS_MAX {
        POLLERS.fetch_sub(1, Ordering::AcqRel);
        return Poll::Skipped;
    }
    let fd = reader.get_ref().raw_fd();
    let started = Instant::now();
    let outcome = loop {
        let r = peek_one(fd);
        if r >= 0 {
            break Poll::Caught; // data, or the peer closed: the read will see it at once
        }
        let e = io::Error::last_os_error().kind();
        if e != io::ErrorKind::WouldBlock && e != io::ErrorKind::Interrupted {
            break Poll::Caught; // let the blocking read report it at once
        }
        if EXECUTING.load(Ordering::Relaxed) > POLL_WHILE_EXECUTING_MAX {
            break Poll::Yielded;
        }
        if started.elapsed() >= budget {
            break Poll::Missed;
        }
        std::hint::spin_loop();
    };
    POLLERS.fetch_sub(1, Ordering::AcqRel);
    outcome
}

/// A non-blocking one-byte peek at the socket: `recv`'s result (1: a byte waits, 0: the
/// peer closed, -1: see errno). Consumes nothing.
fn peek_one(fd: RawFd) -> isize {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a local on our own open socket; changes nothing.
    unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    }
}

/// Whether the client has sent bytes not read yet, without blocking or consuming them.
pub(crate) fn bytes_waiting(fd: RawFd) -> bool {
    peek_one(fd) > 0
}

/// Whether bytes the client sent are already in the reader's buffer or, with TLS,
/// decrypted and waiting: the next read needs no system call.
pub(crate) fn bytes_buffered(reader: &BufReader<Stream>) -> bool {
    !reader.buffer().is_empty() || reader.get_ref().has_pending()
}
