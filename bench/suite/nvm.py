"""Experiment 11: seed 004's I/O-mechanism study (SPEC E2) on emulated NVM, HDD and the disk.

The device under test is `dhrd nbd --mem 0 --durability fsync` on a backing file, with
`--backing-timing nvm` (4.4x DRAM read, 10x DRAM write latency), `--backing-timing hdd`
(8 ms per request, 150 MB/s) or no timing (this machine's disk, read with O_DIRECT). No
RAM tier in front: every request reaches the emulated device, and a FLUSH is the device's
cache flush. The export is made a kernel block device without the nbd module: nbdfuse
exposes it as a file, a loop device (`--direct-io=on`, so no second page cache) turns the
file into a block device, and ext4 on it holds the test file. Then, per device:

- modes (paper Fig. 2, 4): 4 KiB psync reads and writes, sequential and random, buffered,
  O_SYNC (`--sync=1`) and O_DIRECT (`--direct=1`); reads start from a cold page cache, and
  buffered reads again once the file is in the page cache (`warm`, as Iozone reads a file
  it has just written). Buffered writes are a fixed amount plus the final fsync, timed on
  the wall clock, so the write-back to the device counts.
- kernel read-ahead (Fig. 5): `blockdev --setra N` on the loop device, N = 0, 32, 256, 2048
  sectors, buffered sequential 4 KiB reads from a cold cache (and random ones at 0 and 256).
- request size (Fig. 6, 7): O_DIRECT random reads and writes of 4 KiB, 64 KiB and 1 MiB:
  throughput gives the time for the same bytes, mean latency the cost of one request.
- dhrd's own read-ahead (`--read-ahead none|sequential|history`) with `--mem` a quarter
  of the export and `--no-prefill`, through fio's nbd engine: sequential and random 4 KiB.
- memory size (Fig. 3): zipf(1.2) 4 KiB reads at QD1 through fio's nbd engine with `--mem`
  1/8, 1/4, 1/2 and all of the export (no prefill; a ramp before the measured window).
"""

import json
import os
import shutil
import signal
import subprocess
import time

import lib
from lib import BenchError, log, run

K, M, G = 1 << 10, 1 << 20, 1 << 30
DEVICES = ("nvm", "hdd", "disk")
TIMING = {"nvm": ["--backing-timing", "nvm"], "hdd": ["--backing-timing", "hdd"], "disk": []}
RA_SECTORS = (0, 32, 256, 2048)
BLOCK_SIZES = (4 * K, 64 * K, 1 * M)
MEM_FRACTIONS = ((1, 8), (1, 4), (1, 2), (1, 1))
# The memory-size runs admit every miss (as a page cache does) in 256 KiB chunks, so the
# workload fills even a slow device's cache within the ramp.
MEM_CHUNK = 256 * K
# The smoke profile (`nvm_sweep` "short") keeps the points every ratio needs.
# It also leaves out O_SYNC reads (Linux ignores O_SYNC on reads) and one read-ahead policy.
SHORT = dict(ra=(0, 256), bs=(4 * K, 1 * M), mem=((1, 8), (1, 1)), read_modes=("buffered", "direct"),
             policies=("none", "history"))


def sweep(ctx, what):
    full = dict(ra=RA_SECTORS, bs=BLOCK_SIZES, mem=MEM_FRACTIONS, read_modes=("buffered", "sync", "direct"),
                policies=("none", "sequential", "history"))
    return (SHORT if ctx.p.get("nvm_sweep") == "short" else full)[what]
CHUNK = 64 * K
RAM_DIR = "/dev/shm"


class Proc:
    """A background process with its log file, stopped with SIGINT (then SIGKILL)."""

    def __init__(self, ctx, name, cmd):
        self.name = name
        self.logp = os.path.join(ctx.out, "logs", f"nvm-{name}.log")
        self.log = open(self.logp, "w")
        if lib.LOG:
            lib.LOG.write("$ " + " ".join(map(str, cmd)) + " &\n")
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=self.log, stderr=subprocess.STDOUT)

    def alive(self):
        return self.proc.poll() is None

    def tail(self):
        self.log.flush()
        return open(self.logp).read()[-2000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def dhrd_nbd(ctx, name, backing, sock, extra):
    if os.path.exists(sock):
        os.unlink(sock)
    cmd = [ctx.ws.dhrd, "nbd", "--backing", backing, "--socket", sock, "--durability", "fsync", "-v"] + extra
    p = Proc(ctx, name, cmd)
    try:
        lib.wait_for(lambda: os.path.exists(sock) or not p.alive(), lib.MOUNT_WAIT_S, f"dhrd nbd {name}")
    except BenchError:
        p.stop()
        raise
    if not p.alive():
        p.stop()
        raise BenchError(f"dhrd nbd {name} exited: {p.tail()}")
    return p


class Stack:
    """dhrd nbd -> nbdfuse file -> loop device (direct I/O) -> ext4, torn down in reverse
    even when a step fails half-way."""

    def __init__(self, ctx, device, export_bytes, backing_dir):
        self.ctx, self.device = ctx, device
        self.dir = os.path.join(ctx.ws.disk, f"nvm-{device}")
        os.makedirs(self.dir, exist_ok=True)
        self.backing = os.path.join(backing_dir, f"backing-{device}")
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.fusedir = os.path.join(self.dir, "export")
        self.mnt = os.path.join(self.dir, "mnt")
        self.export_bytes = export_bytes
        self.server = self.nbdfuse = self.loop = None
        self.mounted = self.fuse_mounted = False

    def start(self):
        try:
            with open(self.backing, "wb") as f:
                f.truncate(self.export_bytes)
            self.server = dhrd_nbd(self.ctx, f"{self.device}-fs", self.backing, self.sock,
                                   ["--mem", "0", "--no-prefill"] + TIMING[self.device])
            os.makedirs(self.fusedir, exist_ok=True)
            os.makedirs(self.mnt, exist_ok=True)
            self.nbdfuse = Proc(self.ctx, f"{self.device}-nbdfuse", ["nbdfuse", self.fusedir, "--unix", self.sock])
            nbdfile = os.path.join(self.fusedir, "nbd")
            lib.wait_for(lambda: os.path.exists(nbdfile) or not self.nbdfuse.alive(), lib.MOUNT_WAIT_S,
                         "nbdfuse")
            self.fuse_mounted = True
            if not self.nbdfuse.alive():
                raise BenchError(f"nbdfuse exited: {self.nbdfuse.tail()}")
            self.loop = run(["losetup", "-f", "--show", "--direct-io=on", nbdfile]).strip()
            run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop],
                timeout=1800)
            run(["mount", self.loop, self.mnt])
            self.mounted = True
        except BaseException:
            self.stop()
            raise
        return self

    def setra(self, sectors):
        run(["blockdev", "--setra", str(sectors), self.loop])

    def stop(self):
        errs = []
        if self.mounted:
            run(["umount", self.mnt], check=False, timeout=600)
            if os.path.ismount(self.mnt):
                run(["umount", "-l", self.mnt], check=False)
            self.mounted = False
        if self.loop:
            run(["losetup", "-d", self.loop], check=False)
            self.loop = None
        if self.fuse_mounted or (self.nbdfuse and self.nbdfuse.alive()):
            for _ in range(50):  # the loop device lets go of the file asynchronously
                run(["fusermount3", "-u", self.fusedir], check=False)
                if not os.path.ismount(self.fusedir):
                    break
                time.sleep(0.1)
            else:
                run(["fusermount3", "-uz", self.fusedir], check=False)
                errs.append("nbdfuse mount was busy; detached lazily")
            self.fuse_mounted = False
        if self.nbdfuse:
            self.nbdfuse.stop()
            self.nbdfuse = None
        if self.server:
            self.server.stop()
            self.server = None
        if os.path.exists(self.backing):
            os.unlink(self.backing)
        for e in errs:
            log(f"[11 nvm] {self.device}: {e}")


def drop_file(path):
    """Drops one file's pages from the page cache (after writing back its dirty ones): a
    cold read of it then reaches the device. Per file, not the global drop_caches, whose
    sync would wait for every other file system's dirty data too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fs_fio(name, path, size, rw, bs, mode, runtime_s, warm=False):
    args = [f"--filename={path}", f"--size={size}", f"--rw={rw}", f"--bs={bs}"]
    if warm:
        args.append("--invalidate=0")  # fio drops the file's cached pages before a job otherwise
    if mode == "sync":
        args.append("--sync=1")
    elif mode == "direct":
        args.append("--direct=1")
    return lib.fio(name, args, runtime_s)


def timed_buffered_write(path, size, io_bytes, rw):
    """A fixed amount of buffered 4 KiB writes and the fsync at the end, on the wall clock:
    the write-back to the device is part of the figure, as it is of a buffered writer's
    work sooner or later."""
    t = time.monotonic()
    run(["fio", "--name=bufw", f"--filename={path}", f"--size={size}", f"--io_size={io_bytes}", f"--rw={rw}",
         "--bs=4k", "--ioengine=psync", "--end_fsync=1", "--randrepeat=0", "--norandommap",
         "--output=/dev/null"], timeout=3600)
    s = time.monotonic() - t
    return dict(iops=io_bytes / 4096 / s, mib_s=io_bytes / M / s, lat_mean_us=s * 1e6 / (io_bytes / 4096),
                seconds=round(s, 3))


def flat(r, op):
    """IOPS, MiB/s and mean latency of one direction of a lib.fio result."""
    d = "read" if "read" in op else "write"
    return dict(iops=r.get(f"{d}_iops", 0), mib_s=r.get(f"{d}_mib_s", 0), lat_mean_us=r.get(f"{d}_lat_mean_us", 0))


def nbd_fio(uri, args, runtime_s, ramp_s=0):
    cmd = ["fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}", "--output-format=json", "--iodepth=1",
           "--time_based", f"--runtime={int(runtime_s * 1000)}ms"] + list(args)
    if ramp_s:
        cmd.append(f"--ramp_time={int(ramp_s * 1000)}ms")
    out = run(cmd, timeout=runtime_s * 4 + ramp_s + 600)
    try:
        job = json.loads(out[out.index("{"):])["jobs"][0]
    except (ValueError, json.JSONDecodeError, KeyError, IndexError) as e:
        raise BenchError(f"fio nbd: unreadable output: {out[:500]}") from e
    if job.get("error"):
        raise BenchError(f"fio nbd: error {job['error']}")
    j = job["read"]
    return dict(iops=j["iops"], mib_s=j["bw_bytes"] / M, lat_mean_us=j["lat_ns"]["mean"] / 1000)


def fs_parts(ctx, device, backing_dir, rows):
    p = ctx.p
    size, rt = p["nvm_bytes"], p["nvm_runtime_s"]
    # ext4 needs room for its own metadata and journal next to the test file.
    st = Stack(ctx, device, size + size // 4 + 64 * M, backing_dir).start()
    try:
        f = os.path.join(st.mnt, "testfile")
        t = time.monotonic()
        run(["fio", "--name=fill", f"--filename={f}", "--rw=write", "--bs=1M", f"--size={size}",
             "--refill_buffers", "--end_fsync=1", "--output=/dev/null"], timeout=3600)
        log(f"[11 nvm] {device}: ext4 on nbdfuse + loop ready, {lib.fmt_size(size)} test file written in "
            f"{time.monotonic() - t:.1f} s")
        default_ra = int(run(["blockdev", "--getra", st.loop]).strip())

        def add(part, workload, setting, r, **extra):
            rows.append(dict(device=device, part=part, workload=workload, setting=setting, **r, **extra))

        # Modes (Fig. 2, 4).
        for op in ("read", "randread", "write", "randwrite"):
            for mode in sweep(ctx, "read_modes") if "read" in op else ("buffered", "sync", "direct"):
                if mode == "buffered" and "write" in op:
                    io = size if op == "write" else max(size // 8, 4 * M)
                    drop_file(f)
                    r = timed_buffered_write(f, size, io, op)
                    add("mode", f"{op} 4K", mode + " (+fsync)", r)
                    continue
                if "read" in op:
                    drop_file(f)
                r = flat(fs_fio(f"{device}-{op}-{mode}", f, size, op, "4k", mode, rt), op)
                add("mode", f"{op} 4K", mode + (" (cold)" if "read" in op and mode != "direct" else ""), r)
            if "read" in op:
                # Anyone's global drop_caches on this machine during the run would make the
                # warm figure a cold one: the share still cached at the end is kept with it,
                # and the run repeated (up to twice) when the file did not stay cached.
                for _attempt in range(3):
                    run(["vmtouch", "-qt", f], timeout=3600)
                    r = flat(fs_fio(f"{device}-{op}-warm", f, size, op, "4k", "buffered", rt, warm=True), op)
                    cached = lib.resident_bytes(f) / size
                    if cached >= 0.99:
                        break
                    log(f"[11 nvm] {device}: {op} warm run ended with {cached:.0%} of the file cached; again")
                add("mode", f"{op} 4K", "buffered (warm)", r, cached_after=round(cached, 3))
        log(f"[11 nvm] {device}: " + ", ".join(
            f"{r['workload']} {r['setting']} {r['iops']:.0f}" for r in rows if r["device"] == device))
        # Kernel read-ahead (Fig. 5).
        for ra in sweep(ctx, "ra"):
            st.setra(ra)
            drop_file(f)
            add("kernel read-ahead", "read 4K buffered (cold)", f"setra {ra}",
                flat(fs_fio(f"{device}-ra{ra}", f, size, "read", "4k", "buffered", rt), "read"), ra_sectors=ra)
            if ra in (0, 256):
                drop_file(f)
                add("kernel read-ahead", "randread 4K buffered (cold)", f"setra {ra}",
                    flat(fs_fio(f"{device}-ra{ra}-rand", f, size, "randread", "4k", "buffered", rt), "randread"),
                    ra_sectors=ra)
        st.setra(default_ra)
        # Request size (Fig. 6, 7).
        for op in ("randread", "randwrite"):
            for bs in sweep(ctx, "bs"):
                add("request size", f"{op} O_DIRECT", f"bs {lib.fmt_size(bs)}",
                    flat(fs_fio(f"{device}-{op}-bs{bs}", f, size, op, str(bs), "direct", rt), op), bs=bs)
    finally:
        st.stop()
    return default_ra


def nbd_parts(ctx, device, data, rows):
    p = ctx.p
    size, rt = p["nvm_bytes"], p["nvm_runtime_s"]
    sock = os.path.join(ctx.ws.disk, f"nvm-{device}-cache.sock")
    uri = f"nbd+unix:///?socket={sock}"
    # dhrd's read-ahead, RAM a quarter of the export.
    for policy in sweep(ctx, "policies"):
        s = dhrd_nbd(ctx, f"{device}-ra-{policy}", data, sock,
                     ["--mem", str(size // 4), "--no-prefill", "--chunk", str(CHUNK), "--read-ahead", policy]
                     + TIMING[device])
        try:
            for rw in ("read", "randread"):
                r = nbd_fio(uri, [f"--rw={rw}", "--bs=4k", f"--size={size}", "--randrepeat=0"], rt)
                rows.append(dict(device=device, part="dhrd read-ahead", workload=f"{rw} 4K QD1, RAM 1/4",
                                 setting=f"read-ahead {policy}", **r))
        finally:
            s.stop()
    # Memory size (Fig. 3).
    for num, den in sweep(ctx, "mem"):
        s = dhrd_nbd(ctx, f"{device}-mem{num}-{den}", data, sock,
                     ["--mem", str(size * num // den), "--no-prefill", "--chunk", str(MEM_CHUNK),
                      "--cache-admit", "always"] + TIMING[device])
        try:
            r = nbd_fio(uri, ["--rw=randread", "--bs=4k", f"--size={size}", "--random_distribution=zipf:1.2",
                              "--randrepeat=1", "--norandommap"], rt, ramp_s=2 * rt)
            rows.append(dict(device=device, part="memory size", workload="zipf(1.2) randread 4K QD1",
                             setting=f"mem {num}/{den}" if num != den else "mem all", mem_fraction=num / den, **r))
        finally:
            s.stop()
    log(f"[11 nvm] {device}: " + ", ".join(
        f"{r['setting']} {r['workload'][:8]} {r['iops']:.0f}" for r in rows
        if r["device"] == device and r["part"] in ("dhrd read-ahead", "memory size")))


def exp_nvm(ctx):
    p = ctx.p
    title = "11. I/O mechanisms on emulated NVM, HDD and the disk (seed 004, SPEC E2)"
    devices = ctx.pick(list(p.get("nvm_devices", DEVICES)))
    notes = []
    have_nbdfuse = shutil.which("nbdfuse") is not None and os.path.exists("/dev/fuse")
    if not have_nbdfuse:
        notes.append("nbdfuse (or /dev/fuse) is missing: no kernel block device, so the buffered/sync/direct, "
                     "kernel read-ahead and request-size parts were skipped; only the parts through fio's nbd "
                     "engine ran.")
    rows = []
    default_ra = None
    # The emulated devices are RAM (tmpfs) with their timing, as the paper's NVM was DRAM behind
    # a delaying driver: the timing is a floor over the real operation, so a backing on the
    # disk would make the "NVM" as slow as the disk. The disk device's backing is on the disk.
    ram_dir = os.path.join(RAM_DIR, f"dhrd-suite-nvm.{os.getpid()}")
    os.makedirs(ram_dir, exist_ok=True)
    try:
        for device in devices:
            bdir = ctx.ws.disk if device == "disk" else ram_dir
            if have_nbdfuse:
                default_ra = fs_parts(ctx, device, bdir, rows)
            data = os.path.join(bdir, f"nvm-data-{device}")
            lib.fill_file(data, p["nvm_bytes"])
            try:
                nbd_parts(ctx, device, data, rows)
            finally:
                os.unlink(data)
    finally:
        shutil.rmtree(ram_dir, ignore_errors=True)

    def get(device, part, workload, setting, key="iops"):
        for r in rows:
            if (r["device"], r["part"], r["workload"], r["setting"]) == (device, part, workload, setting):
                return r.get(key)
        return None

    ratios = []

    def add(what, num, den, figure, baseline):
        if num and den:
            ratios.append({"what": what, "figure": figure, "baseline": baseline, "value": num / den})

    pairs = [(a, b) for a, b in (("nvm", "hdd"), ("nvm", "disk")) if a in devices and b in devices]
    for a, b in pairs:
        # Fig. 2: buffered reads alike across devices, buffered writes not.
        for wl, st, key in (("read 4K", "buffered (warm)", "mib_s"), ("randread 4K", "buffered (warm)", "iops"),
                            ("read 4K", "buffered (cold)", "mib_s"), ("randread 4K", "buffered (cold)", "iops"),
                            ("write 4K", "buffered (+fsync)", "mib_s"), ("randwrite 4K", "buffered (+fsync)", "mib_s")):
            add(f"Fig. 2: {wl} {st}", get(a, "mode", wl, st, key), get(b, "mode", wl, st, key), a, b)
    for d in devices:
        # Fig. 4: uncached I/O against the page cache; sync against direct.
        add(f"Fig. 4 ({d}): randread 4K O_DIRECT vs buffered (warm)", get(d, "mode", "randread 4K", "direct"),
            get(d, "mode", "randread 4K", "buffered (warm)"), "direct", "buffered (warm)")
        add(f"Fig. 4 ({d}): randread 4K O_DIRECT vs buffered (cold)", get(d, "mode", "randread 4K", "direct"),
            get(d, "mode", "randread 4K", "buffered (cold)"), "direct", "buffered (cold)")
        for wl in ("write 4K", "randwrite 4K"):
            add(f"Fig. 4 ({d}): {wl} O_DIRECT vs buffered+fsync at end", get(d, "mode", wl, "direct"),
                get(d, "mode", wl, "buffered (+fsync)"), "direct", "buffered (+fsync)")
            add(f"Fig. 4 ({d}): {wl} O_DIRECT vs O_SYNC", get(d, "mode", wl, "direct"), get(d, "mode", wl, "sync"),
                "direct", "sync")
        # Fig. 5: kernel read-ahead.
        seq = "read 4K buffered (cold)"
        ra = {n: get(d, "kernel read-ahead", seq, f"setra {n}", "mib_s") for n in RA_SECTORS}
        add(f"Fig. 5 ({d}): sequential read, read-ahead 32 pages vs off", ra[256], ra[0], "setra 256", "setra 0")
        add(f"Fig. 5 ({d}): sequential read, read-ahead 1 MiB vs 32 pages", ra[2048], ra[256], "setra 2048",
            "setra 256")
        add(f"Fig. 5 ({d}): random read, read-ahead 32 pages vs off",
            get(d, "kernel read-ahead", "randread 4K buffered (cold)", "setra 256"),
            get(d, "kernel read-ahead", "randread 4K buffered (cold)", "setra 0"), "setra 256", "setra 0")
        # Fig. 6, 7: request size. Same bytes: time ratio = inverse throughput ratio.
        for op in ("randread", "randwrite"):
            wl = f"{op} O_DIRECT"
            add(f"Fig. 6 ({d}): {op}, time for the same bytes in 4 KiB vs 1 MiB requests",
                get(d, "request size", wl, "bs 1M", "mib_s"), get(d, "request size", wl, "bs 4K", "mib_s"),
                "bs 4K", "bs 1M")
            add(f"Fig. 7 ({d}): {op}, time of one 1 MiB request vs one 4 KiB (256x the bytes)",
                get(d, "request size", wl, "bs 1M", "lat_mean_us"), get(d, "request size", wl, "bs 4K", "lat_mean_us"),
                "bs 1M", "bs 4K")
        # dhrd's read-ahead.
        for pol in ("sequential", "history"):
            for rw in ("read", "randread"):
                add(f"dhrd read-ahead ({d}): {rw} 4K, RAM 1/4",
                    get(d, "dhrd read-ahead", f"{rw} 4K QD1, RAM 1/4", f"read-ahead {pol}"),
                    get(d, "dhrd read-ahead", f"{rw} 4K QD1, RAM 1/4", "read-ahead none"), pol, "none")
        # Fig. 3: memory size.
        wl = "zipf(1.2) randread 4K QD1"
        add(f"Fig. 3 ({d}): zipf reads, RAM 1/8 vs all of the export", get(d, "memory size", wl, "mem 1/8"),
            get(d, "memory size", wl, "mem all"), "mem 1/8", "mem all")
        add(f"Fig. 3 ({d}): zipf reads, RAM 1/2 vs all of the export", get(d, "memory size", wl, "mem 1/2"),
            get(d, "memory size", wl, "mem all"), "mem 1/2", "mem all")

    size = p["nvm_bytes"]
    notes += [
        f"Test file and export {lib.fmt_size(size)}; {p['nvm_runtime_s']} s per timed run; fio psync QD1 on the "
        "ext4 file, fio's nbd engine at QD1 for dhrd's read-ahead and the memory sizes.",
        "Devices: `dhrd nbd --mem 0 --durability fsync` with `--backing-timing nvm` (0.44 us read, 1 us write "
        "and sync, 8 GB/s) or `hdd` (8 ms per request, 10 ms per flush, 150 MB/s) over a backing file in "
        f"tmpfs ({RAM_DIR}: DRAM with device timing, as the paper emulated NVM), or with no timing over a "
        "backing file on this machine's disk (read with O_DIRECT). Every request also crosses nbdfuse (FUSE) and the "
        "NBD socket, which costs far more than the NVM's own latency: the stack overhead the paper speaks of.",
        "Block device: nbdfuse file -> `losetup --direct-io=on` -> ext4 (`mkfs.ext4`, default mount)"
        + (f"; the loop device's default read-ahead was {default_ra} sectors" if default_ra is not None else "")
        + ". O_SYNC does nothing for reads on Linux, so 'sync (cold)' reads are buffered reads from a cold cache.",
        "Buffered writes: a fixed amount (the whole file sequentially, 1/8 of it at random offsets) and the "
        "fsync at the end, on the wall clock. Reads marked 'cold' start with none of the file in the page "
        "cache; 'warm' ones after `vmtouch -t` of the file (and fio told not to drop it).",
        f"dhrd read-ahead runs: `--no-prefill`, chunk {CHUNK // K} KiB, default admission (second miss). "
        f"Memory-size runs: `--no-prefill --cache-admit always`, chunk {MEM_CHUNK // K} KiB, measured after "
        "a ramp twice as long as the run, so the workload itself fills the cache, as a page cache fills.",
        "Cold reads start after an fsync and `POSIX_FADV_DONTNEED` of the test file.",
    ]
    return {"title": title, "rows": rows, "ratios": ratios, "notes": notes,
            "scaling": f"{lib.fmt_size(size)} per device, {p['nvm_runtime_s']} s per run, devices {', '.join(devices)}"}
