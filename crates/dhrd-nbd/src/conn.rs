//! Transmission phase of one connection.
//!
//! Shape (leader/followers, like nbdkit's parallel thread model): up to
//! [`MAX_WORKERS_PER_CONNECTION`] threads serve one connection (and at most
//! [`MAX_WORKERS_PER_PROCESS`] worker threads serve all of them). A thread takes the reader
//! role (`gate.rs`), reads one request (header and write payload), gives the role up,
//! executes the request against the target and writes the reply under the connection's
//! writer lock. There is no hand-off of the request between a reader and a worker; while
//! one thread executes, the next one is already waiting for the next request. Only a
//! connection whose client never overlaps its requests (QD 1) keeps the role with the
//! thread that executes: its requests with small replies give the role up without
//! waking a follower, a wake-up that would otherwise sit between reading a write and
//! starting its device write (`gate.rs` bounds how long such a vacancy lasts). Threads
//! are spawned on demand: when the last idle thread takes a request.
//!
//! Invariants:
//! - a reply is written only after the target call it reports on returned;
//! - each reply is written whole under the writer lock, so replies never interleave on
//!   the wire; the client matches them by handle; a small reply that finds the lock taken
//!   is queued for the lock's holder to send, so its thread goes back to reading at once
//!   (`reply.rs`);
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
//!   connection closed by the server can flush them on the client's behalf;
//! - NBD_CMD_BLOCK_STATUS is served only after the client selected `base:allocation`; its
//!   reply has at least one extent and never reaches past the request (with REQ_ONE,
//!   exactly one), at most [`MAX_BLOCK_STATUS_EXTENTS`] of them; it reads no data.

use crate::activity::{Activity, Traffic};
use crate::gate::{Handoff, ReaderGate};
use crate::limits::{
    MAX_BLOCK_STATUS_EXTENTS, MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_REQUESTS, MAX_PAYLOAD_BYTES,
    MAX_WORKERS_PER_CONNECTION, MAX_WORKERS_PER_PROCESS, THREAD_STACK_BYTES,
};
use crate::poll::{bytes_buffered, bytes_waiting, poll_before_block, Poll, EXECUTING};
use crate::proto::*;
use crate::reply::{Borrowing, Replier};
use crate::socket::{read_by, Stream};
use crate::target::{Allocation, Extent, Target};
use crate::NbdError;
use parking_lot::{Condvar, Mutex};
use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
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
        debug_assert!(
            st.0 == 1 || st.1 <= MAX_IN_FLIGHT_BYTES,
            "in-flight budget exceeded"
        );
    }

    /// Gives back what one `acquire(bytes)` took; each job is released exactly once.
    fn release(&self, bytes: u64) {
        let mut st = self.state.lock();
        debug_assert!(
            st.0 >= 1 && st.1 >= bytes,
            "budget released more than was taken: {bytes} of {st:?}"
        );
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
    Write {
        fua: bool,
    },
    Flush,
    Trim {
        fua: bool,
    },
    Zero {
        fua: bool,
        may_punch: bool,
    },
    /// NBD_CMD_BLOCK_STATUS for `base:allocation`; `req_one`: one extent only.
    BlockStatus {
        req_one: bool,
    },
}

impl Job {
    /// The reply is small enough that sending it cannot block for long on a client busy
    /// sending requests, so the reader role may be kept through it (`gate.rs`): a header
    /// alone (or an error), or a read copied into one buffer with its header (under
    /// [`ZERO_COPY_MIN_BYTES`]).
    fn small_reply(&self) -> bool {
        match self.op {
            Op::Read => self.length < ZERO_COPY_MIN_BYTES,
            Op::BlockStatus { .. } => false,
            _ => true,
        }
    }
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

/// The reading side of a connection, owned by whichever thread holds the reader role
/// (its lock is therefore never contended).
struct ReadSide {
    reader: BufReader<Stream>,
    /// Set once reading has stopped; every thread then finishes its job and exits.
    end: Option<End>,
}

struct Shared<T: Target> {
    target: Arc<T>,
    params: ConnParams,
    read_side: Mutex<ReadSide>,
    /// Which thread reads next, and whether handing that on wakes a thread.
    gate: ReaderGate,
    /// The connection's socket, for peeks by threads without the reader role.
    socket_fd: std::os::fd::RawFd,
    /// Requests read and not yet replying (the reader's count of overlap, `gate.rs`).
    executing: AtomicUsize,
    replier: Replier,
    budget: Budget,
    /// Threads not executing a request (waiting for or holding the reader lock).
    idle: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    activity: Arc<Activity>,
}

/// Checks a request header against the export; `Err(wire errno)` means reply with that
/// error. DISC and unknown commands are handled by the caller.
fn validate(h: &RequestHeader, p: &ConnParams) -> Result<Op, u32> {
    let (size, read_only, framing) = (p.size, p.read_only, p.framing);
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let allowed_flags = match h.cmd {
        CMD_READ if framing == Framing::Structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
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
        // Only after the client selected `base:allocation` (which needed structured
        // replies): the protocol's answer otherwise is EINVAL.
        CMD_BLOCK_STATUS if p.block_status.is_some() => Op::BlockStatus {
            req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
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
    let writes = !matches!(op, Op::Read | Op::BlockStatus { .. });
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

/// Whether a command's reply must be structured once structured replies are on (a read's
/// data, a block status's extents, and their errors).
fn structured_cmd(cmd: u16) -> bool {
    matches!(cmd, CMD_READ | CMD_BLOCK_STATUS)
}

/// A block status reply's descriptors for `base:allocation`. The extents lie inside the
/// request (whose length is a u32), so every length fits.
fn descriptors(extents: &[Extent]) -> Vec<(u32, u32)> {
    extents
        .iter()
        .filter(|e| e.len > 0)
        .map(|e| {
            let flags = match e.allocation {
                Allocation::Data => 0,
                Allocation::Zero => STATE_ZERO,
                Allocation::Hole => STATE_HOLE | STATE_ZERO,
            };
            (u32::try_from(e.len).unwrap_or(u32::MAX), flags)
        })
        .collect()
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

/// Answers a block status request: extents of the range, clipped to it, at least one.
fn block_status<T: Target>(
    target: &T,
    context_id: u32,
    job: &Job,
    req_one: bool,
) -> Result<Vec<u8>, u32> {
    let max = if req_one { 1 } else { MAX_BLOCK_STATUS_EXTENTS };
    let extents = target
        .extents(job.offset, job.length.into(), max)
        .map_err(|e| report("block_status", job.offset, job.length, &e))?;
    let mut d = descriptors(&extents);
    let mut total: u64 = 0;
    d.retain(|&(len, _)| {
        let keep = total < u64::from(job.length);
        total += u64::from(len);
        keep
    });
    if let Some(last) = d.last_mut() {
        // Never past the request (REQ_ONE demands it; otherwise it is simply what we
        // know): trim the last descriptor to the requested end.
        let over = total.saturating_sub(job.length.into());
        last.0 -= over as u32;
    }
    d.truncate(max);
    if d.is_empty() {
        // The target answered nothing: all data is always true.
        d.push((job.length, 0));
    }
    debug_assert!(
        (1..=max).contains(&d.len())
            && d.iter().map(|&(len, _)| u64::from(len)).sum::<u64>() <= job.length.into()
            && d.iter().all(|&(len, _)| len > 0),
        "block status reply of {} extents for {} bytes (max {max})",
        d.len(),
        job.length
    );
    Ok(encode_block_status_reply(job.handle, context_id, &d))
}

/// What a request does once, just before its reply starts: it stops counting as
/// executing (after this a QD 1 client may send its next request, which must not see
/// this one as overlapping), and a request that gave the reader role up quietly
/// (`gate.rs`) looks for bytes the client sent while it executed, which a QD 1 client
/// cannot have sent.
struct BeforeReply<'a> {
    executing: &'a AtomicUsize,
    /// The gate and the socket to peek, for a request executed after a quiet hand-off.
    quiet: Option<(&'a ReaderGate, std::os::fd::RawFd)>,
    done: std::cell::Cell<bool>,
}

impl BeforeReply<'_> {
    fn run(&self) {
        if self.done.replace(true) {
            return;
        }
        let before = self.executing.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a request stopped executing twice");
        if let Some((gate, fd)) = self.quiet {
            if bytes_waiting(fd) {
                gate.note_overlap();
            }
        }
    }
}

/// Executes one job and sends its reply; returns whether the target call succeeded.
/// Counts the job as successful in `traffic` before its reply is sent, so a client that has
/// its reply sees it counted.
fn execute<T: Target>(
    target: &T,
    params: &ConnParams,
    job: &Job,
    replier: &Replier,
    traffic: &Traffic,
    before_reply: &BeforeReply<'_>,
) -> bool {
    let framing = params.framing;
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
                traffic.count(op, length);
                before_reply.run();
                unsent = replier.send_borrowed(head, data);
            })
        };
        // The target's memory is no longer borrowed: now the client may be waited for, up
        // to the reply deadline, and the writer lock (if this reply took it) sends the
        // replies queued meanwhile before it is let go.
        if let Some(rest) = unsent {
            replier.finish(rest);
        }
        match borrowed {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                let errno = report("read", offset, length, &e);
                before_reply.run();
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
                    traffic.count(op, length);
                    before_reply.run();
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
        Op::BlockStatus { req_one } => {
            // `validate` admits BLOCK_STATUS only once `base:allocation` is selected.
            let Some(id) = params.block_status else {
                unreachable!("BLOCK_STATUS without a selected meta context");
            };
            match block_status(target, id, job, req_one) {
                Ok(reply) => {
                    traffic.count(op, length);
                    before_reply.run();
                    replier.send(&reply);
                    return true;
                }
                Err(errno) => Err(errno),
            }
        }
    };
    let error = reply.err().unwrap_or(0);
    if error == 0 {
        traffic.count(op, length);
    }
    before_reply.run();
    let structured = matches!(op, Op::Read | Op::BlockStatus { .. });
    replier.send(&error_reply(framing, structured, handle, error));
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

/// Counting by request kind, which only this module knows.
impl Traffic {
    /// Counts a request that succeeded.
    fn count(&self, op: Op, length: u32) {
        let (counter, n) = match op {
            Op::Read => (&self.bytes_read, length.into()),
            Op::Write { .. } => (&self.bytes_written, length.into()),
            Op::BlockStatus { .. } => (&self.block_status, 1),
            _ => return,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Options fixed for the whole transmission phase of one connection.
pub(crate) struct ConnParams {
    pub framing: Framing,
    /// Context id of `base:allocation`, when the client selected it.
    pub block_status: Option<u32>,
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
    let socket_fd = reader.get_ref().raw_fd();
    let sh = Arc::new(Shared {
        target,
        params,
        read_side: Mutex::new(ReadSide { reader, end: None }),
        gate: ReaderGate::new(),
        socket_fd,
        executing: AtomicUsize::new(0),
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
    if WORKERS.fetch_add(1, Ordering::SeqCst) >= MAX_WORKERS_PER_PROCESS {
        WORKERS.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    sh.idle.fetch_add(1, Ordering::SeqCst);
    let sh2 = Arc::clone(sh);
    match std::thread::Builder::new()
        .name("dhrd-nbd-worker".into())
        .stack_size(THREAD_STACK_BYTES)
        .spawn(move || {
            serve_thread(&sh2);
            WORKERS.fetch_sub(1, Ordering::SeqCst);
        }) {
        Ok(h) => threads.push(h),
        // Out of threads: the existing ones keep serving, just with less parallelism.
        Err(_) => {
            sh.idle.fetch_sub(1, Ordering::SeqCst);
            WORKERS.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Worker threads of the whole process now (connection threads not counted); at most
/// [`MAX_WORKERS_PER_PROCESS`].
static WORKERS: AtomicUsize = AtomicUsize::new(0);

fn serve_thread<T: Target>(sh: &Arc<Shared<T>>) {
    let mut spare: Vec<u8> = Vec::new();
    let traffic = &sh.activity.traffic;
    loop {
        let Some(taken) = sh.gate.claim() else {
            sh.idle.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        if taken.takeover {
            traffic.takeovers.fetch_add(1, Ordering::Relaxed);
        }
        let read = {
            let mut rs = sh.read_side.lock();
            debug_assert!(
                rs.end.is_none(),
                "the reader role outlived the end of reading"
            );
            loop {
                match next_job(&mut rs.reader, sh, &mut spare) {
                    Ok(Some(read)) => break Ok(read),
                    // Answered with an error: the role stays with this thread.
                    Ok(None) => continue,
                    Err(end) => {
                        rs.end = Some(end);
                        break Err(());
                    }
                }
            }
        };
        let Ok((job, overlap)) = read else {
            sh.gate.end();
            sh.idle.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        let how = sh.gate.decide(overlap, job.small_reply());
        sh.gate.release(how);
        if how == Handoff::Quiet {
            traffic.quiet_handoffs.fetch_add(1, Ordering::Relaxed);
        }
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
        let before_reply = BeforeReply {
            executing: &sh.executing,
            quiet: (how == Handoff::Quiet).then_some((&sh.gate, sh.socket_fd)),
            done: std::cell::Cell::new(false),
        };
        let ok = execute(
            &*sh.target,
            &sh.params,
            &job,
            &sh.replier,
            &sh.activity.traffic,
            &before_reply,
        );
        // Every reply path ran it already; this only keeps the count right if one did not.
        before_reply.run();
        if counted {
            EXECUTING.fetch_sub(1, Ordering::Relaxed);
        }
        match job.op {
            Op::Read | Op::BlockStatus { .. } => {}
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

/// Reads the next request. `Ok(Some((job, overlap)))`: a job to execute, and whether it
/// showed that the client overlaps its requests (another of the connection's requests
/// was executing, or more bytes were already read or decrypted behind it), which
/// `gate.rs` weighs; `Ok(None)`: the request was answered with an error already; `Err`:
/// reading stops. Not counted as overlap: a request already in the socket when the
/// reader came for it, which a QD 1 client's next request can be when the reply's
/// wake-up lets the client run before this thread is back (one that arrives during a
/// quiet execution is seen before that request's reply instead, [`BeforeReply`]).
fn next_job<T: Target>(
    reader: &mut BufReader<Stream>,
    sh: &Shared<T>,
    spare: &mut Vec<u8>,
) -> Result<Option<(Job, bool)>, End> {
    if sh.replier.is_broken() {
        return Err(End::Error(NbdError::Protocol(
            "reply could not be sent".into(),
        )));
    }
    let mut hb = [0u8; REQUEST_HEADER_BYTES];
    let traffic = &sh.activity.traffic;
    match poll_before_block(reader, sh.params.poll_before_block) {
        Poll::Caught => traffic.polls_caught.fetch_add(1, Ordering::Relaxed),
        Poll::Missed => traffic.polls_missed.fetch_add(1, Ordering::Relaxed),
        Poll::Skipped | Poll::Yielded => 0,
    };
    match read_msg(reader, &mut hb) {
        Ok(true) => {}
        Ok(false) => return Err(End::Clean),
        Err(e) => return Err(End::Error(NbdError::Io(e))),
    }
    // Looked at once the header is here, not when the wait for it began: at QD 1 the
    // previous request is still executing while its successor's reader waits.
    let mut overlap = sh.executing.load(Ordering::Acquire) > 0;
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
    overlap |= bytes_buffered(reader);
    if matches!(r, Ok(Some(_))) {
        // Counted while the reader role is held, so the next reader sees it.
        sh.executing.fetch_add(1, Ordering::AcqRel);
    }
    r.map(|j| j.map(|j| (j, overlap)))
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
    let is_read = structured_cmd(h.cmd);
    if h.cmd == CMD_WRITE && h.length > MAX_PAYLOAD_BYTES {
        // The payload cannot be skipped without reading it: refuse and close.
        sh.replier
            .send(&error_reply(framing, false, h.handle, EINVAL));
        return Err(End::Error(NbdError::PayloadTooLarge {
            len: h.length.into(),
            max: MAX_PAYLOAD_BYTES.into(),
        }));
    }
    let verdict = validate(&h, p);
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
        Ok(op) => {
            // What `validate` guarantees the target (`target.rs`): a non-empty range
            // inside the export, a payload for every byte of a write.
            debug_assert!(
                op == Op::Flush
                    || (h.length > 0
                        && h.offset
                            .checked_add(h.length.into())
                            .is_some_and(|e| e <= p.size)),
                "validated request out of range"
            );
            debug_assert!(
                !matches!(op, Op::Write { .. }) || payload.len() >= h.length as usize,
                "write payload shorter than its request"
            );
            Ok(Some(Job {
                op,
                handle: h.handle,
                offset: h.offset,
                length: h.length,
                payload,
                charged,
            }))
        }
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

    fn check(h: &RequestHeader, size: u64, read_only: bool, framing: Framing) -> Result<Op, u32> {
        let p = ConnParams {
            framing,
            block_status: (framing == Framing::Structured).then_some(1),
            read_only,
            size,
            poll_before_block: Duration::ZERO,
            reply_timeout: Duration::from_secs(1),
            payload_timeout: Duration::from_secs(1),
        };
        validate(h, &p)
    }

    #[test]
    fn block_status_validation() {
        let st = Framing::Structured;
        let size = 1 << 20;
        assert_eq!(
            check(
                &hdr(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 4096),
                size,
                true,
                st
            ),
            Ok(Op::BlockStatus { req_one: true })
        );
        // Not negotiated (no meta context), past the end, empty, unknown flag.
        let s = Framing::Simple;
        assert_eq!(
            check(&hdr(CMD_BLOCK_STATUS, 0, 0, 1), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            check(&hdr(CMD_BLOCK_STATUS, 0, size, 1), size, false, st),
            Err(EINVAL)
        );
        assert_eq!(
            check(&hdr(CMD_BLOCK_STATUS, 0, 0, 0), size, false, st),
            Err(EINVAL)
        );
        assert_eq!(
            check(
                &hdr(CMD_BLOCK_STATUS, CMD_FLAG_NO_HOLE, 0, 1),
                size,
                false,
                st
            ),
            Err(EINVAL)
        );
    }

    #[test]
    fn descriptors_carry_the_allocation_flags() {
        let e = |len, allocation| Extent { len, allocation };
        assert_eq!(
            descriptors(&[
                e(4096, Allocation::Hole),
                e(512, Allocation::Zero),
                e(0, Allocation::Data),
                e(8192, Allocation::Data)
            ]),
            vec![
                (4096, STATE_HOLE | STATE_ZERO),
                (512, STATE_ZERO),
                (8192, 0)
            ]
        );
    }

    fn hdr(cmd: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        decode_request(&encode_request(flags, cmd, 1, offset, length))
    }

    #[test]
    fn validation() {
        let s = Framing::Simple;
        let size = 1 << 20;
        assert_eq!(check(&hdr(CMD_READ, 0, 0, 1), size, false, s), Ok(Op::Read));
        assert_eq!(
            check(&hdr(CMD_READ, 0, size - 1, 2), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            check(&hdr(CMD_READ, 0, u64::MAX, 2), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(check(&hdr(CMD_READ, 0, 0, 0), size, false, s), Err(EINVAL));
        assert_eq!(
            check(
                &hdr(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1),
                u64::MAX,
                false,
                s
            ),
            Err(EINVAL)
        );
        assert_eq!(
            check(&hdr(CMD_WRITE, CMD_FLAG_FUA, 10, 10), size, false, s),
            Ok(Op::Write { fua: true })
        );
        assert_eq!(
            check(&hdr(CMD_WRITE, 0, size, 1), size, false, s),
            Err(ENOSPC)
        );
        assert_eq!(check(&hdr(CMD_WRITE, 0, 0, 1), size, true, s), Err(EPERM));
        assert_eq!(check(&hdr(CMD_TRIM, 0, 0, 1), size, true, s), Err(EPERM));
        assert_eq!(
            check(&hdr(CMD_FLUSH, 0, 0, 0), size, true, s),
            Ok(Op::Flush)
        );
        assert_eq!(
            check(
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
            check(&hdr(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 8), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            check(&hdr(CMD_READ, CMD_FLAG_DF, 0, 8), size, false, s),
            Err(EINVAL)
        );
        assert_eq!(
            check(
                &hdr(CMD_READ, CMD_FLAG_DF, 0, 8),
                size,
                false,
                Framing::Structured
            ),
            Ok(Op::Read)
        );
        assert_eq!(check(&hdr(5, 0, 0, 8), size, false, s), Err(EINVAL));
        assert_eq!(check(&hdr(0x1234, 0, 0, 8), size, false, s), Err(EINVAL));
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
