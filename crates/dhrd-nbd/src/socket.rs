//! A connected socket of either family, and the transmission phase's deadline-bounded
//! reads and writes on it.
//!
//! Invariants:
//! - during transmission the socket is written only with non-blocking sends
//!   ([`Stream::send_now`]); waiting for a slow client is a separate step
//!   ([`Stream::wait_writable`]) bounded by a deadline for the whole reply, not by a
//!   timeout per system call, so a client that takes a byte now and then cannot stretch
//!   one reply for ever;
//! - a write payload is read by a deadline for the whole payload ([`read_by`]), for the
//!   same reason;
//! - sends never raise SIGPIPE (MSG_NOSIGNAL): a vanished client is an error result;
//! - a TLS stream (`tls_stream.rs`) behaves as a socket here: the same deadlines bound
//!   its waits (including for ciphertext it encrypted but the socket has not taken yet),
//!   and its waits never hold the session lock.
//!
//! Crash semantics: none; this only moves bytes between the socket and memory.

use crate::tls::TlsStream;
use crate::wait::poll_fd;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A connected socket of either family, or a TLS session over one.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(TlsStream),
}

/// A deadline `t` from now, as a TLS stream keeps it.
fn deadline_in(t: Option<Duration>) -> Option<Instant> {
    t.map(|t| Instant::now() + t)
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        // Fails only if the peer is already gone, which is the state we want.
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Tls(s) => {
                let how = match how {
                    Shutdown::Read => libc::SHUT_RD,
                    Shutdown::Write => libc::SHUT_WR,
                    Shutdown::Both => libc::SHUT_RDWR,
                };
                // SAFETY: shutdown(2) on the session's open socket.
                unsafe { libc::shutdown(s.raw_fd(), how) };
                Ok(())
            }
        };
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Tls(s) => s.raw_fd(),
        }
    }

    /// The plain socket, for a TLS handshake to take over; a TLS stream is refused (no
    /// session runs over another).
    pub(crate) fn into_plain_fd(self) -> io::Result<OwnedFd> {
        match self {
            Stream::Unix(s) => Ok(s.into()),
            Stream::Tcp(s) => Ok(s.into()),
            Stream::Tls(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS is already running on this connection",
            )),
        }
    }

    /// The TLS session, if this stream is one.
    pub(crate) fn tls(&self) -> Option<&TlsStream> {
        match self {
            Stream::Tls(s) => Some(s),
            _ => None,
        }
    }

    /// Bytes already received and decrypted that no read has taken (TLS only).
    pub(crate) fn has_pending(&self) -> bool {
        self.tls().is_some_and(TlsStream::has_pending)
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Tls(s) => {
                s.set_read_deadline(deadline_in(t));
                Ok(())
            }
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Tls(s) => {
                s.set_write_deadline(deadline_in(t));
                Ok(())
            }
        }
    }

    /// Waits until `events` are ready on the socket, or `deadline` passes (TimedOut).
    fn wait_for(&self, events: libc::c_short, deadline: Instant) -> io::Result<()> {
        poll_fd(self.raw_fd(), events, Some(deadline))
    }
}

/// What a reply is written to: a socket, or a test double.
pub(crate) trait ReplySink {
    /// Writes what the peer takes now, without waiting; `WouldBlock` when it takes
    /// nothing.
    fn send_now(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Waits until the peer takes bytes again, or `deadline` passes (TimedOut).
    fn wait_writable(&mut self, deadline: Instant) -> io::Result<()>;
    /// Sends what the peer takes now of bytes the sink took but still holds (a TLS
    /// stream's ciphertext); `Ok(true)` when it holds none. A plain socket holds none.
    fn flush_now(&mut self) -> io::Result<bool> {
        Ok(true)
    }
}

impl ReplySink for Stream {
    fn send_now(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        if let Stream::Tls(s) = self {
            return s.send_now(parts);
        }
        // SAFETY: msghdr is plain old data; all-zero is a valid empty message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix; sendmsg only reads through it.
        msg.msg_iov = parts.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = parts.len() as _;
        // SAFETY: the iovecs point into buffers borrowed for the duration of the call.
        let n =
            unsafe { libc::sendmsg(self.raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn wait_writable(&mut self, deadline: Instant) -> io::Result<()> {
        self.wait_for(libc::POLLOUT, deadline)
    }

    fn flush_now(&mut self) -> io::Result<bool> {
        match self {
            Stream::Tls(s) => s.flush_now(),
            _ => Ok(true),
        }
    }
}

/// How far [`send_parts`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Every byte was written.
    Whole,
    /// The peer took only this many bytes (counting the skipped ones) by the deadline;
    /// all of them when a TLS stream took every byte but still holds ciphertext, which the
    /// next send to the stream sends first.
    Partial(usize),
}

/// Writes `parts` as one stream of bytes, skipping the first `skip` (already written),
/// and flushes what the sink holds of them (`ReplySink::flush_now`). Whenever the peer
/// takes nothing, waits for it until `deadline`; with no deadline, or once it has passed,
/// stops there ([`Progress::Partial`]).
pub(crate) fn send_parts<S: ReplySink>(
    sink: &mut S,
    parts: &[&[u8]],
    skip: usize,
    deadline: Option<Instant>,
) -> io::Result<Progress> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = skip.min(total);
    loop {
        let step = if done < total {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len());
            let mut at = 0;
            for p in parts {
                if at + p.len() > done {
                    let from = done.saturating_sub(at);
                    slices.push(IoSlice::new(&p[from..]));
                }
                at += p.len();
            }
            match sink.send_now(&slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    done += n;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            // Every byte was taken; a TLS stream may still hold some of its ciphertext.
            match sink.flush_now() {
                Ok(true) => return Ok(Progress::Whole),
                Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e),
            }
        };
        match step {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let Some(d) = deadline else {
                    return Ok(Progress::Partial(done));
                };
                match sink.wait_writable(d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        return Ok(Progress::Partial(done));
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads exactly `buf.len()` bytes by `deadline` (the time the whole of them may take).
/// A stream ending part-way is an error, as is the deadline.
pub(crate) fn read_by(
    r: &mut BufReader<Stream>,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    // A TLS read waits inside (a record may arrive in pieces), bounded by this deadline.
    let tls = r
        .get_ref()
        .tls()
        .map(|s| s.set_read_deadline(Some(deadline)))
        .is_some();
    let mut done = 0;
    let res = loop {
        if done == buf.len() {
            break Ok(());
        }
        if r.buffer().is_empty() && !tls {
            // Readable (or at its end) now, so the read below does not block.
            if let Err(e) = r.get_ref().wait_for(libc::POLLIN, deadline) {
                break Err(e);
            }
        }
        match r.read(&mut buf[done..]) {
            Ok(0) => break Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    if let Some(s) = r.get_ref().tls() {
        s.set_read_deadline(None);
    }
    res
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

/// Blocking writes, for the negotiation (bounded by its own deadline in `server.rs`).
impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Tls(s) => match bufs.iter().find(|b| !b.is_empty()) {
                Some(b) => s.write(b),
                None => Ok(0),
            },
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most 3 bytes per call and nothing on every other call, to exercise
    /// partial sends and waits.
    struct Dribble {
        got: Vec<u8>,
        calls: usize,
        waits: usize,
    }

    impl ReplySink for Dribble {
        fn send_now(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut budget = 3;
            let mut n = 0;
            for b in parts {
                let k = b.len().min(budget);
                self.got.extend_from_slice(&b[..k]);
                n += k;
                budget -= k;
                if budget == 0 {
                    break;
                }
            }
            Ok(n)
        }
        fn wait_writable(&mut self, _deadline: Instant) -> io::Result<()> {
            self.waits += 1;
            Ok(())
        }
    }

    fn dribble() -> Dribble {
        Dribble {
            got: Vec::new(),
            calls: 0,
            waits: 0,
        }
    }

    #[test]
    fn sends_survive_partial_writes_and_waits() {
        let mut d = dribble();
        let parts: [&[u8]; 4] = [b"head", b"", b"da", b"ta-tail"];
        let deadline = Instant::now() + Duration::from_secs(60);
        let r = send_parts(&mut d, &parts, 0, Some(deadline));
        assert_eq!(r.ok(), Some(Progress::Whole));
        assert_eq!(d.got, b"headdata-tail");
        assert!(d.waits > 0);
    }

    #[test]
    fn without_a_deadline_a_send_stops_where_the_peer_stopped_and_resumes_there() {
        let mut d = dribble();
        let parts: [&[u8]; 2] = [b"head", b"data-tail"];
        let r = send_parts(&mut d, &parts, 0, None);
        assert_eq!(r.ok(), Some(Progress::Partial(3)));
        assert_eq!(d.waits, 0);
        let r = send_parts(&mut d, &parts, 3, None);
        assert_eq!(r.ok(), Some(Progress::Partial(6)));
        let deadline = Instant::now() + Duration::from_secs(60);
        let r = send_parts(&mut d, &parts, 6, Some(deadline));
        assert_eq!(r.ok(), Some(Progress::Whole));
        assert_eq!(d.got, b"headdata-tail");
    }

    #[test]
    fn a_peer_that_takes_nothing_meets_the_deadline_of_the_whole_reply() {
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("pair: {e}"));
        let mut s = Stream::Unix(a);
        let big = vec![7u8; 8 << 20];
        let deadline = Instant::now() + Duration::from_millis(200);
        match send_parts(&mut s, &[&big], 0, Some(deadline)) {
            Ok(Progress::Partial(n)) => assert!(n < big.len()),
            r => panic!("{r:?}"),
        }
        drop(b);
    }
}
