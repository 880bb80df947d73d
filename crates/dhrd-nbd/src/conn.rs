//! Transmission phase of one connection.
//!
//! Shape (leader/followers, like nbdkit's parallel thread model): up to
//! [`MAX_WORKERS_PER_CONNECTION`] threads serve one connection. A thread takes the reader
//! lock, reads one request (header and write payload), releases the lock, executes the
//! request against the target and writes the reply under the connection's writer lock.
//! There is no hand-off between a reader and a worker, so a request costs no extra thread
//! wake-up; while one thread executes, the next one is already waiting for the next
//! request. Threads are spawned on demand: when the last idle thread takes a request.
//!
//! Invariants:
//! - a reply is written only after the target call it reports on returned;
//! - each reply is written whole under the writer lock, so replies never interleave on
//!   the wire; the client matches them by handle (`reply.rs`);
//! - no client can hold anything beyond its own connection for longer than a deadline:
//!   a reply must be written within `ConnParams::reply_timeout` in total, a write payload
//!   must arrive within `ConnParams::payload_timeout` of its header, in total; either
//!   miss ends the connection. A read reply sent straight from the target's memory keeps
//!   that memory borrowed while it waits for the client for at most `BORROWED_WAIT_MAX`
//!   (`reply.rs`), so a client that stops reading cannot stall the engine's loading or
//!   reclaim for other clients;
//! - the in-flight budget ([`MAX_IN_FLIGHT_BYTES`]) is taken before a payload or read
//!   buffer is allocated and given back after the reply is written (or dropped); a single
//!   maximal request always fits, so it cannot deadlock; requests in flight are bounded by
//!   the thread count;
//! - when reading stops (disconnect, NBD_CMD_DISC, bad magic, shutdown) every request
//!   already read is still executed and answered (if the socket allows) before the
//!   connection closes; nothing is leaked when the client vanishes mid-request: a
//!   partially received write is dropped without touching the target;
//! - a request is in flight ([`Activity`]) from the moment its header has been read until
//!   its reply is written, and the server closes a connection to free its slot only when
//!   none is (`Activity::try_close`, atomic with the start of a request), so a request
//!   already being received, executed or answered is never cut by that; requests whose
//!   header arrives after the decision may be cut, as at shutdown;
//! - before blocking for the next request, the reader may poll its socket with
//!   non-blocking peeks for `ConnParams::poll_before_block`; polling never consumes bytes,
//!   at most one thread of the process polls at a time, and only while at most one request
//!   executes, so it spends CPU only when the server would otherwise sleep;
//! - `Activity` records writes that no FLUSH of the connection has covered, so a
//!   connection closed by the server can flush them on the client's behalf.

use crate::limits::{
    MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_REQUESTS, MAX_PAYLOAD_BYTES, MAX_WORKERS_PER_CONNECTION,
    THREAD_STACK_BYTES,
};
use crate::proto::*;
use crate::reply::{Borrowing, Replier};
use crate::socket::{read_by, Stream};
use crate::target::Target;
use crate::NbdError;
use parking_lot::{Condvar, Mutex};
use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Per-connection bound on bytes (and, as a second guard, requests) in flight.
struct Budget {
    state: Mutex<(usize, u64)>,
    freed: Condvar,
}

impl Budget {
    fn acquire(&self, bytes: u64) {
        let mut st = self.state.lock();
        // An empty budget admits any single request, so a maximal request never waits
        // forever.
        while st.0 > 0 && (st.0 >= MAX_IN_FLIGHT_REQUESTS || st.1 + bytes > MAX_IN_FLIGHT_BYTES) {
            self.freed.wait(&mut st);
        }
        st.0 += 1;
        st.1 += bytes;
    }

    fn release(&self, bytes: u64) {
        let mut st = self.state.lock();
        st.0 = st.0.saturating_sub(1);
        st.1 = st.1.saturating_sub(bytes);
        self.freed.notify_one();
    }
}

/// Reads at least this large are sent straight from the target's memory when it can
/// (no copy into a reply buffer); smaller ones are copied, which keeps header and data
/// in one contiguous buffer and the target's memory pinned for less time.
const ZERO_COPY_MIN_BYTES: u32 = 64 << 10;

/// A validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write { fua: bool },
    Flush,
    Trim { fua: bool },
    Zero { fua: bool, may_punch: bool },
}

/// Largest payload buffer a thread keeps between requests (see [`recycle`]).
const KEEP_PAYLOAD_BUFFER_BYTES: usize = 1 << 20;

/// A request read from the wire and accepted for execution. For writes, `payload` holds
/// at least `length` bytes; only the first `length` are the request's.
struct Job {
    op: Op,
    handle: u64,
    offset: u64,
    length: u32,
    payload: Vec<u8>,
    /// Bytes charged to the budget for this job.
    charged: u64,
}

/// Keeps a finished write's payload buffer for the thread's next write if it is small
/// enough: refilling a kept buffer skips the allocation and its zeroing, and the cap
/// bounds what idle threads hold to MAX_WORKERS_PER_CONNECTION x KEEP_PAYLOAD_BUFFER_BYTES.
fn recycle(spare: &mut Vec<u8>, payload: Vec<u8>) {
    if payload.capacity() <= KEEP_PAYLOAD_BUFFER_BYTES && payload.capacity() > spare.capacity() {
        *spare = payload;
    }
}

/// The reading side of a connection, owned by whichever thread holds the lock.
struct ReadSide {
    reader: BufReader<Stream>,
    /// Set once reading has stopped; every thread then finishes its job and exits.
    end: Option<End>,
}

struct Shared<T: Target> {
    target: Arc<T>,
    params: ConnParams,
    read_side: Mutex<ReadSide>,
    replier: Replier,
    budget: Budget,
    /// Threads not executing a request (waiting for or holding the reader lock).
    idle: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    activity: Arc<Activity>,
}

/// Checks a request header against the export; `Err(wire errno)` means reply with that
/// error. DISC and unknown commands are handled by the caller.
fn validate(h: &RequestHeader, size: u64, read_only: bool, framing: Framing) -> Result<Op, u32> {
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let allowed_flags = match h.cmd {
        CMD_READ if framing == Framing::Structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => CMD_FLAG_FUA,
    };
    if h.flags & !allowed_flags != 0 {
        return Err(EINVAL);
    }
    let op = match h.cmd {
        CMD_READ => Op::Read,
        CMD_WRITE => Op::Write { fua },
        CMD_FLUSH => return Ok(Op::Flush),
        CMD_TRIM => Op::Trim { fua },
        CMD_WRITE_ZEROES => Op::Zero {
            fua,
            may_punch: h.flags & CMD_FLAG_NO_HOLE == 0,
        },
        _ => return Err(EINVAL),
    };
    if matches!(op, Op::Read) && h.length > MAX_PAYLOAD_BYTES {
        return Err(EINVAL);
    }
    if h.length == 0 {
        // A structured read reply cannot carry zero bytes of data, and a zero-length
        // write is a client bug; refuse both uniformly.
        return Err(EINVAL);
    }
    let writes = !matches!(op, Op::Read);
    if writes && read_only {
        return Err(EPERM);
    }
    match h.offset.checked_add(h.length.into()) {
        Some(end) if end <= size => Ok(op),
        // ENOSPC for writes past the end (what nbdkit and qemu-nbd do; clients map it to
        // "device full"), EINVAL for reads.
        _ if writes => Err(ENOSPC),
        _ => Err(EINVAL),
    }
}

fn error_reply(framing: Framing, is_read: bool, handle: u64, error: u32) -> Vec<u8> {
    let mut b = vec![0u8; reply_header_len(framing, is_read, error)];
    encode_reply_header(&mut b, framing, is_read, handle, error, 0, 0);
    b
}

fn report(op: &str, offset: u64, length: u32, e: &NbdError) -> u32 {
    eprintln!("dhrd nbd: {op} at {offset} (+{length}) failed: {e}");
    wire_errno(e.errno())
}

/// Executes one job and sends its reply; returns whether the target call succeeded.
fn execute<T: Target>(target: &T, framing: Framing, job: &Job, replier: &Replier) -> bool {
    let &Job {
        op,
        handle,
        offset,
        length,
        ref payload,
        ..
    } = job;
    if op == Op::Read && length >= ZERO_COPY_MIN_BYTES {
        let mut hdr = [0u8; MAX_REPLY_HEADER_BYTES];
        let hl = reply_header_len(framing, true, 0);
        encode_reply_header(&mut hdr, framing, true, handle, 0, offset, length);
        let head = &hdr[..hl];
        let mut unsent = None;
        let borrowed = {
            let _borrowing = Borrowing::start();
            target.read_borrowed(offset, length as usize, &mut |data| {
                unsent = replier.send_borrowed(head, data);
            })
        };
        match borrowed {
            Ok(true) => {
                // The target's memory is no longer borrowed: now the client may be waited
                // for, up to the reply deadline.
                if let Some(rest) = unsent {
                    replier.finish(rest);
                }
                return true;
            }
            Ok(false) => {}
            Err(e) => {
                let errno = report("read", offset, length, &e);
                replier.send(&error_reply(framing, true, handle, errno));
                return false;
            }
        }
    }
    let reply = match op {
        Op::Read => {
            let hdr = reply_header_len(framing, true, 0);
            let mut buf = vec![0u8; hdr + length as usize];
            match target.read_at(&mut buf[hdr..], offset) {
                Ok(()) => {
                    encode_reply_header(&mut buf[..hdr], framing, true, handle, 0, offset, length);
                    replier.send(&buf);
                    return true;
                }
                Err(e) => Err(report("read", offset, length, &e)),
            }
        }
        Op::Write { fua } => target
            .write_at(&payload[..length as usize], offset, fua)
            .map_err(|e| report("write", offset, length, &e)),
        Op::Flush => target.flush().map_err(|e| report("flush", 0, 0, &e)),
        Op::Trim { fua } => target
            .zero(offset, length.into(), true, fua)
            .map_err(|e| report("trim", offset, length, &e)),
        Op::Zero { fua, may_punch } => target
            .zero(offset, length.into(), may_punch, fua)
            .map_err(|e| report("write_zeroes", offset, length, &e)),
    };
    let error = reply.err().unwrap_or(0);
    replier.send(&error_reply(framing, matches!(op, Op::Read), handle, error));
    error == 0
}

/// Reads exactly `buf.len()` bytes. `Ok(false)`: clean end of stream before the first
/// byte. A stream ending part-way is an error (truncated request).
fn read_msg<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Why a connection's transmission phase ended.
#[derive(Debug)]
pub(crate) enum End {
    /// NBD_CMD_DISC or the client closed between requests.
    Clean,
    /// Protocol violation, truncated request or I/O error; logged by the caller.
    Error(NbdError),
}

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
    unflushed: AtomicBool,
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
        }
    }

    fn touch(&self) {
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
    fn begin(&self) {
        self.state.fetch_add(1, Ordering::AcqRel);
        self.touch();
    }

    /// The request's reply was written (or it was answered with an error, or dropped).
    fn end(&self) {
        self.touch();
        self.state.fetch_sub(1, Ordering::AcqRel);
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
    fn cut(&self) {
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

/// Options fixed for the whole transmission phase of one connection.
pub(crate) struct ConnParams {
    pub framing: Framing,
    pub read_only: bool,
    pub size: u64,
    /// How long a reader polls the socket before it blocks (0: never polls).
    pub poll_before_block: Duration,
    /// Time a reply may take to be written, in total.
    pub reply_timeout: Duration,
    /// Time a write payload may take to arrive, in total, from its request header.
    pub payload_timeout: Duration,
}

/// Serves requests until the client disconnects or the stream fails, then finishes every
/// request already read and returns. `writer` is a second handle of the same socket.
pub(crate) fn serve<T: Target>(
    reader: BufReader<Stream>,
    writer: Stream,
    target: Arc<T>,
    params: ConnParams,
    activity: Arc<Activity>,
) -> End {
    let replier = Replier::new(writer, params.reply_timeout);
    let sh = Arc::new(Shared {
        target,
        params,
        read_side: Mutex::new(ReadSide { reader, end: None }),
        replier,
        budget: Budget {
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
        },
        idle: AtomicUsize::new(1),
        threads: Mutex::new(Vec::new()),
        activity,
    });
    // The connection thread is the first server thread.
    serve_thread(&sh);
    // Threads are only spawned by threads holding a job, and every thread exits once
    // `end` is set, so this loop terminates.
    loop {
        let t = sh.threads.lock().pop();
        match t {
            Some(t) => {
                let _ = t.join();
            }
            None => break,
        }
    }
    if sh.replier.deadline_missed() {
        sh.activity.cut();
    }
    let end = sh.read_side.lock().end.take();
    end.unwrap_or(End::Clean)
}

/// Adds a server thread when the caller took the last idle one.
fn maybe_spawn<T: Target>(sh: &Arc<Shared<T>>) {
    if sh.idle.load(Ordering::SeqCst) > 0 {
        return;
    }
    let mut threads = sh.threads.lock();
    // +1: the connection thread itself is not in the list.
    if threads.len() + 1 >= MAX_WORKERS_PER_CONNECTION {
        return;
    }
    sh.idle.fetch_add(1, Ordering::SeqCst);
    let sh2 = Arc::clone(sh);
    match std::thread::Builder::new()
        .name("dhrd-nbd-worker".into())
        .stack_size(THREAD_STACK_BYTES)
        .spawn(move || serve_thread(&sh2))
    {
        Ok(h) => threads.push(h),
        // Out of threads: the existing ones keep serving, just with less parallelism.
        Err(_) => {
            sh.idle.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve_thread<T: Target>(sh: &Arc<Shared<T>>) {
    let mut spare: Vec<u8> = Vec::new();
    loop {
        let job = {
            let mut rs = sh.read_side.lock();
            if rs.end.is_some() {
                sh.idle.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            match next_job(&mut rs.reader, sh, &mut spare) {
                Ok(Some(job)) => job,
                Ok(None) => continue,
                Err(end) => {
                    rs.end = Some(end);
                    sh.idle.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
        };
        sh.idle.fetch_sub(1, Ordering::SeqCst);
        maybe_spawn(sh);
        let charged = job.charged;
        if job.op == Op::Flush {
            // A flush covers the writes completed before it starts; one that completes
            // later sets the mark again.
            sh.activity.unflushed.store(false, Ordering::Release);
        }
        // Counted only where readers poll: a process-wide counter costs every request.
        let counted = !sh.params.poll_before_block.is_zero();
        if counted {
            EXECUTING.fetch_add(1, Ordering::Relaxed);
        }
        let ok = execute(&*sh.target, sh.params.framing, &job, &sh.replier);
        if counted {
            EXECUTING.fetch_sub(1, Ordering::Relaxed);
        }
        match job.op {
            Op::Read => {}
            Op::Flush if ok => {}
            // A failed write may still have changed part of its range, so it counts too.
            _ => sh.activity.unflushed.store(true, Ordering::Release),
        }
        sh.activity.end();
        sh.budget.release(charged);
        recycle(&mut spare, job.payload);
        sh.idle.fetch_add(1, Ordering::SeqCst);
    }
}

/// Threads of the whole process that are polling a socket now; at most
/// [`POLLERS_MAX`], so polling never takes more than one CPU however many clients are
/// connected.
static POLLERS: AtomicUsize = AtomicUsize::new(0);
const POLLERS_MAX: usize = 1;
/// Threads of the whole process executing a request now. A reader polls only while at
/// most one does: polling pays when the server would otherwise sleep between requests,
/// and would take CPU from the requests of other clients when it is busy.
static EXECUTING: AtomicUsize = AtomicUsize::new(0);
const POLL_WHILE_EXECUTING_MAX: usize = 1;

/// Waits for the next request by polling the socket (a non-blocking peek) for up to
/// `budget` before the caller blocks in `read`. A reader blocked in `read` must be woken
/// by the kernel when the request arrives, which on a VM costs a cross-CPU interrupt
/// (about 20 us here, half of a 4 KiB read's round trip); a reader that is still polling
/// sees the bytes without one. Returns at once when data is buffered, when another thread
/// polls, or when the budget is zero.
fn poll_before_block(reader: &BufReader<Stream>, budget: Duration) {
    if budget.is_zero()
        || !reader.buffer().is_empty()
        || EXECUTING.load(Ordering::Relaxed) > POLL_WHILE_EXECUTING_MAX
    {
        return;
    }
    if POLLERS.fetch_add(1, Ordering::AcqRel) >= POLLERS_MAX {
        POLLERS.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let fd = reader.get_ref().raw_fd();
    let started = Instant::now();
    let mut byte = 0u8;
    loop {
        // SAFETY: a one-byte peek into a local on our own open socket; changes nothing.
        let r = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            break; // data, or the peer closed: the read will see it at once
        }
        let e = io::Error::last_os_error().kind();
        if e != io::ErrorKind::WouldBlock && e != io::ErrorKind::Interrupted {
            break; // let the blocking read report it
        }
        if started.elapsed() >= budget
            || EXECUTING.load(Ordering::Relaxed) > POLL_WHILE_EXECUTING_MAX
        {
            break;
        }
        std::hint::spin_loop();
    }
    POLLERS.fetch_sub(1, Ordering::AcqRel);
}

/// Reads the next request. `Ok(Some)`: a job to execute; `Ok(None)`: the request was
/// answered with an error already; `Err`: reading stops.
fn next_job<T: Target>(
    reader: &mut BufReader<Stream>,
    sh: &Shared<T>,
    spare: &mut Vec<u8>,
) -> Result<Option<Job>, End> {
    if sh.replier.is_broken() {
        return Err(End::Error(NbdError::Protocol(
            "reply could not be sent".into(),
        )));
    }
    let mut hb = [0u8; REQUEST_HEADER_BYTES];
    poll_before_block(reader, sh.params.poll_before_block);
    match read_msg(reader, &mut hb) {
        Ok(true) => {}
        Ok(false) => return Err(End::Clean),
        Err(e) => return Err(End::Error(NbdError::Io(e))),
    }
    // Busy from the header on, not from the end of the payload: a write payload still
    // arriving must not let the server choose this connection to close. Counted while
    // the reader lock is held, so a decision to close that saw nothing in flight saw no
    // request already read.
    sh.activity.begin();
    let r = request(reader, sh, spare, &hb);
    if !matches!(r, Ok(Some(_))) {
        // Answered with an error, or reading stops: no job will end it.
        sh.activity.end();
    }
    r
}

/// The rest of [`next_job`] once a request header has been read.
fn request<T: Target>(
    reader: &mut BufReader<Stream>,
    sh: &Shared<T>,
    spare: &mut Vec<u8>,
    hb: &[u8; REQUEST_HEADER_BYTES],
) -> Result<Option<Job>, End> {
    let p = &sh.params;
    let framing = p.framing;
    let h = decode_request(hb);
    if h.magic != REQUEST_MAGIC {
        return Err(End::Error(NbdError::BadMagic {
            expected: REQUEST_MAGIC.into(),
            found: h.magic.into(),
        }));
    }
    if h.cmd == CMD_DISC {
        return Err(End::Clean);
    }
    let is_read = h.cmd == CMD_READ;
    if h.cmd == CMD_WRITE && h.length > MAX_PAYLOAD_BYTES {
        // The payload cannot be skipped without reading it: refuse and close.
        sh.replier
            .send(&error_reply(framing, false, h.handle, EINVAL));
        return Err(End::Error(NbdError::PayloadTooLarge {
            len: h.length.into(),
            max: MAX_PAYLOAD_BYTES.into(),
        }));
    }
    let verdict = validate(&h, p.size, p.read_only, framing);
    let charged: u64 = match (h.cmd, &verdict) {
        (CMD_WRITE, _) | (CMD_READ, Ok(_)) => h.length.into(),
        _ => 0,
    };
    sh.budget.acquire(charged);
    let mut payload = Vec::new();
    if h.cmd == CMD_WRITE {
        let n = h.length as usize;
        payload = std::mem::take(spare);
        if payload.len() < n {
            payload.resize(n, 0);
        }
        // The deadline counts from the header, which was just read: a client that stops
        // mid-payload, or sends a byte now and then, is busy (never idle), so only this
        // deadline frees its slot.
        let deadline = Instant::now() + p.payload_timeout;
        if let Err(e) = read_by(reader, &mut payload[..n], deadline) {
            // Drop the partial write untouched.
            sh.budget.release(charged);
            let why = match e.kind() {
                io::ErrorKind::TimedOut => {
                    sh.activity.cut();
                    format!(
                        "write payload of {n} bytes not received within {:.1} s",
                        p.payload_timeout.as_secs_f64()
                    )
                }
                _ => format!("truncated write payload: {e}"),
            };
            return Err(End::Error(NbdError::Protocol(why)));
        }
    }
    match verdict {
        Ok(op) => Ok(Some(Job {
            op,
            handle: h.handle,
            offset: h.offset,
            length: h.length,
            payload,
            charged,
        })),
        Err(errno) => {
            recycle(spare, payload);
            sh.replier
                .send(&error_reply(framing, is_read, h.handle, errno));
            sh.budget.release(charged);
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(cmd: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        decode_request(&encode_request(flags, cmd, 1, offset, length))
    }

    #[test]
    fn validation() {
        let s = Framing::Simple;
        let size = 1 << 20;
        assert_eq!(
            validate(&hdr(CMD_READ, 0, 0, 1), size, false, s),
            Ok(Op::Read)
        );
        assert_eq!(
            validate(&hdr(CMD_READ, 0, size - 1, 2), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&hdr(CMD_READ, 0, u64::MAX, 2), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&hdr(CMD_READ, 0, 0, 0), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            validate(
                &hdr(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1),
                u64::MAX,
                false,
                s
            ),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&hdr(CMD_WRITE, CMD_FLAG_FUA, 10, 10), size, false, s),
            Ok(Op::Write { fua: true })
        );
        assert_eq!(
            validate(&hdr(CMD_WRITE, 0, size, 1), size, false, s),
            Err(ENOSPC)
        );
        assert_eq!(
            validate(&hdr(CMD_WRITE, 0, 0, 1), size, true, s),
            Err(EPERM)
        );
        assert_eq!(validate(&hdr(CMD_TRIM, 0, 0, 1), size, true, s), Err(EPERM));
        assert_eq!(
            validate(&hdr(CMD_FLUSH, 0, 0, 0), size, true, s),
            Ok(Op::Flush)
        );
        assert_eq!(
            validate(
                &hdr(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 8),
                size,
                false,
                s
            ),
            Ok(Op::Zero {
                fua: false,
                may_punch: false
            })
        );
        assert_eq!(
            validate(&hdr(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 8), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            validate(&hdr(CMD_READ, CMD_FLAG_DF, 0, 8), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            validate(
                &hdr(CMD_READ, CMD_FLAG_DF, 0, 8),
                size,
                false,
                Framing::Structured
            ),
            Ok(Op::Read)
        );
        assert_eq!(validate(&hdr(5, 0, 0, 8), size, false, s), Err(EINVAL));
        assert_eq!(validate(&hdr(0x1234, 0, 0, 8), size, false, s), Err(EINVAL));
    }

    #[test]
    fn budget_admits_one_oversized_request() {
        let b = Budget {
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
        };
        b.acquire(MAX_IN_FLIGHT_BYTES * 2);
        b.release(MAX_IN_FLIGHT_BYTES * 2);
        assert_eq!(*b.state.lock(), (0, 0));
    }
}
