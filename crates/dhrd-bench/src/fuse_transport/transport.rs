//! The two transports: mounting over /dev/fuse and its blocking read/writev loop, and FUSE
//! over io_uring (one ring per possible CPU, SQE128 URING_CMD REGISTER and
//! COMMIT_AND_FETCH). The `enable_uring` rule of the parent module holds here.

use super::*;

pub(super) fn cstr(p: &Path) -> anyhow::Result<CString> {
    Ok(CString::new(p.as_os_str().as_encoded_bytes())?)
}

pub(super) fn open_dev_fuse() -> anyhow::Result<OwnedFd> {
    // SAFETY: plain open of a device path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        bail!("open /dev/fuse: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A second descriptor on the same connection, so that each thread blocks on its own.
pub(super) fn clone_dev_fuse(master: RawFd) -> anyhow::Result<OwnedFd> {
    let fd = open_dev_fuse()?;
    let mut m: u32 = master as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the master fd) from the pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), abi::DEV_IOC_CLONE, &mut m) };
    if r != 0 {
        bail!("FUSE_DEV_IOC_CLONE: {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

pub(super) fn mount_fuse(fd: RawFd, mnt: &Path) -> anyhow::Result<()> {
    let data = format!("fd={fd},rootmode=40000,user_id=0,group_id=0,max_read={MAX_WRITE}");
    mount_fs(c"dhrd-null", mnt, c"fuse.dhrd-null", &data)
}

/// mount(2) of `source` on `mnt` (nosuid, nodev) with file system type `fstype` and `data`.
pub(super) fn mount_fs(
    source: &std::ffi::CStr,
    mnt: &Path,
    fstype: &std::ffi::CStr,
    data: &str,
) -> anyhow::Result<()> {
    let target = cstr(mnt)?;
    let data = CString::new(data)?;
    // SAFETY: valid NUL-terminated strings for the duration of the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        bail!(
            "mount {} on {}: {}",
            source.to_string_lossy(),
            mnt.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub(super) fn write_reply(fd: RawFd, unique: u64, error: i32, args: &[u8]) -> std::io::Result<()> {
    let mut hdr = [0u8; abi::OUT_HEADER_BYTES];
    encode_out_header(&mut hdr, abi::OUT_HEADER_BYTES + args.len(), error, unique);
    let iov = [
        libc::iovec {
            iov_base: hdr.as_ptr() as *mut _,
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: args.as_ptr() as *mut _,
            iov_len: args.len(),
        },
    ];
    // SAFETY: both iovecs point at live buffers of the given lengths.
    let r = unsafe { libc::writev(fd, iov.as_ptr(), 2) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the INIT handler tells the thread that waits for the connection.
pub(super) struct InitDone {
    pub(super) uring: bool,
}

/// One /dev/fuse server thread: read a request, serve it, reply, until the connection ends.
pub(super) fn legacy_loop(
    fd: RawFd,
    fs: Arc<NullFs>,
    want_uring: bool,
    init_tx: Option<mpsc::Sender<InitDone>>,
) {
    let mut buf = vec![0u8; LEGACY_BUF_BYTES];
    let mut out = vec![0u8; LEGACY_BUF_BYTES];
    loop {
        // SAFETY: reading into our own buffer of the given length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match errno() {
                // ENOENT: the request was interrupted before we got it.
                libc::EINTR | libc::EAGAIN | libc::ENOENT => continue,
                _ => return, // ENODEV after unmount/abort
            }
        }
        let n = n as usize;
        let Some(h) = parse_in_header(&buf[..n]) else {
            continue;
        };
        let args = &buf[abi::IN_HEADER_BYTES..n];
        if h.opcode == abi::INIT {
            fs.counters.count(Via::Dev, h.opcode);
            let (len, uring) = encode_init_out(args, want_uring, &mut out);
            let r = write_reply(fd, h.unique, 0, &out[..len]);
            if let Some(tx) = &init_tx {
                let _ = tx.send(InitDone {
                    uring: uring && r.is_ok(),
                });
            }
            continue;
        }
        match fs.handle(&h, Via::Dev, args, &mut out, 0) {
            Outcome::Reply { error, len } => {
                // ENOENT: the request was interrupted and is gone; nothing to do.
                let _ = write_reply(fd, h.unique, error, &out[..len]);
            }
            Outcome::NoReply => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// The io_uring transport
// ---------------------------------------------------------------------------------------

/// The header buffer of one ring entry, aligned so the kernel's copies stay in few lines.
#[repr(C, align(64))]
pub(super) struct RingHeader(pub(super) [u8; abi::RING_HEADER_BYTES]);

pub(super) struct RingEntry {
    pub(super) header: Box<RingHeader>,
    pub(super) payload: Vec<u8>,
    /// REGISTER's iovecs; the kernel copies them during submission.
    pub(super) iov: [libc::iovec; 2],
}

pub(super) fn uring_cmd(fd: RawFd, cmd_op: u32, qid: u16, commit_id: u64) -> opcode::UringCmd80 {
    // fuse_uring_cmd_req { flags u64, commit_id u64, qid u16, padding[6] } in the 80-byte area
    let mut cmd = [0u8; 80];
    put_u64(&mut cmd, 8, commit_id);
    put_u16(&mut cmd, 16, qid);
    opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd)
}

/// io-uring 0.7's UringCmd80 sets sqe->addr but not sqe->len, which REGISTER needs (the
/// iovec count). Both SQE types are repr(C) over the kernel's 128-byte layout.
pub(super) fn with_sqe_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const SQE_LEN_OFF: usize = 24;
    // SAFETY: Entry128 is repr(C) of a 64-byte io_uring_sqe and 64 command bytes, i.e.
    // exactly the kernel's SQE128 layout; `len` sits at byte 24 of io_uring_sqe.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    put_u32(&mut raw, SQE_LEN_OFF, len);
    // SAFETY: same layout back; every byte pattern is a valid SQE value.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

pub(super) fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) fn current_cpu() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::sched_getcpu() }
}

/// Per-queue statistics the queue thread keeps for the report.
#[derive(Default)]
pub(super) struct QueueStats {
    /// Requests per caller pid (thread id) in the current measurement window.
    pub(super) by_pid: HashMap<u32, u64>,
    /// Requests the queue thread served while running on another CPU than its own.
    pub(super) off_cpu: u64,
    /// Requests whose caller's previous request went to another queue (the caller
    /// changed CPU in between).
    pub(super) switched: u64,
}

pub(super) type SharedQueueStats = Arc<Vec<Mutex<QueueStats>>>;

/// Last queue each caller (pid modulo the table size) used, shared by the queue threads.
pub(super) const LAST_QUEUE_SLOTS: usize = 1 << 16;
pub(super) type LastQueue = Arc<Vec<AtomicUsize>>;

pub(super) fn possible_cpus() -> anyhow::Result<usize> {
    // "0-1" or "0-3,5": the kernel creates a queue per possible CPU and needs them all.
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        max = max.max(last.parse::<usize>()?);
    }
    Ok(max + 1)
}

/// Serves queue `qid` from a thread pinned to CPU `qid`. Sends the registration result,
/// then runs until every entry has been ended by the kernel (unmount or abort).
pub(super) fn queue_loop(
    fd: RawFd,
    qid: usize,
    fs: Arc<NullFs>,
    stats: SharedQueueStats,
    last_queue: LastQueue,
    ready: mpsc::Sender<Result<(), String>>,
) {
    if let Err(e) = pin_to_cpu(qid) {
        let _ = ready.send(Err(format!("sched_setaffinity cpu {qid}: {e}")));
        return;
    }
    let sq_entries = (ENTRIES_PER_QUEUE as u32).next_power_of_two() * 2;
    // DEFER_TASKRUN: the kernel hands requests over as task work that runs when this
    // thread enters io_uring_enter, instead of interrupting it; single issuer is required.
    let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(sq_entries)
        .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(sq_entries));
    let mut ring = match ring {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!("io_uring_setup(SQE128): {e}")));
            return;
        }
    };
    let mut ents: Vec<RingEntry> = (0..ENTRIES_PER_QUEUE)
        .map(|_| RingEntry {
            header: Box::new(RingHeader([0u8; abi::RING_HEADER_BYTES])),
            payload: vec![0u8; PAYLOAD_BYTES],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        })
        .collect();
    for (i, e) in ents.iter_mut().enumerate() {
        e.iov = [
            libc::iovec {
                iov_base: e.header.0.as_mut_ptr().cast(),
                iov_len: abi::RING_HEADER_BYTES,
            },
            libc::iovec {
                iov_base: e.payload.as_mut_ptr().cast(),
                iov_len: e.payload.len(),
            },
        ];
        let sqe = uring_cmd(fd, abi::URING_CMD_REGISTER, qid as u16, 0)
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        let sqe = with_sqe_len(sqe, abi::URING_IOV_SEGS);
        // SAFETY: the iovecs and the buffers they point to live in `ents` for the whole
        // lifetime of the ring (the ring is dropped first, at the end of this function).
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            let _ = ready.send(Err("submission queue full".into()));
            return;
        }
    }
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(format!("io_uring_enter(REGISTER): {e}")));
        return;
    }
    // A REGISTER that fails completes at once; one that succeeds stays pending until a
    // request arrives, which cannot happen before all queues are registered.
    let mut early = Vec::new();
    for cqe in ring.completion() {
        early.push((cqe.user_data(), cqe.result()));
    }
    if let Some((_, res)) = early.iter().find(|(_, r)| *r < 0) {
        let _ = ready.send(Err(format!(
            "FUSE_IO_URING_CMD_REGISTER on queue {qid}: {}",
            std::io::Error::from_raw_os_error(-res)
        )));
        return;
    }
    let _ = ready.send(Ok(()));

    let mut live = ENTRIES_PER_QUEUE;
    let mut pending: Vec<(u64, i32)> = early;
    loop {
        for (idx, res) in pending.drain(..) {
            let i = idx as usize;
            if res < 0 {
                // ENOTCONN/ECANCELED: the connection is going away; the entry is done.
                live -= 1;
                continue;
            }
            let e = &mut ents[i];
            let hdr = &mut e.header.0;
            let Some(h) = parse_in_header(&hdr[abi::RING_IN_OUT_OFF..]) else {
                live -= 1;
                continue;
            };
            let commit_id = get_u64(hdr, abi::RING_COMMIT_ID_OFF);
            let in_len = (get_u32(hdr, abi::RING_PAYLOAD_SZ_OFF) as usize).min(PAYLOAD_BYTES);
            // The first argument is in op_in; its size is what the header's total length
            // leaves after the payload (at most the op_in area).
            let op_len = (h.len as usize)
                .saturating_sub(abi::IN_HEADER_BYTES + in_len)
                .min(abi::RING_OP_IN_BYTES);
            {
                let mut st = match stats[qid].lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                *st.by_pid.entry(h.pid).or_insert(0) += 1;
                if current_cpu() != qid as i32 {
                    st.off_cpu += 1;
                }
                let slot = &last_queue[h.pid as usize % LAST_QUEUE_SLOTS];
                if slot.swap(qid + 1, Ordering::Relaxed) != qid + 1 {
                    st.switched += 1;
                }
            }
            let mut op_in = [0u8; abi::RING_OP_IN_BYTES];
            op_in[..op_len]
                .copy_from_slice(&hdr[abi::RING_OP_IN_OFF..abi::RING_OP_IN_OFF + op_len]);
            let (error, len) =
                match fs.handle(&h, Via::Ring, &op_in[..op_len], &mut e.payload, in_len) {
                    Outcome::Reply { error, len } => (error, len),
                    // Requests without a reply do not come over the ring; if one did,
                    // committing an empty reply keeps the entry in circulation.
                    Outcome::NoReply => (0, 0),
                };
            encode_out_header(
                &mut hdr[abi::RING_IN_OUT_OFF..],
                abi::OUT_HEADER_BYTES + len,
                error,
                h.unique,
            );
            put_u32(hdr, abi::RING_PAYLOAD_SZ_OFF, len as u32);
            let sqe = uring_cmd(fd, abi::URING_CMD_COMMIT_AND_FETCH, qid as u16, commit_id)
                .build()
                .user_data(idx);
            // SAFETY: the entry's buffers outlive the ring (see REGISTER above).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                live -= 1;
            }
        }
        if live == 0 {
            return;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(_) => return,
        }
        for cqe in ring.completion() {
            pending.push((cqe.user_data(), cqe.result()));
        }
    }
}
