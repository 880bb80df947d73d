//! Listening, accepting and graceful shutdown.
//!
//! Invariants:
//! - by default only local clients can connect (`listen.rs`): a Unix socket is created
//!   with mode 0600 before it starts listening (bind, chmod, listen: no window where
//!   others can connect), and a TCP address must be loopback unless `allow_remote` is set;
//! - at most `max_connections` connections hold a slot ([`MAX_CONNECTIONS`] by default).
//!   When all are taken, a new client takes the slot of the negotiated connection that has
//!   been idle longest, if it has been idle for `idle_evict_after` ([`IDLE_EVICT_AFTER`]
//!   by default) with no request in flight; with no such connection the newcomer is
//!   closed at once (logged, counted as refused);
//! - a negotiation must be over within `handshake_timeout` ([`HANDSHAKE_TIMEOUT`] by
//!   default) in total, however the client spreads its bytes, so a client that connects
//!   and never negotiates holds its slot only that long; connections still negotiating
//!   are never evicted;
//! - with `idle_timeout` set, a negotiated connection idle that long with no request in
//!   flight is closed even when no one waits for its slot (off by default);
//! - a connection that is not idle is bounded too: a reply must be written within
//!   `reply_timeout` and a write payload must arrive within `payload_timeout` of its
//!   header, each in total ([`REPLY_TIMEOUT`], [`PAYLOAD_TIMEOUT`] by default), or the
//!   connection ends, so no client holds a slot by stopping half-way through a request;
//!   such a connection is closed by the server like an evicted one (below);
//! - the server closes a connection (eviction or idle timeout) only between requests: a
//!   request counts as in flight from its header to its reply, and the choice is atomic
//!   with the start of a request (`Activity::try_close`). Closing means closing its read
//!   side, exactly as at shutdown: every request already read is executed and answered.
//!   Then, if the connection executed writes that no FLUSH of its own covered, the target
//!   is flushed before the socket closes, since the client can no longer ask for it (in
//!   `sync` mode that flush finds nothing to do). Acknowledged writes are never dropped;
//! - [`Server::run`] returns only after every connection thread has finished (or the
//!   drain timeout passed), so the caller can flush and close the engine afterwards with
//!   no request still executing;
//! - with TLS configured, a client that asks for it (NBD_OPT_STARTTLS) is upgraded within
//!   the negotiation deadline, and one that fails the handshake (wrong key, untrusted or
//!   expired certificate) is closed before any option is answered over TLS; under
//!   `require`, a client that does not upgrade never learns anything of the export
//!   (`handshake.rs`). Handshakes, failures and refusals are counted ([`ServerStats`]);
//! - shutdown stops accepting first, then closes the read side of every connection, so
//!   requests already received are executed and answered, and no new one is read.

use crate::activity::{Activity, Traffic};
use crate::conn::{self, ConnParams, End};
use crate::handshake::{Agreed, ExportView, Negotiation, Outcome, TlsPolicy};
use crate::limits::{
    HANDSHAKE_TIMEOUT, IDLE_EVICT_AFTER, MAX_CONNECTIONS, PAYLOAD_TIMEOUT, POLL_BEFORE_BLOCK,
    READ_BUFFER_BYTES, REPLY_TIMEOUT, SHUTDOWN_DRAIN_TIMEOUT, THREAD_STACK_BYTES,
};
use crate::listen::{bind, ListenAddr, Listener};
use crate::proto::*;
use crate::socket::Stream;
use crate::target::Target;
use crate::tls::{TlsConfig, TlsServer};
use crate::NbdError;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: ListenAddr,
    /// Export name; clients asking for "" (the default export) get it too.
    pub name: String,
    pub description: String,
    /// Permit a TCP address that is not loopback.
    pub allow_remote: bool,
    /// Log connection open/close to stderr.
    pub verbose: bool,
    /// Connections holding a slot at once (at least 1).
    pub max_connections: usize,
    /// Idle time after which a negotiated connection's slot may go to a new client.
    pub idle_evict_after: Duration,
    /// Time a client has to finish negotiating, in total (must not be zero).
    pub handshake_timeout: Duration,
    /// Idle time after which a negotiated connection is closed even if no new client
    /// needs its slot; `None` (the default) keeps idle clients while slots are free.
    pub idle_timeout: Option<Duration>,
    /// How long a connection's reader polls its socket for the next request before it
    /// blocks (zero: never polls). Saves the wake-up of a blocked reader, about half of a
    /// small read's round trip on a VM, for up to one CPU of polling (one poller at a
    /// time in the process).
    pub poll_before_block: Duration,
    /// Time a reply may take to be written, in total, before the connection is ended.
    pub reply_timeout: Duration,
    /// Time a write payload may take to arrive after its request header, in total,
    /// before the connection is ended.
    pub payload_timeout: Duration,
    /// TLS (NBD_OPT_STARTTLS); `None`: STARTTLS is refused by policy.
    pub tls: Option<TlsConfig>,
}

impl ServerConfig {
    /// What an operator should be told about who can reach the export, or `None` when
    /// only local clients can, or remote ones must authenticate over TLS.
    pub fn security_warning(&self) -> Option<String> {
        let ListenAddr::Tcp(a) = &self.listen else {
            return None;
        };
        if a.ip().is_loopback() {
            return None;
        }
        match &self.tls {
            None => Some(format!(
                "{a} is reachable from other hosts without TLS: anyone who can reach it can \
                 read and overwrite the export (use --tls require with --tls-psk or \
                 --tls-certificates and --tls-verify-peer)"
            )),
            Some(t) if !t.require => Some(format!(
                "{a} is reachable from other hosts and --tls on also serves clients without \
                 TLS (use --tls require)"
            )),
            Some(t) if !t.authenticates_clients() => Some(format!(
                "{a} is reachable from other hosts and any TLS client is served: clients are \
                 not authenticated (add --tls-verify-peer, or use --tls-psk)"
            )),
            Some(_) => None,
        }
    }

    pub fn new(listen: ListenAddr) -> Self {
        Self {
            listen,
            name: String::new(),
            description: String::from("dhrd durable hybrid RAM disk"),
            allow_remote: false,
            verbose: false,
            max_connections: MAX_CONNECTIONS,
            idle_evict_after: IDLE_EVICT_AFTER,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            idle_timeout: None,
            poll_before_block: POLL_BEFORE_BLOCK,
            reply_timeout: REPLY_TIMEOUT,
            payload_timeout: PAYLOAD_TIMEOUT,
            tls: None,
        }
    }
}

/// Wakes the accept loop: one byte on a pipe it polls.
struct Waker {
    rd: OwnedFd,
    wr: OwnedFd,
}

impl Waker {
    fn new() -> io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned only here.
        Ok(unsafe {
            Self {
                rd: OwnedFd::from_raw_fd(fds[0]),
                wr: OwnedFd::from_raw_fd(fds[1]),
            }
        })
    }

    fn wake(&self) {
        let b = 1u8;
        // SAFETY: one-byte write from a live buffer; a full pipe already means "woken".
        unsafe { libc::write(self.wr.as_raw_fd(), &b as *const u8 as *const _, 1) };
    }
}

/// A live connection's entry in the registry; removing it closes the socket.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut conns = self.shared.conns.lock();
        if let Some(e) = conns.remove(&self.id) {
            e.stream.shutdown(Shutdown::Both);
            // Under the registry's lock, so a statistics reader counts it once.
            self.shared.closed.add(&e.activity.traffic);
        }
        self.shared.drained.notify_all();
    }
}

/// A live connection in the registry. Once `activity.closed_by_server()`, its read side
/// is closed and it no longer holds a slot; the entry stays until its thread has finished
/// what it had read, so a drain still waits for it.
struct Entry {
    stream: Stream,
    activity: Arc<Activity>,
}

/// Traffic of the connections that have ended (live ones count their own).
#[derive(Default)]
struct Totals {
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    block_status: AtomicU64,
    polls_caught: AtomicU64,
    polls_missed: AtomicU64,
    quiet_handoffs: AtomicU64,
    takeovers: AtomicU64,
}

impl Totals {
    fn add(&self, t: &Traffic) {
        let r = Ordering::Relaxed;
        self.requests.fetch_add(t.requests.load(r), r);
        self.bytes_read.fetch_add(t.bytes_read.load(r), r);
        self.bytes_written.fetch_add(t.bytes_written.load(r), r);
        self.block_status.fetch_add(t.block_status.load(r), r);
        self.polls_caught.fetch_add(t.polls_caught.load(r), r);
        self.polls_missed.fetch_add(t.polls_missed.load(r), r);
        self.quiet_handoffs.fetch_add(t.quiet_handoffs.load(r), r);
        self.takeovers.fetch_add(t.takeovers.load(r), r);
    }
}

/// What the server has done since it started, for status and tests: whether a refused
/// client got anywhere is read here.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections that reached the transmission phase.
    pub negotiated: u64,
    /// Request headers read in the transmission phase.
    pub requests: u64,
    /// Bytes sent by successful reads.
    pub bytes_read: u64,
    /// Bytes written by successful writes.
    pub bytes_written: u64,
    /// Block status requests answered.
    pub block_status: u64,
    /// Request headers that arrived while a reader polled for them (no wake-up), and
    /// waits where the poll budget ran out and the reader blocked (`--poll-us`).
    pub polls_caught: u64,
    pub polls_missed: u64,
    /// Requests read on a serial connection (no other request in flight or waiting, for
    /// a while) that did not wake another thread to read the next one, and quiet
    /// vacancies of the reader role that outlasted their bound (conn.rs, gate.rs).
    pub quiet_handoffs: u64,
    pub takeovers: u64,
    /// TLS handshakes that succeeded.
    pub tls_sessions: u64,
    /// TLS handshakes that failed: a wrong key or certificate, an untrusted client, or
    /// anything else that is not TLS after a STARTTLS.
    pub tls_failed: u64,
    /// Options refused with NBD_REP_ERR_TLS_REQD (a client without TLS under `require`).
    pub tls_required: u64,
}

struct Shared {
    closed: Totals,
    negotiated: AtomicU64,
    tls_sessions: AtomicU64,
    tls_failed: AtomicU64,
    tls_required: Arc<AtomicU64>,
    /// Connections closed to give their slot to a new client.
    evicted: AtomicU64,
    /// Connections closed by the idle timeout.
    idle_closed: AtomicU64,
    /// New clients closed at accept because every slot was held by a busy connection.
    refused: AtomicU64,
    stop: AtomicBool,
    waker: Waker,
    /// Live connections: control handles to close their read side (at shutdown or
    /// eviction) and what they are doing.
    conns: Mutex<HashMap<u64, Entry>>,
    drained: Condvar,
}

/// Requests a graceful shutdown of a running [`Server`] from another thread (for example
/// a signal-handling thread). Cheap to clone.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.waker.wake();
    }

    /// Connections currently open (negotiating or transmitting, including evicted ones
    /// still finishing); for status and tests.
    pub fn active_connections(&self) -> usize {
        self.0.conns.lock().len()
    }

    /// Connections evicted so far to make room for new clients.
    pub fn evicted_connections(&self) -> u64 {
        self.0.evicted.load(Ordering::Relaxed)
    }

    /// Connections closed so far by the idle timeout.
    pub fn idle_closed_connections(&self) -> u64 {
        self.0.idle_closed.load(Ordering::Relaxed)
    }

    /// New clients refused so far because no slot could be freed.
    pub fn refused_connections(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }

    /// Requests, bytes and TLS outcomes so far, over all connections.
    pub fn stats(&self) -> ServerStats {
        let r = Ordering::Relaxed;
        let sh = &self.0;
        let conns = sh.conns.lock();
        let live = |f: fn(&Traffic) -> &AtomicU64| -> u64 {
            conns.values().map(|e| f(&e.activity.traffic).load(r)).sum()
        };
        ServerStats {
            negotiated: sh.negotiated.load(r),
            requests: sh.closed.requests.load(r) + live(|t| &t.requests),
            bytes_read: sh.closed.bytes_read.load(r) + live(|t| &t.bytes_read),
            bytes_written: sh.closed.bytes_written.load(r) + live(|t| &t.bytes_written),
            block_status: sh.closed.block_status.load(r) + live(|t| &t.block_status),
            polls_caught: sh.closed.polls_caught.load(r) + live(|t| &t.polls_caught),
            polls_missed: sh.closed.polls_missed.load(r) + live(|t| &t.polls_missed),
            quiet_handoffs: sh.closed.quiet_handoffs.load(r) + live(|t| &t.quiet_handoffs),
            takeovers: sh.closed.takeovers.load(r) + live(|t| &t.takeovers),
            tls_sessions: sh.tls_sessions.load(r),
            tls_failed: sh.tls_failed.load(r),
            tls_required: sh.tls_required.load(r),
        }
    }
}

/// Counts of what the server did, returned by [`Server::run`].
#[derive(Debug, Default, Clone, Copy)]
pub struct ServeSummary {
    pub connections: u64,
    pub refused: u64,
    /// Idle connections closed to give their slot to a new client.
    pub evicted: u64,
    /// Connections closed by the idle timeout.
    pub idle_closed: u64,
    /// Connections still running when the drain timeout passed.
    pub abandoned: usize,
}

/// An NBD server exporting one target.
pub struct Server<T: Target> {
    tls: Option<Arc<TlsServer>>,
    target: Arc<T>,
    cfg: ServerConfig,
    listener: Listener,
    shared: Arc<Shared>,
}

/// A server's checked configuration, with its TLS credentials loaded and its address
/// tried (bound and let go again), and no target yet: a start makes this first, so that a
/// configuration that cannot serve (zero limits, unreadable credentials, an address in use
/// or in a directory that does not exist) fails before anything is created or opened for
/// the export. The socket itself is bound only by [`Server::on`], once the export can be
/// served: clients (and scripts waiting for the socket) never reach a server that is still
/// opening its backing, or that then fails to.
pub struct Prepared {
    tls: Option<Arc<TlsServer>>,
    cfg: ServerConfig,
}

impl Prepared {
    pub fn new(cfg: ServerConfig) -> Result<Self, NbdError> {
        let prepared = Self::checked(cfg)?;
        drop(bind(&prepared.cfg.listen, prepared.cfg.allow_remote)?);
        Ok(prepared)
    }

    /// The limits checked and the credentials loaded, the address not tried: for a caller
    /// that binds it at once ([`Server::bind`]).
    fn checked(cfg: ServerConfig) -> Result<Self, NbdError> {
        if cfg.max_connections == 0 {
            return Err(NbdError::Config(
                "the connection limit must be at least 1".into(),
            ));
        }
        // A zero timeout would end every negotiation, or every connection between two
        // requests.
        if [
            cfg.handshake_timeout,
            cfg.reply_timeout,
            cfg.payload_timeout,
        ]
        .iter()
        .any(Duration::is_zero)
            || cfg.idle_timeout.is_some_and(|t| t.is_zero())
        {
            return Err(NbdError::Config(
                "the handshake, reply, payload and idle timeouts must be longer than zero".into(),
            ));
        }
        // Credentials are loaded before the socket exists: bad ones fail the start.
        let tls = match &cfg.tls {
            Some(t) => Some(Arc::new(TlsServer::new(&t.credentials)?)),
            None => None,
        };
        Ok(Self { tls, cfg })
    }
}

impl<T: Target> Server<T> {
    /// Checks `cfg` and binds its socket for `target` (what [`Prepared::new`] checks, but
    /// the address tried only once, by the bind itself).
    pub fn bind(target: T, cfg: ServerConfig) -> Result<Self, NbdError> {
        Self::on(Prepared::checked(cfg)?, target)
    }

    /// Binds the socket of a prepared configuration for `target`. Clients can connect
    /// (and queue) from here on; they are served once [`Server::run`] is called.
    pub fn on(prepared: Prepared, target: T) -> Result<Self, NbdError> {
        let Prepared { tls, cfg } = prepared;
        let listener = bind(&cfg.listen, cfg.allow_remote)?;
        Ok(Self {
            tls,
            target: Arc::new(target),
            cfg,
            listener,
            shared: Arc::new(Shared {
                closed: Totals::default(),
                negotiated: AtomicU64::new(0),
                tls_sessions: AtomicU64::new(0),
                tls_failed: AtomicU64::new(0),
                tls_required: Arc::new(AtomicU64::new(0)),
                stop: AtomicBool::new(false),
                waker: Waker::new()?,
                conns: Mutex::new(HashMap::new()),
                drained: Condvar::new(),
                evicted: AtomicU64::new(0),
                idle_closed: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shared))
    }

    /// The bound address (with the real port when TCP port 0 was requested).
    pub fn local_addr(&self) -> ListenAddr {
        match &self.listener {
            Listener::Unix { path, .. } => ListenAddr::Unix(path.clone()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => ListenAddr::Tcp(a),
                Err(_) => self.cfg.listen.clone(),
            },
        }
    }

    pub fn target(&self) -> &Arc<T> {
        &self.target
    }

    fn tflags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            // A FLUSH makes every completed write durable whichever connection sent it
            // (the engine's flush covers the whole object), which is what multi-conn means.
            | TFLAG_CAN_MULTI_CONN;
        if self.target.is_read_only() {
            f |= TFLAG_READ_ONLY;
        } else {
            f |= TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;
        }
        f
    }

    /// Accepts and serves connections until [`ShutdownHandle::shutdown`] is called, then
    /// drains: stops accepting, lets every connection finish the requests it has read,
    /// and returns when all connection threads are done.
    pub fn run(self) -> Result<ServeSummary, NbdError> {
        let mut summary = ServeSummary::default();
        let next_id = AtomicU64::new(0);
        while !self.shared.stop.load(Ordering::SeqCst) {
            // Without an idle timeout only a client or a shutdown can wake the loop.
            let poll_ms = match self.cfg.idle_timeout {
                Some(t) => poll_ms(self.close_idle(t)),
                None => -1,
            };
            let mut pfd = [
                libc::pollfd {
                    fd: self.listener.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.shared.waker.rd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: pfd is a live array of two pollfd structures.
            let rc = unsafe { libc::poll(pfd.as_mut_ptr(), 2, poll_ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if pfd[0].revents == 0 {
                continue;
            }
            let stream = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    // EMFILE and friends: report and keep serving existing clients.
                    eprintln!("dhrd nbd: accept failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
            };
            if let Err(why) = self.make_room() {
                self.shared.refused.fetch_add(1, Ordering::Relaxed);
                eprintln!("dhrd nbd: refusing a new client: {why}");
                stream.shutdown(Shutdown::Both);
                continue;
            }
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.spawn_connection(id, stream) {
                eprintln!("dhrd nbd: cannot start a connection thread: {e}");
                continue;
            }
            summary.connections += 1;
        }
        drop(self.listener);
        summary.abandoned = drain(&self.shared);
        summary.evicted = self.shared.evicted.load(Ordering::Relaxed);
        summary.idle_closed = self.shared.idle_closed.load(Ordering::Relaxed);
        summary.refused = self.shared.refused.load(Ordering::Relaxed);
        Ok(summary)
    }

    /// Finds a slot for a new client: a free one, or the one of the negotiated connection
    /// idle longest (at least `idle_evict_after`, nothing in flight), which is closed for
    /// it. `Err` says why there is none, for the log.
    fn make_room(&self) -> Result<(), String> {
        let conns = self.shared.conns.lock();
        let held: Vec<(&u64, &Entry)> = conns
            .iter()
            .filter(|(_, e)| !e.activity.closed_by_server())
            .collect();
        if held.len() < self.cfg.max_connections {
            return Ok(());
        }
        let grace = self.cfg.idle_evict_after;
        let mut idle: Vec<(Duration, u64, &Entry)> = held
            .iter()
            .filter_map(|(id, e)| e.activity.idle_for().map(|d| (d, **id, *e)))
            .filter(|(d, _, _)| *d >= grace)
            .collect();
        idle.sort_by_key(|c| std::cmp::Reverse(c.0));
        // Idle longest first; one may turn busy between the scan and `try_close`, then
        // the next is tried.
        for (_, id, e) in idle {
            if let Some(d) = e.activity.try_close(grace) {
                e.stream.shutdown(Shutdown::Read);
                self.shared.evicted.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "dhrd nbd: connection {id}, idle for {:.1} s, gives its slot to a new client",
                    d.as_secs_f64()
                );
                return Ok(());
            }
        }
        let negotiating = held
            .iter()
            .filter(|(_, e)| e.activity.is_negotiating())
            .count();
        Err(format!(
            "all {} slots are taken ({negotiating} negotiating, {} busy or active in the \
             last {:.1} s); raise the connection limit if this recurs",
            self.cfg.max_connections,
            held.len() - negotiating,
            grace.as_secs_f64()
        ))
    }

    /// Closes every negotiated connection idle for `timeout` with nothing in flight;
    /// returns how long until the next one could reach it.
    fn close_idle(&self, timeout: Duration) -> Duration {
        let conns = self.shared.conns.lock();
        let mut next = timeout;
        for (id, e) in conns.iter() {
            let Some(idle) = e.activity.idle_for() else {
                // Negotiating, busy or already closing: once idle again it has a whole
                // `timeout` to go, which `next` already allows for.
                continue;
            };
            if idle < timeout {
                next = next.min(timeout - idle);
            } else if let Some(d) = e.activity.try_close(timeout) {
                e.stream.shutdown(Shutdown::Read);
                self.shared.idle_closed.fetch_add(1, Ordering::Relaxed);
                if self.cfg.verbose {
                    eprintln!(
                        "dhrd nbd: connection {id} idle for {:.1} s: closing it (idle timeout)",
                        d.as_secs_f64()
                    );
                }
            }
        }
        next
    }

    fn spawn_connection(&self, id: u64, stream: Stream) -> Result<(), NbdError> {
        let control = stream.try_clone()?;
        let activity = Arc::new(Activity::new());
        {
            let mut conns = self.shared.conns.lock();
            conns.insert(
                id,
                Entry {
                    stream: control,
                    activity: Arc::clone(&activity),
                },
            );
            // `make_room` freed a slot just before, on this thread, and connections only
            // ever give theirs up meanwhile.
            let held = conns
                .values()
                .filter(|e| !e.activity.closed_by_server())
                .count();
            assert!(
                held <= self.cfg.max_connections,
                "{held} connections hold one of {} slots",
                self.cfg.max_connections
            );
        }
        let shared = Arc::clone(&self.shared);
        let target = Arc::clone(&self.target);
        let view = ExportView {
            name: self.cfg.name.clone(),
            description: self.cfg.description.clone(),
            size: self.target.size(),
            tflags: self.tflags(),
        };
        let cfg = self.cfg.clone();
        let tls = self.tls.clone();
        let r = std::thread::Builder::new()
            .name(format!("dhrd-nbd-conn{id}"))
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || {
                // Deregisters even if the connection panics, so a drain never waits for
                // a connection that no longer exists.
                let reg = Registration { shared, id };
                let res = connection(
                    stream,
                    target,
                    &view,
                    &cfg,
                    activity,
                    &reg.shared,
                    tls.as_deref(),
                );
                match &res {
                    Ok(()) if cfg.verbose => eprintln!("dhrd nbd: connection {id} closed"),
                    Ok(()) => {}
                    Err(e) => eprintln!("dhrd nbd: connection {id} closed: {e}"),
                }
            });
        if let Err(e) = r {
            self.shared.conns.lock().remove(&id);
            return Err(e.into());
        }
        Ok(())
    }
}

/// Closes the read side of every connection and waits for them to finish their
/// in-flight requests; returns how many were still running at the deadline.
fn drain(shared: &Shared) -> usize {
    let deadline = Instant::now() + SHUTDOWN_DRAIN_TIMEOUT;
    let mut conns = shared.conns.lock();
    for e in conns.values() {
        e.stream.shutdown(Shutdown::Read);
    }
    while !conns.is_empty() {
        if shared.drained.wait_until(&mut conns, deadline).timed_out() {
            break;
        }
    }
    conns.len()
}

/// Milliseconds for `poll(2)` until `d` has passed, rounded up so the loop never wakes
/// before it.
fn poll_ms(d: Duration) -> libc::c_int {
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
}

/// Time left until `deadline`, or the error that ends a negotiation past it.
fn time_left(deadline: Instant, limit: Duration) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "negotiation not finished within {:.1} s",
                limit.as_secs_f64()
            ),
        ));
    }
    Ok(left)
}

/// The negotiation's reads, each bounded by what is left of one deadline: a per-read
/// timeout alone would let a client that sends a byte now and then keep its slot for ever.
struct HandshakeReader<'a> {
    r: &'a mut BufReader<Stream>,
    deadline: Instant,
    limit: Duration,
}

impl Read for HandshakeReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = time_left(self.deadline, self.limit)?;
        self.r.get_ref().set_read_timeout(Some(left))?;
        match self.r.read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                time_left(self.deadline, self.limit)?;
                Err(e)
            }
            r => r,
        }
    }
}

/// The negotiation's writes, bounded by the same deadline (a client that does not read
/// its option replies must not outlast it either).
struct HandshakeWriter<'a> {
    w: &'a mut Stream,
    deadline: Instant,
    limit: Duration,
}

impl Write for HandshakeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = time_left(self.deadline, self.limit)?;
        self.w.set_write_timeout(Some(left))?;
        match self.w.write(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                time_left(self.deadline, self.limit)?;
                Err(e)
            }
            r => r,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// One connection from greeting to close.
fn connection<T: Target>(
    stream: Stream,
    target: Arc<T>,
    view: &ExportView,
    cfg: &ServerConfig,
    activity: Arc<Activity>,
    shared: &Shared,
    tls: Option<&TlsServer>,
) -> Result<(), NbdError> {
    let limit = cfg.handshake_timeout;
    let deadline = Instant::now() + limit;
    let (reader, writer, agreed) = match negotiate(stream, view, cfg, shared, tls, deadline)? {
        Some(n) => n,
        None => return Ok(()),
    };
    // Transmission: a client may idle between requests for as long as it likes, unless
    // all slots are taken and a new client needs one (`make_room`) or an idle timeout is
    // set (`close_idle`). Replies and payloads have their own deadlines (`ConnParams`);
    // replies are sent without blocking, so the socket's write timeout plays no part.
    reader.get_ref().set_read_timeout(None)?;
    writer.set_write_timeout(None)?;
    activity.set_transmitting();
    shared.negotiated.fetch_add(1, Ordering::Relaxed);
    let params = ConnParams {
        framing: agreed.framing,
        block_status: agreed.block_status,
        read_only: view.tflags & TFLAG_READ_ONLY != 0,
        size: view.size,
        poll_before_block: cfg.poll_before_block,
        reply_timeout: cfg.reply_timeout,
        payload_timeout: cfg.payload_timeout,
    };
    let session = writer.tls().map(|s| s.try_clone());
    let end = conn::serve(
        reader,
        writer,
        Arc::clone(&target),
        params,
        Arc::clone(&activity),
    );
    if let Some(s) = session {
        // Every reply is out: tell a TLS client the stream ends here on purpose.
        s.close_notify();
    }
    if activity.closed_by_server() && activity.has_unflushed_writes() {
        // The server, not the client, ended this connection (to free its slot, at the
        // idle timeout, or at a missed reply or payload deadline), so the client cannot
        // send the FLUSH it may have meant to: make its acknowledged writes durable now,
        // before the socket closes. In `sync` mode they already are and this is cheap.
        if let Err(e) = target.flush() {
            eprintln!(
                "dhrd nbd: flushing the writes of a connection the server closed failed: {e}"
            );
        }
    }
    match end {
        End::Clean => Ok(()),
        End::Error(e) => Err(e),
    }
}

/// The negotiation, with the TLS upgrade when the client asks for it; `None` when the
/// client left. Returns the streams to serve (encrypted after a STARTTLS) and what was
/// agreed.
fn negotiate(
    stream: Stream,
    view: &ExportView,
    cfg: &ServerConfig,
    shared: &Shared,
    tls: Option<&TlsServer>,
    deadline: Instant,
) -> Result<Option<(BufReader<Stream>, Stream, Agreed)>, NbdError> {
    let limit = cfg.handshake_timeout;
    let policy = match (&cfg.tls, tls) {
        (Some(t), Some(_)) if t.require => TlsPolicy::Require,
        (Some(_), Some(_)) => TlsPolicy::On,
        _ => TlsPolicy::Off,
    };
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let greeted = Negotiation::greet(
        &mut HandshakeReader {
            r: &mut reader,
            deadline,
            limit,
        },
        &mut HandshakeWriter {
            w: &mut writer,
            deadline,
            limit,
        },
        policy,
    )?;
    let Some(mut n) = greeted else {
        return Ok(None);
    };
    n.count_refusals_in(Arc::clone(&shared.tls_required));
    loop {
        let outcome = n.haggle(
            &mut HandshakeReader {
                r: &mut reader,
                deadline,
                limit,
            },
            &mut HandshakeWriter {
                w: &mut writer,
                deadline,
                limit,
            },
            view,
        );
        match outcome? {
            Outcome::Closed => return Ok(None),
            Outcome::Transmission(agreed) => return Ok(Some((reader, writer, agreed))),
            Outcome::StartTls => {}
        }
        let Some(tls) = tls else {
            // The negotiation acknowledges STARTTLS only under a TLS policy.
            return Err(NbdError::Protocol(
                "STARTTLS without TLS credentials".into(),
            ));
        };
        if !reader.buffer().is_empty() {
            // Bytes sent after STARTTLS and before the handshake were sent in plaintext:
            // reading them as if they had come through TLS would let anyone on the path
            // inject options (the STARTTLS injection attacks on other protocols).
            shared.tls_failed.fetch_add(1, Ordering::Relaxed);
            return Err(NbdError::Tls(
                "plaintext data after NBD_OPT_STARTTLS, before the handshake".into(),
            ));
        }
        drop(writer);
        match tls.accept(reader.into_inner().into_plain_fd()?, deadline) {
            Ok((s, about)) => {
                let s = Stream::Tls(s);
                shared.tls_sessions.fetch_add(1, Ordering::Relaxed);
                if cfg.verbose {
                    eprintln!("dhrd nbd: TLS session: {about}");
                }
                writer = s.try_clone()?;
                reader = BufReader::with_capacity(READ_BUFFER_BYTES, s);
                n.tls_started();
            }
            Err(e) => {
                shared.tls_failed.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
}
