//! NBD frontend of dhrd: exports one hybrid object of the engine as a network block
//! device (fixed-newstyle NBD protocol) over a Unix socket or TCP, optionally with TLS
//! (x509 certificates or pre-shared keys, client authentication).
//!
//! Layering (each module states its own invariants):
//! - [`proto`]: wire constants and codec, no I/O;
//! - [`handshake`]: option haggling up to NBD_OPT_GO / NBD_OPT_EXPORT_NAME;
//! - `conn`: the transmission phase of one connection (a few threads taking turns to
//!   read requests, executing them in parallel, replies matched by handle under one
//!   writer lock);
//! - `reply`: that writer lock, the queue of small replies that found it taken, the
//!   reply deadline, and the bound on how long borrowed RAM may wait for a client;
//! - `socket`: the socket and its deadline-bounded reads and writes;
//! - `tls`: TLS credentials, the handshake after NBD_OPT_STARTTLS, and the encrypted
//!   stream a connection's threads share;
//! - [`server`]: listening sockets, accepting, graceful shutdown;
//! - [`client`]: a minimal blocking client (with TLS) for tests and tools;
//! - [`target`]: the narrow interface the server calls, implemented for the engine's
//!   `HybridObject<D>` for every `D: dhrd_io::Durable`.
//!
//! Invariants of the crate as a whole:
//! - this crate only translates protocol requests into engine calls; durability (sync /
//!   fsync / periodic) is the engine's; the only durability decision taken here is that a
//!   FUA request in a non-`sync` mode is followed by a flush before its reply;
//! - a reply is sent only after the engine call it reports on has returned, so an
//!   acknowledged write is exactly as durable as the engine made it;
//! - no buffer is allocated from a client-supplied length before that length is checked
//!   against [`limits::MAX_PAYLOAD_BYTES`] and the per-connection in-flight budget.

mod activity;
pub mod client;
mod conn;
mod engine;
mod error;
mod gate;
pub mod handshake;
mod listen;
mod poll;
pub mod proto;
mod reply;
pub mod server;
mod socket;
pub mod target;
mod tls;
mod tls_stream;
mod wait;

pub use engine::EngineTarget;
pub use error::NbdError;
pub use listen::ListenAddr;
pub use server::{Prepared, Server, ServerConfig, ServerStats, ShutdownHandle};
pub use target::Target;
pub use tls::{read_psk_file, TlsConfig, TlsCredentials};

/// Every bound the server enforces, in one place.
pub mod limits {
    use std::time::Duration;

    /// Largest READ or WRITE payload (advertised as the maximum block size). Larger writes
    /// are refused and the connection closed, because their payload cannot be skipped
    /// without reading it.
    pub const MAX_PAYLOAD_BYTES: u32 = 32 << 20;
    /// Advertised minimum block size: the engine accepts any offset and length (D2).
    pub const MIN_BLOCK_BYTES: u32 = 1;
    /// Advertised preferred block size: below it the engine would do partial-page work.
    pub const PREFERRED_BLOCK_BYTES: u32 = 4096;
    /// Longest option payload accepted during negotiation (export names are at most
    /// 4096 bytes by the protocol; anything much larger is hostile).
    pub const MAX_OPTION_BYTES: u32 = 64 << 10;
    /// Options one connection may send before NBD_OPT_GO; bounds a client that loops.
    pub const MAX_OPTIONS_PER_HANDSHAKE: usize = 256;
    /// A client must finish negotiating within this time in total, not per read (the
    /// default of `ServerConfig::handshake_timeout`), so a client that connects and never
    /// negotiates, or sends a byte now and then, cannot hold a slot and a thread for ever.
    pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
    /// A reply not written whole within this time (the client stopped reading, or takes
    /// a byte now and then) ends the connection, releasing the memory its replies hold
    /// (the default of `ServerConfig::reply_timeout`). Counted for the whole reply, not
    /// per system call. Long enough for a 32 MiB reply at 1 MiB/s with room to spare.
    pub const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
    /// Longest a reply holds bytes borrowed from the target's memory (a zero-copy view of
    /// the RAM tier) while it waits for the writer lock or for the client to take them;
    /// what the client has not taken by then is copied out and the view ends. A client
    /// that keeps up takes a 1 MiB reply well within it on loopback, so large reads stay
    /// zero-copy; a stalled one delays the engine's reclaim of evicted RAM by at most
    /// this per reply (never a load: the loader does not wait for views).
    pub const BORROWED_WAIT_MAX: Duration = Duration::from_millis(1);
    /// A write payload not received whole within this time of its request header ends
    /// the connection (the default of `ServerConfig::payload_timeout`): a client that
    /// stops mid-payload is busy, not idle, so neither idle eviction nor the idle timeout
    /// would ever free its slot. Counted for the whole payload; sized like
    /// [`REPLY_TIMEOUT`].
    pub const PAYLOAD_TIMEOUT: Duration = Duration::from_secs(120);
    /// Requests of one connection being served at once (a second guard; the thread count
    /// below is the first).
    pub const MAX_IN_FLIGHT_REQUESTS: usize = 128;
    /// Payload bytes (write data and read buffers) one connection may hold at once. One
    /// maximal request always fits, so the budget can never deadlock a connection.
    pub const MAX_IN_FLIGHT_BYTES: u64 = 128 << 20;
    /// Threads serving one connection, spawned on demand; also the bound on its requests
    /// executing at once, and so on its writes at the device at once: a `sync` write
    /// holds its thread for the device's whole latency, so a client that keeps N writes
    /// queued has N of them at the device only with N threads. 64 covers fio's deepest
    /// benchmark queue (32) and qemu (16 requests per connection) with room; deeper
    /// queues (the kernel's client keeps up to 128) wait in the socket beyond it.
    pub const MAX_WORKERS_PER_CONNECTION: usize = 64;
    /// Worker threads of the whole process, beyond each connection's own thread. Each may
    /// keep a payload buffer and the file backing's O_DIRECT bounce buffer, up to 1 MiB
    /// each, between requests, so this bounds that memory at what 64 connections of 16
    /// threads could keep before the per-connection bound grew; a connection that finds
    /// it reached keeps serving with the threads it has.
    pub const MAX_WORKERS_PER_PROCESS: usize = 1024;
    /// Connections served at once (the default of `ServerConfig::max_connections`). When
    /// all are taken, a new client gets the slot of the connection idle longest, if one
    /// has been idle for `IDLE_EVICT_AFTER` with no request in flight; otherwise it is
    /// closed at accept.
    pub const MAX_CONNECTIONS: usize = 64;
    /// How long a negotiated connection with no request in flight must have been idle
    /// before a new client may take its slot (the default of
    /// `ServerConfig::idle_evict_after`). Long enough that a client between two requests
    /// of a burst is never chosen; short enough that idle clients cannot lock others out.
    pub const IDLE_EVICT_AFTER: Duration = Duration::from_secs(10);
    /// Default time a connection's reader polls its socket before it blocks (see
    /// `ServerConfig::poll_before_block`). 4 KiB random reads at QD1 through fio's nbd
    /// engine on a 2-vCPU VM: 18-24k IOPS without polling, 28-36k with 50 us; 8 clients
    /// and writes unchanged or better (polling stops while others execute requests).
    pub const POLL_BEFORE_BLOCK: Duration = Duration::from_micros(50);
    /// Most extents in one block status reply (32 KiB of descriptors). The protocol lets a
    /// reply cover less than asked; clients ask again from where it ended.
    pub const MAX_BLOCK_STATUS_EXTENTS: usize = 4096;
    /// Buffered reader size for request headers and write payloads.
    pub const READ_BUFFER_BYTES: usize = 256 << 10;
    /// How long a graceful shutdown waits for connections to finish in-flight requests.
    pub const SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
    /// Stack size of connection and worker threads (engine calls are shallow; data lives
    /// on the heap).
    pub const THREAD_STACK_BYTES: usize = 512 << 10;
}
