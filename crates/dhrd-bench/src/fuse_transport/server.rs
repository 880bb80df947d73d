//! Servers (mount, threads, teardown, the `enable_uring` guard), the tmpfs baseline, the
//! fio runs and the stall probe. Every mount made here is unmounted when its `Server` or
//! `TmpfsMount` is dropped.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub(super) enum Kind {
    Legacy(usize),
    Uring,
}

pub(super) struct Server {
    pub(super) kind: Kind,
    pub(super) mnt: PathBuf,
    pub(super) fs: Arc<NullFs>,
    /// /sys/fs/fuse/connections/<id>, for the abort fallback.
    pub(super) conn_id: Option<u64>,
    pub(super) fds: Vec<OwnedFd>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) alive: Arc<AtomicUsize>,
    pub(super) mounted: bool,
    pub(super) queue_stats: Option<SharedQueueStats>,
}

impl Server {
    pub(super) fn spawn(
        &mut self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> anyhow::Result<()> {
        let alive = self.alive.clone();
        alive.fetch_add(1, Ordering::SeqCst);
        let h = std::thread::Builder::new().name(name).spawn(move || {
            f();
            alive.fetch_sub(1, Ordering::SeqCst);
        })?;
        self.threads.push(h);
        Ok(())
    }

    pub(super) fn file(&self) -> PathBuf {
        self.mnt
            .join(std::str::from_utf8(FILE_NAME).unwrap_or("data"))
    }

    pub(super) fn label(&self) -> String {
        match self.kind {
            Kind::Legacy(t) => format!("legacy-{t}t"),
            Kind::Uring => "io_uring".into(),
        }
    }

    pub(super) fn wait_threads(&self, d: Duration) -> bool {
        let t0 = Instant::now();
        while self.alive.load(Ordering::SeqCst) > 0 {
            if t0.elapsed() > d {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Unmount; lazily if busy; abort the connection if the threads do not end.
    pub(super) fn shutdown(&mut self) {
        if self.mounted {
            let Ok(target) = cstr(&self.mnt) else { return };
            // SAFETY: valid path string.
            let r = unsafe { libc::umount2(target.as_ptr(), 0) };
            if r != 0 {
                eprintln!(
                    "fuse-transport: umount {}: {}; detaching",
                    self.mnt.display(),
                    std::io::Error::last_os_error()
                );
                // SAFETY: as above.
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            }
            self.mounted = false;
        }
        if !self.wait_threads(THREAD_EXIT_WAIT) {
            if let Some(id) = self.conn_id {
                eprintln!("fuse-transport: server threads still running; aborting connection {id}");
                let _ = std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), "1");
            }
            if !self.wait_threads(THREAD_EXIT_WAIT) {
                eprintln!("fuse-transport: {} threads did not exit", self.label());
                return; // leave them detached rather than close fds under them
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.fds.clear();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(super) fn conn_id_of(mnt: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mnt).ok()?.dev();
    Some(libc::minor(dev) as u64)
}

/// Sets `enable_uring` and puts the previous value back when dropped.
pub(super) struct UringParam {
    pub(super) previous: Option<String>,
}

impl UringParam {
    pub(super) fn enable() -> anyhow::Result<Self> {
        let previous = std::fs::read_to_string(ENABLE_URING_PARAM)
            .with_context(|| format!("reading {ENABLE_URING_PARAM} (CONFIG_FUSE_IO_URING?)"))?;
        let previous = previous.trim().to_string();
        if previous != "Y" {
            std::fs::write(ENABLE_URING_PARAM, "Y")
                .with_context(|| format!("writing {ENABLE_URING_PARAM}"))?;
        }
        Ok(Self {
            previous: Some(previous),
        })
    }

    pub(super) fn restore(&mut self) {
        if let Some(p) = self.previous.take() {
            if p != "Y" {
                if let Err(e) = std::fs::write(ENABLE_URING_PARAM, &p) {
                    eprintln!("fuse-transport: restoring {ENABLE_URING_PARAM}={p}: {e}");
                }
            }
        }
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        self.restore();
    }
}

pub(super) fn new_server(kind: Kind, mnt: &Path, size: u64) -> anyhow::Result<Server> {
    std::fs::create_dir_all(mnt)?;
    Ok(Server {
        kind,
        mnt: mnt.to_path_buf(),
        fs: Arc::new(NullFs::new(size)?),
        conn_id: None,
        fds: Vec::new(),
        threads: Vec::new(),
        alive: Arc::new(AtomicUsize::new(0)),
        mounted: false,
        queue_stats: None,
    })
}

pub(super) fn wait_init(rx: &mpsc::Receiver<InitDone>) -> anyhow::Result<InitDone> {
    rx.recv_timeout(Duration::from_secs(10))
        .context("no FUSE_INIT from the kernel within 10 s")
}

pub(super) fn start_legacy(mnt: &Path, threads: usize, size: u64) -> anyhow::Result<Server> {
    let mut s = new_server(Kind::Legacy(threads), mnt, size)?;
    let master = open_dev_fuse()?;
    mount_fuse(master.as_raw_fd(), mnt)?;
    s.mounted = true;
    let (tx, rx) = mpsc::channel();
    let mut fds = vec![master];
    for _ in 1..threads {
        fds.push(clone_dev_fuse(fds[0].as_raw_fd())?);
    }
    for (i, fd) in fds.iter().enumerate() {
        let (raw, fs) = (fd.as_raw_fd(), s.fs.clone());
        // Any of the cloned descriptors may be the one that reads INIT.
        let tx = Some(tx.clone());
        s.spawn(format!("null-dev{i}"), move || {
            legacy_loop(raw, fs, false, tx)
        })?;
    }
    s.fds = fds;
    wait_init(&rx)?;
    s.conn_id = conn_id_of(mnt);
    Ok(s)
}

/// Mounts the io_uring server. Err carries why registration failed (after cleanup).
pub(super) fn start_uring(mnt: &Path, size: u64) -> anyhow::Result<Server> {
    let mut param = UringParam::enable()?;
    let mut s = new_server(Kind::Uring, mnt, size)?;
    let master = open_dev_fuse()?;
    mount_fuse(master.as_raw_fd(), mnt)?;
    s.mounted = true;
    let (tx, rx) = mpsc::channel();
    let raw = master.as_raw_fd();
    s.fds.push(master);
    let fs = s.fs.clone();
    s.spawn("null-dev0".into(), move || {
        legacy_loop(raw, fs, true, Some(tx))
    })?;
    let init = wait_init(&rx)?;
    // The kernel read the switch when it sent INIT and when it processed our reply; from
    // here on the connection's own io_uring flag is what counts, so the global switch can
    // go back at once (it also governs every other FUSE mount made meanwhile).
    param.restore();
    if !init.uring {
        bail!("the kernel did not offer FUSE_OVER_IO_URING in INIT (flags2)");
    }
    let ncpu = possible_cpus()?;
    let stats: SharedQueueStats = Arc::new(
        (0..ncpu)
            .map(|_| Mutex::new(QueueStats::default()))
            .collect(),
    );
    s.queue_stats = Some(stats.clone());
    let last_queue: LastQueue =
        Arc::new((0..LAST_QUEUE_SLOTS).map(|_| AtomicUsize::new(0)).collect());
    let (rtx, rrx) = mpsc::channel();
    for q in 0..ncpu {
        let (fs, stats, rtx) = (s.fs.clone(), stats.clone(), rtx.clone());
        let lq = last_queue.clone();
        s.spawn(format!("null-q{q}"), move || {
            queue_loop(raw, q, fs, stats, lq, rtx)
        })?;
    }
    for _ in 0..ncpu {
        match rrx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("a queue thread did not report its registration"),
        }
    }
    // Not earlier: until every queue has an entry registered the kernel holds every new
    // request (even this stat) waiting for the ring.
    s.conn_id = conn_id_of(mnt);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// tmpfs baseline
// ---------------------------------------------------------------------------------------

pub(super) struct TmpfsMount {
    pub(super) mnt: PathBuf,
    pub(super) mounted: bool,
}

impl TmpfsMount {
    pub(super) fn new(mnt: &Path, size: u64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(mnt)?;
        mount_fs(
            c"tmpfs",
            mnt,
            c"tmpfs",
            &format!("size={}", size + 16 * MIB),
        )?;
        let t = Self {
            mnt: mnt.to_path_buf(),
            mounted: true,
        };
        let f = File::create(t.file())?;
        let mut block = vec![0u8; MIB as usize];
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i * 7 + 1) as u8;
        }
        let mut off = 0;
        while off < size {
            let n = (size - off).min(block.len() as u64) as usize;
            f.write_all_at(&block[..n], off)?;
            off += n as u64;
        }
        Ok(t)
    }

    pub(super) fn file(&self) -> PathBuf {
        self.mnt.join("data")
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        if self.mounted {
            if let Ok(t) = cstr(&self.mnt) {
                // SAFETY: valid path string.
                if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
                    // SAFETY: as above.
                    unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
                }
            }
            self.mounted = false;
        }
    }
}

// ---------------------------------------------------------------------------------------
// fio
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct Workload {
    pub(super) name: &'static str,
    pub(super) rw: &'static str,
    pub(super) jobs: usize,
    /// fio's cpus_allowed, to keep the caller on one CPU.
    pub(super) cpus: Option<&'static str>,
}

pub(super) const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "randread-1job",
        rw: "randread",
        jobs: 1,
        cpus: None,
    },
    // The caller pinned: the io_uring handoff then stays on one CPU in both directions,
    // where an unpinned caller is woken on the other, idle CPU (see the cpu-change share).
    Workload {
        name: "randread-1job-cpu0",
        rw: "randread",
        jobs: 1,
        cpus: Some("0"),
    },
    Workload {
        name: "randread-2jobs",
        rw: "randread",
        jobs: 2,
        cpus: None,
    },
    Workload {
        name: "randwrite-1job",
        rw: "randwrite",
        jobs: 1,
        cpus: None,
    },
];

#[derive(Clone, Debug, Serialize)]
pub(super) struct FioResult {
    pub(super) iops: f64,
    pub(super) clat_mean_us: f64,
    pub(super) clat_p99_us: f64,
}

pub(super) fn fio(file: &Path, w: &Workload, size: u64, runtime: u32) -> anyhow::Result<FioResult> {
    let mut cmd = std::process::Command::new("fio");
    if let Some(c) = w.cpus {
        cmd.arg(format!("--cpus_allowed={c}"));
    }
    let out = cmd
        .arg("--name=probe")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--rw={}", w.rw))
        .arg("--bs=4k")
        .arg("--ioengine=psync")
        .arg("--iodepth=1")
        .arg(format!("--numjobs={}", w.jobs))
        .arg("--group_reporting=1")
        .arg("--time_based=1")
        .arg(format!("--runtime={runtime}"))
        .arg(format!("--ramp_time={FIO_RAMP_SECS}"))
        .arg(format!("--size={size}"))
        .arg("--invalidate=0")
        .arg("--fallocate=none")
        .arg("--norandommap=1")
        .arg("--randrepeat=0")
        .arg("--output-format=json")
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio on {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("fio json: {}", String::from_utf8_lossy(&out.stdout)))?;
    let dir = if w.rw == "randwrite" { "write" } else { "read" };
    let j = &v["jobs"][0][dir];
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    Ok(FioResult {
        iops: f(&j["iops"]),
        clat_mean_us: f(&j["clat_ns"]["mean"]) / 1000.0,
        clat_p99_us: f(&j["clat_ns"]["percentile"]["99.000000"]) / 1000.0,
    })
}

// ---------------------------------------------------------------------------------------
// Stall probe: does one blocked request hold up others on the same queue/CPU?
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
pub(super) struct StallResult {
    pub(super) target: String,
    /// Latency of a read on CPU 0 while another read on CPU 0 is stalled in the server.
    pub(super) same_cpu_us: f64,
    /// The same with the second reader on CPU 1.
    pub(super) other_cpu_us: f64,
}

pub(super) fn stall_probe(s: &Server) -> anyhow::Result<StallResult> {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let measure = |cpu_b: usize| -> anyhow::Result<f64> {
        s.fs.stall.store(true, Ordering::SeqCst);
        let (fa, fb) = (File::open(s.file())?, File::open(s.file())?);
        let stall_off = s.fs.stall_offset();
        let a = std::thread::spawn(move || {
            let _ = pin_to_cpu(0);
            let mut b = [0u8; 4096];
            let _ = fa.read_at(&mut b, stall_off);
        });
        std::thread::sleep(STALL_PROBE_DELAY);
        let b = std::thread::spawn(move || -> f64 {
            let _ = pin_to_cpu(cpu_b);
            let mut buf = [0u8; 4096];
            let t0 = Instant::now();
            let _ = fb.read_at(&mut buf, 0);
            t0.elapsed().as_secs_f64() * 1e6
        });
        let us = b.join().unwrap_or(f64::NAN);
        let _ = a.join();
        s.fs.stall.store(false, Ordering::SeqCst);
        Ok(us)
    };
    let same = measure(0)?;
    let other = if ncpu > 1 { measure(1)? } else { f64::NAN };
    Ok(StallResult {
        target: s.label(),
        same_cpu_us: same,
        other_cpu_us: other,
    })
}
