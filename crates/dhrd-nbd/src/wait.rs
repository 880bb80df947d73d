//! Waiting for a socket to be ready, by a deadline: the blocking step of the
//! transmission phase's deadline-bound reads and writes (`socket.rs`) and of a TLS
//! session's (`tls.rs`, `tls_stream.rs`), taken without any lock held.
//!
//! Crash semantics: none.

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// Waits until `events` are ready on `fd`, or `deadline` passes (TimedOut); with no
/// deadline, as long as it takes.
pub(crate) fn poll_fd(
    fd: RawFd,
    events: libc::c_short,
    deadline: Option<Instant>,
) -> io::Result<()> {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                libc::c_int::try_from(left.as_nanos().div_ceil(1_000_000))
                    .unwrap_or(libc::c_int::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one live pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        match rc {
            // Ready, or hung up / in error: the next call on the socket reports which.
            1.. => return Ok(()),
            0 => {}
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}
