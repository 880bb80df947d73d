//! The encrypted stream of one connection after the TLS handshake, shared by its reader
//! and writer threads: OpenSSL encrypts and decrypts in memory, and every system call on
//! the socket is made by this module, outside the session lock.
//!
//! Invariants:
//! - OpenSSL never touches the socket: its transport ([`Wire`]) is two buffers, the
//!   ciphertext received and not yet decrypted, and the ciphertext encrypted and not yet
//!   handed to the socket. The session lock is held only while OpenSSL works on them (a
//!   decryption, an encryption, a buffer swap), never during a `recv`, a `send` or a wait,
//!   so the reader and a reply writer contend for microseconds of cipher work, not for
//!   system calls;
//! - whether received bytes wait untaken (`has_pending`, asked by a reader before it
//!   polls) is a flag every read sets under the session lock, read without it: the
//!   reader never queues behind a reply writer's encryption just to ask;
//! - one reader at a time (the connection's reader lock) receives: it reads as much as
//!   the socket holds in one `recv` ([`RECV_CHUNK_BYTES`]) and hands it to OpenSSL, so
//!   requests queued on the socket cost one `recv` together, not two per record (header,
//!   then body, which is what OpenSSL does on a socket without read-ahead);
//! - ciphertext leaves in the order OpenSSL produced it: it moves from the wire to the
//!   outgoing queue under the session lock while the queue's lock is held, and the queue
//!   is sent in order. Locks are taken queue first, then session, never the other way;
//!   bytes OpenSSL writes while reading (a TLS 1.3 KeyUpdate answer) wait in the wire for
//!   the next writer, which sends them before its own;
//! - a reply's plaintext is encrypted in pieces of at most one record for small parts
//!   gathered together (a header and its data in one record, so one `send`) and at most
//!   [`TLS_WRITE_SLICE_BYTES`] otherwise; a piece counts as written once encrypted, and
//!   what the socket did not take is sent first by the next call ([`TlsStream::flush_now`]),
//!   so the reply deadlines of `socket.rs` bound it as they bound a plain socket.
//!
//! Crash semantics: none; this only moves bytes.

use crate::wait::poll_fd;
use openssl::ssl::{ErrorCode, SslStream};
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Plaintext bytes of one TLS record: small reply parts are gathered up to it, so a
/// header and its data leave in one record.
pub(crate) const TLS_RECORD_BYTES: usize = 16 << 10;
/// Most plaintext one write call encrypts while it holds the session lock, so a reader
/// never waits long behind a large reply.
const TLS_WRITE_SLICE_BYTES: usize = 64 << 10;
/// Most ciphertext one `recv` takes: several records of requests, or a large part of a
/// write payload.
const RECV_CHUNK_BYTES: usize = 64 << 10;

/// System calls a session made on its socket after the handshake (what a request and a
/// reply cost; the tests check them).
#[derive(Debug, Default)]
pub(crate) struct WireCounts {
    pub(crate) recvs: AtomicU64,
    pub(crate) sends: AtomicU64,
    /// Calls into OpenSSL's read that had nothing to decrypt and asked for more
    /// ciphertext (WANT_READ): each costs OpenSSL's record-layer entry and an error
    /// report for nothing.
    pub(crate) reads_wanting: AtomicU64,
}

/// OpenSSL's transport: memory only. Reading an empty inbox asks OpenSSL to retry
/// (WANT_READ); writing always succeeds.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    /// Received ciphertext; OpenSSL has consumed `inbox[..taken]`.
    inbox: Vec<u8>,
    taken: usize,
    /// The peer closed its side: once the inbox is consumed, reads end the stream.
    eof: bool,
    /// Encrypted bytes not yet moved to the outgoing queue.
    outbox: Vec<u8>,
}

impl Wire {
    fn unread(&self) -> &[u8] {
        &self.inbox[self.taken..]
    }

    /// Whether a read can only ask for more: no ciphertext left to hand to OpenSSL and
    /// the peer's stream not ended.
    fn starved(&self) -> bool {
        self.unread().is_empty() && !self.eof
    }

    /// Hands received ciphertext to OpenSSL: swapped in when nothing is left unread (no
    /// copy), appended after the unread rest otherwise. `bytes` comes back empty.
    pub(crate) fn feed(&mut self, bytes: &mut Vec<u8>) {
        if self.unread().is_empty() {
            std::mem::swap(&mut self.inbox, bytes);
            self.taken = 0;
        } else {
            self.inbox.drain(..self.taken);
            self.taken = 0;
            self.inbox.extend_from_slice(bytes);
        }
        bytes.clear();
    }

    /// Moves what OpenSSL encrypted to the end of `out`.
    pub(crate) fn drain_to(&mut self, out: &mut Vec<u8>) {
        if out.is_empty() {
            std::mem::swap(&mut self.outbox, out);
        } else {
            out.append(&mut self.outbox);
        }
    }

    /// Marks the end of the peer's stream.
    pub(crate) fn set_eof(&mut self) {
        self.eof = true;
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let unread = self.unread();
        if unread.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = unread.len().min(buf.len());
        buf[..n].copy_from_slice(&unread[..n]);
        self.taken += n;
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outbox.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One `recv` appended to `buf` (at most [`RECV_CHUNK_BYTES`]); 0 at the end of the
/// stream. Non-blocking unless `wait` (the socket itself is in blocking mode).
pub(crate) fn recv_into(fd: RawFd, buf: &mut Vec<u8>, wait: bool) -> io::Result<usize> {
    buf.reserve(RECV_CHUNK_BYTES);
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(RECV_CHUNK_BYTES);
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: recv writes at most `len` bytes into the vector's spare capacity, on our
    // open socket; only the bytes it reports are then counted as initialised.
    let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), len, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: recv initialised `n` <= `len` bytes after the old end.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// One non-blocking `send` (never SIGPIPE).
pub(crate) fn send_from(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: send from a buffer we borrow, on our open socket.
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Sends all of `bytes`, waiting for the socket up to `deadline` (`None`: as long as it
/// takes); for the handshake and the negotiation's replies.
pub(crate) fn send_all_by(fd: RawFd, bytes: &[u8], deadline: Option<Instant>) -> io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        match send_from(fd, &bytes[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                poll_fd(fd, libc::POLLOUT, deadline)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Ciphertext taken from the wire and not yet sent in full.
#[derive(Debug, Default)]
struct Outgoing {
    bytes: Vec<u8>,
    sent: usize,
}

struct Session {
    ssl: Mutex<SslStream<Wire>>,
    out: Mutex<Outgoing>,
    fd: OwnedFd,
    counts: WireCounts,
    /// Received bytes no read has taken (plaintext OpenSSL holds, ciphertext not yet
    /// decrypted), as the last read left them; set under the session lock by every read,
    /// so the reader (the only one who changes it) asks without the lock.
    buffered: AtomicBool,
}

/// One handle of a connection's TLS session (a reader's or the writer's). Its deadlines
/// bound its own waits for the socket (`None`: wait as long as it takes). A handle is
/// used by one thread at a time (the reader lock, the writer lock).
pub(crate) struct TlsStream {
    session: Arc<Session>,
    read_deadline: Cell<Option<Instant>>,
    write_deadline: Cell<Option<Instant>>,
    /// Ciphertext this handle received and has not handed to OpenSSL yet; kept so its
    /// allocation serves the next `recv`.
    received: RefCell<Vec<u8>>,
    /// Small reply parts gathered into one record.
    gathered: RefCell<Vec<u8>>,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsStream(fd {})", self.session.fd.as_raw_fd())
    }
}

/// Whether a session holds received bytes no read has taken.
fn held(s: &SslStream<Wire>) -> bool {
    s.ssl().pending() > 0 || !s.get_ref().unread().is_empty()
}

/// What one attempt of a TLS call asks for.
enum Attempt<T> {
    Done(T),
    /// OpenSSL needs more ciphertext than the wire holds.
    WantRead,
}

fn attempt<T>(r: Result<T, openssl::ssl::Error>) -> io::Result<Attempt<T>> {
    match r {
        Ok(v) => Ok(Attempt::Done(v)),
        Err(e) => match e.code() {
            ErrorCode::WANT_READ => Ok(Attempt::WantRead),
            _ => Err(e
                .into_io_error()
                .unwrap_or_else(|e| io::Error::other(e.to_string()))),
        },
    }
}

impl TlsStream {
    /// A session whose handshake is done; `fd` is its socket, owned from now on here.
    pub(crate) fn new(s: SslStream<Wire>, fd: OwnedFd) -> Self {
        // Bytes the client sent right behind its handshake wait in the wire.
        let buffered = AtomicBool::new(held(&s));
        Self::handle(Arc::new(Session {
            ssl: Mutex::new(s),
            out: Mutex::new(Outgoing::default()),
            fd,
            counts: WireCounts::default(),
            buffered,
        }))
    }

    fn handle(session: Arc<Session>) -> Self {
        Self {
            session,
            read_deadline: Cell::new(None),
            write_deadline: Cell::new(None),
            received: RefCell::new(Vec::new()),
            gathered: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn try_clone(&self) -> TlsStream {
        Self::handle(Arc::clone(&self.session))
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.session.fd.as_raw_fd()
    }

    /// System calls made on the socket since the handshake.
    #[cfg(test)]
    pub(crate) fn wire_counts(&self) -> &WireCounts {
        &self.session.counts
    }

    pub(crate) fn set_read_deadline(&self, d: Option<Instant>) {
        self.read_deadline.set(d);
    }

    pub(crate) fn set_write_deadline(&self, d: Option<Instant>) {
        self.write_deadline.set(d);
    }

    /// Bytes received that no read has taken yet: decrypted ones OpenSSL holds, or
    /// ciphertext not yet decrypted. Without the session lock: a reader about to poll
    /// asks this while a reply writer may be encrypting, and waiting for it would make
    /// the writer wake the reader before sending its reply. Exact for the reader (the
    /// caller holds the connection's reader lock, and only reads change it).
    pub(crate) fn has_pending(&self) -> bool {
        self.session.buffered.load(Ordering::Acquire)
    }

    /// Reads like a blocking socket, waiting (without the session lock) up to the read
    /// deadline. End of stream (a close_notify, or the peer or a shutdown closing the
    /// socket) reads as 0.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut received = self.received.borrow_mut();
        loop {
            let r = {
                let mut ssl = self.session.ssl.lock();
                if !received.is_empty() {
                    ssl.get_mut().feed(&mut received);
                }
                // Nothing to decrypt (no plaintext held, no ciphertext waiting): go
                // straight to the socket. OpenSSL reads records without read-ahead, so
                // it holds no whole record it has not decrypted; a partial one needs
                // more bytes anyway.
                let r = if ssl.ssl().pending() == 0 && ssl.get_ref().starved() {
                    None
                } else {
                    Some(ssl.ssl_read(buf))
                };
                self.session.buffered.store(held(&ssl), Ordering::Release);
                r
            };
            if let Some(r) = r {
                let r = match r {
                    Err(e) if e.code() == ErrorCode::ZERO_RETURN => return Ok(0),
                    Err(e) if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() => {
                        return Ok(0)
                    }
                    r => attempt(r)?,
                };
                if let Attempt::Done(n) = r {
                    return Ok(n);
                }
                self.session
                    .counts
                    .reads_wanting
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.receive(&mut received)?;
        }
    }

    /// One `recv` of ciphertext into `received`, without the session lock, waiting if
    /// need be. Without a read deadline the wait is the `recv` itself (one call, as on a
    /// plain socket); with one, `poll` bounds it. The end of the stream is marked on the
    /// wire.
    fn receive(&self, received: &mut Vec<u8>) -> io::Result<()> {
        let fd = self.raw_fd();
        let mut wait = self.read_deadline.get().is_none();
        loop {
            self.session.counts.recvs.fetch_add(1, Ordering::Relaxed);
            match recv_into(fd, received, wait) {
                Ok(0) => {
                    self.session.ssl.lock().get_mut().set_eof();
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Also a blocking `recv` that met a receive timeout left on the socket.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    poll_fd(fd, libc::POLLIN, self.read_deadline.get())?
                }
                Err(e) => return Err(e),
            }
            wait = false;
        }
    }

    /// Writes like a blocking socket (the negotiation's replies), up to the write
    /// deadline.
    pub(crate) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut out = self.session.out.lock();
        self.encrypt(&mut out, buf)?;
        let deadline = self.write_deadline.get();
        let r = send_all_by(self.raw_fd(), &out.bytes[out.sent..], deadline);
        out.bytes.clear();
        out.sent = 0;
        r.map(|()| buf.len())
    }

    /// Encrypts `plain` whole and queues the ciphertext (after anything OpenSSL wrote
    /// while reading).
    fn encrypt(&self, out: &mut Outgoing, plain: &[u8]) -> io::Result<()> {
        let mut ssl = self.session.ssl.lock();
        let mut done = 0;
        while done < plain.len() {
            match attempt(ssl.ssl_write(&plain[done..]))? {
                Attempt::Done(n) => done += n,
                // A write never needs to read once the handshake is done (no
                // renegotiation), and the wire takes every byte.
                Attempt::WantRead => return Err(io::Error::other("TLS write wants to read")),
            }
        }
        if out.sent == out.bytes.len() {
            out.bytes.clear();
            out.sent = 0;
        }
        ssl.get_mut().drain_to(&mut out.bytes);
        Ok(())
    }

    /// Sends what the socket takes now of the queued ciphertext; whether none is left.
    fn push(&self, out: &mut Outgoing) -> io::Result<bool> {
        while out.sent < out.bytes.len() {
            self.session.counts.sends.fetch_add(1, Ordering::Relaxed);
            match send_from(self.raw_fd(), &out.bytes[out.sent..]) {
                Ok(n) => out.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        out.bytes.clear();
        out.sent = 0;
        Ok(true)
    }

    /// Sends what the socket takes now of ciphertext already queued; `Ok(true)` when none
    /// is left. A reply is out once its plaintext is written and this is true.
    pub(crate) fn flush_now(&self) -> io::Result<bool> {
        let mut out = self.session.out.lock();
        self.push(&mut out)
    }

    /// Encrypts the start of `parts` and sends what the socket takes now, without
    /// waiting; returns the plaintext bytes taken, `WouldBlock` when ciphertext queued
    /// earlier is still unsent (nothing new is encrypted then). Small leading parts are
    /// gathered into one record.
    pub(crate) fn send_now(&self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let Some(first) = parts.iter().find(|p| !p.is_empty()) else {
            return Ok(0);
        };
        let mut out = self.session.out.lock();
        if !self.push(&mut out)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let alone = parts.iter().filter(|p| !p.is_empty()).count() == 1;
        let taken = if first.len() >= TLS_RECORD_BYTES || alone {
            // Already one piece (a reply built in one buffer): encrypted where it is.
            let slice = &first[..first.len().min(TLS_WRITE_SLICE_BYTES)];
            self.encrypt(&mut out, slice)?;
            slice.len()
        } else {
            let mut g = self.gathered.borrow_mut();
            g.clear();
            for p in parts {
                let k = p.len().min(TLS_RECORD_BYTES - g.len());
                g.extend_from_slice(&p[..k]);
                if g.len() == TLS_RECORD_BYTES {
                    break;
                }
            }
            self.encrypt(&mut out, &g)?;
            g.len()
        };
        // What the socket does not take now goes first at the next call.
        self.push(&mut out)?;
        Ok(taken)
    }

    /// Sends close_notify (and anything queued) if the socket takes it now; best effort,
    /// at the end of a connection.
    pub(crate) fn close_notify(&self) {
        let mut out = self.session.out.lock();
        {
            let mut ssl = self.session.ssl.lock();
            let _ = ssl.shutdown();
            if out.sent == out.bytes.len() {
                out.bytes.clear();
                out.sent = 0;
            }
            ssl.get_mut().drain_to(&mut out.bytes);
        }
        let _ = self.push(&mut out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::{send_parts, Progress, Stream};
    use crate::tls::{TlsCredentials, TlsServer};
    use openssl::ssl::SslVerifyMode;
    use openssl::ssl::{SslConnector, SslMethod};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    /// A client's socket that keeps a copy of every byte it reads, to count records.
    #[derive(Debug)]
    struct Tee {
        s: UnixStream,
        seen: Arc<Mutex<Vec<u8>>>,
    }

    impl Read for Tee {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.s.read(buf)?;
            self.seen.lock().extend_from_slice(&buf[..n]);
            Ok(n)
        }
    }

    impl Write for Tee {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.s.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    type Client = SslStream<Tee>;

    /// A server session and an OpenSSL client over a socket pair (PSK); the client's copy
    /// of what it read is cleared after the handshake.
    fn session_pair() -> (TlsStream, Client, Arc<Mutex<Vec<u8>>>) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let keys = dir.path().join("keys.psk");
        std::fs::write(&keys, format!("alice:{}\n", "01234567".repeat(4)))
            .unwrap_or_else(|e| panic!("{e}"));
        let server =
            TlsServer::new(&TlsCredentials::Psk { file: keys }).unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tee = Tee {
            s: b,
            seen: Arc::clone(&seen),
        };
        let client = std::thread::spawn(move || {
            let mut c =
                SslConnector::builder(SslMethod::tls_client()).unwrap_or_else(|e| panic!("{e}"));
            c.set_verify(SslVerifyMode::NONE);
            c.set_psk_client_callback(|_ssl, _hint, id, key| {
                id[..6].copy_from_slice(b"alice\0");
                let k: Vec<u8> = (0..16u8)
                    .map(|i| [0x01, 0x23, 0x45, 0x67][i as usize % 4])
                    .collect();
                key[..k.len()].copy_from_slice(&k);
                Ok(k.len())
            });
            let cfg = c.build().configure().unwrap_or_else(|e| panic!("{e}"));
            let cfg = cfg.verify_hostname(false).use_server_name_indication(false);
            cfg.connect("", tee)
                .unwrap_or_else(|e| panic!("client handshake: {e}"))
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let (s, _) = server
            .accept(OwnedFd::from(a), deadline)
            .unwrap_or_else(|e| panic!("{e}"));
        let c = client.join().unwrap_or_else(|_| panic!("client thread"));
        seen.lock().clear();
        (s, c, seen)
    }

    /// The TLS records in `bytes` (which must be whole records): their count.
    fn records(bytes: &[u8]) -> usize {
        let (mut at, mut n) = (0, 0);
        while at < bytes.len() {
            assert!(at + 5 <= bytes.len(), "a record header cut short");
            let len = u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]) as usize;
            at += 5 + len;
            n += 1;
        }
        assert_eq!(at, bytes.len(), "a record cut short");
        n
    }

    #[test]
    fn requests_queued_on_the_socket_cost_one_receive() {
        let (s, mut c, _) = session_pair();
        // Eight requests as a client at queue depth 8 sends them: one record each, all on
        // the socket before the server reads.
        for i in 0..8u8 {
            c.write_all(&[i; 28]).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut got = vec![0u8; 8 * 28];
        let mut done = 0;
        while done < got.len() {
            let n = s.read(&mut got[done..]).unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0, "end of stream");
            done += n;
        }
        for (i, r) in got.chunks(28).enumerate() {
            assert!(
                r.iter().all(|&b| b as usize == i),
                "request {i} arrived changed"
            );
        }
        let recvs = s.wire_counts().recvs.load(Ordering::Relaxed);
        assert_eq!(recvs, 1, "receive calls for eight queued requests");
    }

    #[test]
    fn a_request_awaited_at_queue_depth_one_costs_no_fruitless_openssl_read() {
        let (s, c, _) = session_pair();
        const REQUESTS: u64 = 16;
        // The client sends each request only after the server answered the one before,
        // as at queue depth 1: every read starts with nothing received.
        let client = std::thread::spawn(move || {
            let mut c = c;
            let mut ack = [0u8; 1];
            for i in 0..REQUESTS as u8 {
                c.write_all(&[i; 28])?;
                c.read_exact(&mut ack)?;
                assert_eq!(ack[0], i, "answer to request {i}");
            }
            io::Result::Ok(())
        });
        let mut w = Stream::Tls(s.try_clone());
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        for i in 0..REQUESTS as u8 {
            let mut got = [0u8; 28];
            let mut done = 0;
            while done < got.len() {
                let n = s.read(&mut got[done..]).unwrap_or_else(|e| panic!("{e}"));
                assert!(n > 0, "end of stream");
                done += n;
            }
            assert_eq!(got, [i; 28], "request {i}");
            let sent = send_parts(&mut w, &[&[i]], 0, deadline);
            assert_eq!(sent.ok(), Some(Progress::Whole));
        }
        let r = client.join().unwrap_or_else(|_| panic!("client thread"));
        r.unwrap_or_else(|e| panic!("client: {e}"));
        let counts = s.wire_counts();
        assert_eq!(
            counts.reads_wanting.load(Ordering::Relaxed),
            0,
            "OpenSSL read calls that found nothing to decrypt, over {REQUESTS} requests"
        );
        assert_eq!(counts.recvs.load(Ordering::Relaxed), REQUESTS);
    }

    #[test]
    fn whether_bytes_wait_is_known_without_waiting_for_a_writer() {
        let (s, mut c, _) = session_pair();
        c.write_all(&[5u8; 28]).unwrap_or_else(|e| panic!("{e}"));
        let mut got = [0u8; 10];
        let n = s.read(&mut got).unwrap_or_else(|e| panic!("{e}"));
        assert!(n > 0 && n <= 10, "{n}");
        assert!(s.has_pending(), "the rest of the request is held decrypted");
        // A reply writer encrypting under the session lock: the next reader, about to
        // poll, asks whether bytes are already held. It must not queue behind the
        // writer (on the reply's critical path: the writer would have to wake it
        // before it sends).
        let guard = s.session.ssl.lock();
        let reader = s.try_clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let asker = std::thread::spawn(move || {
            let _ = tx.send(reader.has_pending());
        });
        let answer = rx.recv_timeout(Duration::from_secs(20));
        drop(guard);
        let _ = asker.join();
        assert_eq!(
            answer.ok(),
            Some(true),
            "no answer while a writer held the lock"
        );
    }

    #[test]
    fn a_small_reply_is_one_record_in_one_send_and_a_large_one_is_split_and_decoded() {
        let (s, c, seen) = session_pair();
        let head = [7u8; 16];
        let small: Vec<u8> = (0..4096).map(|i| (i % 253) as u8).collect();
        let large: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let want = [&head[..], &small, &head, &large].concat();
        let len = want.len();
        let reader = std::thread::spawn(move || {
            let mut c = c;
            let mut got = vec![0u8; len];
            c.read_exact(&mut got).map(|()| got)
        });
        let mut w = Stream::Tls(s.try_clone());
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let sent = send_parts(&mut w, &[&head, &small], 0, deadline);
        assert_eq!(sent.ok(), Some(Progress::Whole));
        // The client may not have read it yet: wait for the record to be whole.
        let one = 5 + 16 + 4096 + 1 + 16;
        let until = Instant::now() + Duration::from_secs(30);
        while seen.lock().len() < one && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(records(&seen.lock()), 1, "records of a 4 KiB read's reply");
        assert_eq!(s.wire_counts().sends.load(Ordering::Relaxed), 1);
        let sent = send_parts(&mut w, &[&head, &large], 0, deadline);
        assert_eq!(sent.ok(), Some(Progress::Whole));
        let got = reader.join().ok().and_then(Result::ok);
        assert!(
            got.as_deref() == Some(&want[..]),
            "the replies arrived changed"
        );
        // 16 KiB of plaintext a record: the fewest records that hold header and data.
        let seen = seen.lock();
        assert_eq!(
            records(&seen[one..]),
            (16usize + (1 << 20)).div_ceil(16 << 10)
        );
    }

    #[test]
    fn ciphertext_the_socket_did_not_take_goes_first_when_the_reply_resumes() {
        let (s, c, _) = session_pair();
        let data: Vec<u8> = (0..8 << 20).map(|i| (i % 249) as u8).collect();
        let mut w = Stream::Tls(s.try_clone());
        // Nobody reads yet: the reply stops at its deadline, part of it encrypted and
        // held.
        let soon = Some(Instant::now() + Duration::from_millis(200));
        let done = match send_parts(&mut w, &[&data], 0, soon) {
            Ok(Progress::Partial(n)) => n,
            r => panic!("{r:?}"),
        };
        assert!(done > 0 && done < data.len(), "{done}");
        assert!(
            !s.flush_now().unwrap_or(true),
            "no ciphertext held for a socket that is full"
        );
        let len = data.len();
        let reader = std::thread::spawn(move || {
            let mut c = c;
            let mut got = vec![0u8; len];
            c.read_exact(&mut got).map(|()| got)
        });
        let later = Some(Instant::now() + Duration::from_secs(30));
        let r = send_parts(&mut w, &[&data], done, later);
        assert_eq!(r.ok(), Some(Progress::Whole));
        let got = reader.join().ok().and_then(Result::ok);
        assert!(
            got.as_deref() == Some(&data[..]),
            "the reply arrived changed"
        );
    }
}
