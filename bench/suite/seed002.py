"""Experiment 12: seed 002's evaluation (Hadoop TestDFSIO reads, TPC-C), scaled.

The paper puts 1 GB of memory storage in front of an SSD and measures a Hadoop TestDFSIO
read of 1 to 10 files of 100 MB, written once and read after the page cache was flushed
(+78% to +266% over the bare SSD), and TPC-C on MySQL (2.39x to 4.6x). Here the slower
device is the HDD profile (8 ms per request; dhrd's `--backing-timing hdd` also shares
150 MB/s between requests, nbdkit's delay filter adds 8 ms per read and write), and each
configuration is an NBD export turned into a block device with an ext4 on it:

    server (Unix socket) -> nbdfuse (the export as a file) -> losetup -> mkfs.ext4 -> mount

There is no kernel nbd module here, hence nbdfuse and a loop device. Configurations, one at
a time over a fresh sparse backing file of the same size:
  - dhrd-cache:   `dhrd nbd --mem RAM --backing-timing hdd` (RAM smaller than the export:
                  cache mode; the default prefill copies the export into RAM until the budget
                  is full, and over the sparse backing that makes never-written chunks
                  resident at once, so written data goes to RAM as well as to the backing);
  - dhrd-no-prefill: the same with `--no-prefill`, a pure cache: RAM fills only with what is
                  read (second-miss admission, read-ahead); a write to a chunk not in RAM
                  goes to the backing only, so freshly written files are not in RAM;
  - dhrd-nvm:     dhrd-cache plus `--ram-file F --ram-kind nvm --ram-timing nvm`: writes are
                  acknowledged once in a file standing in for non-volatile memory (NVM
                  timing) and written back to the disk in the background, as the paper's
                  memory storage does (SPEC M4);
  - no-ram:       the same server and timing with `--mem 0` (every request reaches the
                  emulated disk): the paper's bare device, and the same device model as
                  dhrd-cache, so the ratio isolates the RAM;
  - nbdkit-cache: nbdkit's file plugin behind its delay filter (8 ms) and its cache filter
                  with the same cache size (`cache=writethrough cache-on-read=true`).
Every configuration makes a write durable before it answers it: dhrd's default `sync`
durability, and nbdkit's cache filter in writethrough mode. (Its default, writeback, with a
`cache-max-size` smaller than the data written returned wrong data here: PostgreSQL found
its relation mapping file corrupt after the page cache was dropped.)

Workloads, on the ext4 of each configuration:
  - TestDFSIO-like: N files of F bytes written in parallel (one fio job per file, fsync at
    the end), the page cache dropped (`/proc/sys/vm/drop_caches`, so the reads reach the
    export), then read in parallel (one fio job per file, 1 MiB sequential reads); the
    aggregate MiB/s, for each N.
  - TPC-C-like OLTP: PostgreSQL (initdb on the ext4, run as the `postgres` user), `pgbench
    -i -s S`, a checkpoint, the page cache dropped, then `pgbench -T T -c 4 -j 2` (TPC-B-like
    read-write transactions); transactions per second.
"""

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time

import lib
from lib import BenchError, as_postgres, log, pg_tool, run

K, M, G = 1 << 10, 1 << 20, 1 << 30
CONFIGS = ("dhrd-cache", "dhrd-nvm", "dhrd-no-prefill", "no-ram", "nbdkit-cache")
HDD_DELAY_MS = 8
TITLE = "12. Seed 002: RAM cache in front of a slower disk (TestDFSIO reads, TPC-C-like OLTP)"
PAPER = {"dfsio": "+78% (no SCR) to +266% (SCR) on average over the SSD, i.e. 1.78x-3.66x",
         "tpcc": "2.39x-4.60x the SSD"}


class Proc:
    """A long-running process with its output in logs/PREFIX-NAME.log (PREFIX: seed002)."""

    def __init__(self, ctx, name, cmd, ready, what, log_prefix="seed002"):
        self.name = name
        self.logp = os.path.join(ctx.out, "logs", f"{log_prefix}-{name}.log")
        self.log = open(self.logp, "w")
        lib.LOG and lib.LOG.write("$ " + " ".join(map(str, cmd)) + " &\n")
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=self.log, stderr=subprocess.STDOUT)
        try:
            lib.wait_for(lambda: ready() or self.proc.poll() is not None, lib.MOUNT_WAIT_S, what)
        except BenchError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            self.log.close()
            raise BenchError(f"{name} exited ({self.proc.returncode}): {open(self.logp).read()[-2000:]}")

    def stop(self, wait_s=120):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()


class Stack:
    """One configuration: its NBD server, nbdfuse, a loop device and an ext4, mounted.

    `close()` undoes whatever was set up, in reverse order, whatever failed before."""

    def __init__(self, ctx, config, p):
        self.ctx, self.config = ctx, config
        d = os.path.join(ctx.ws.disk, "seed002")
        os.makedirs(d, exist_ok=True)
        self.dir = d
        self.data = os.path.join(d, "backing")
        self.sock = os.path.join(d, "nbd.sock")
        self.dev = os.path.join(d, "export")
        self.mnt = os.path.join(d, "fs")
        self.server = self.fuse = self.loop = None
        self.mounted = False
        self.dio = None
        self.status = os.path.join(ctx.out, "logs", f"seed002-{config}.status.json")
        try:
            self._start(p)
        except BaseException:
            self.close()
            raise

    def _start(self, p):
        for f in (self.data, self.sock):
            if os.path.exists(f):
                os.unlink(f)
        with open(self.data, "wb") as f:  # sparse: reads of never-written blocks are zeros
            f.truncate(p["seed002_export_bytes"])
        mem = p["seed002_mem_bytes"]
        if self.config.startswith("dhrd") or self.config == "no-ram":
            cmd = [self.ctx.ws.dhrd, "nbd", "--backing", self.data, "--socket", self.sock,
                   "--mem", str(0 if self.config == "no-ram" else mem),
                   "--backing-timing", "hdd", "--status-file", self.status, "-v"]
            if self.config == "dhrd-nvm":
                nvm = os.path.join(self.dir, "nvm.img")
                if os.path.exists(nvm):
                    os.unlink(nvm)
                cmd += ["--ram-file", nvm, "--ram-kind", "nvm", "--ram-timing", "nvm"]
            elif self.config != "dhrd-cache":
                cmd.append("--no-prefill")
        else:
            tmp = os.path.join(self.dir, "nbdkit-tmp")
            os.makedirs(tmp, exist_ok=True)
            cmd = ["env", f"TMPDIR={tmp}", "nbdkit", "-f", "-U", self.sock, "--filter=cache", "--filter=delay",
                   "file", self.data, f"rdelay={HDD_DELAY_MS}ms", f"wdelay={HDD_DELAY_MS}ms",
                   "cache=writethrough", "cache-on-read=true", f"cache-max-size={mem}"]
        self.server = Proc(self.ctx, self.config, cmd, lambda: os.path.exists(self.sock), f"{self.config} socket")
        open(self.dev, "w").close()  # nbdfuse mounts over a regular file
        pidfile = os.path.join(self.dir, "nbdfuse.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        self.fuse = Proc(self.ctx, f"{self.config}-nbdfuse", ["nbdfuse", "-P", pidfile, self.dev, "--unix", self.sock],
                         lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0, "nbdfuse")
        size = os.path.getsize(self.dev)
        if size != p["seed002_export_bytes"]:
            raise BenchError(f"nbdfuse file is {size} bytes, export {p['seed002_export_bytes']}")
        self.loop = run(["losetup", "-f", "--show", "--direct-io=on", self.dev]).strip()
        try:
            with open(f"/sys/block/{os.path.basename(self.loop)}/loop/dio") as f:
                self.dio = f.read().strip() == "1"
        except OSError:
            self.dio = None
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.loop],
            timeout=600)
        os.makedirs(self.mnt, exist_ok=True)
        run(["mount", "-o", "noatime", self.loop, self.mnt])
        self.mounted = True

    def close(self):
        errs = []
        if self.mounted:
            run(["umount", self.mnt], check=False, timeout=600)
            if os.path.ismount(self.mnt):
                errs.append("umount failed; lazy unmount")
                run(["umount", "-l", self.mnt], check=False)
            self.mounted = False
        if self.loop:
            run(["losetup", "-d", self.loop], check=False)
            self.loop = None
        if self.fuse:
            run(["fusermount3", "-u", self.dev], check=False)
            self.fuse.stop(wait_s=30)
            if os.path.ismount(self.dev):
                run(["fusermount3", "-u", "-z", self.dev], check=False)
            self.fuse = None
        if self.server:
            self.server.stop()
            self.server = None
        for f in (self.data, self.dev, self.sock):
            if os.path.exists(f) and not os.path.ismount(f):
                os.unlink(f)
        if errs:
            log(f"[12 seed002] {self.config}: " + "; ".join(errs))

    def engine(self):
        try:
            with open(self.status) as f:
                return json.load(f).get("cache", {})
        except (OSError, ValueError):
            return {}


def fio_files(files, rw, fsize, timeout):
    """One fio job per file, all at once; the aggregate MiB/s and the seconds it took."""
    cmd = ["fio", "--output-format=json", "--group_reporting", "--ioengine=psync", "--bs=1M",
           f"--size={fsize}", f"--rw={rw}"]
    if rw == "write":
        cmd += ["--refill_buffers", "--end_fsync=1", "--fallocate=none"]
    for i, f in enumerate(files):
        cmd += [f"--name=f{i}", f"--filename={f}"]
    t = time.monotonic()
    out = run(cmd, timeout=timeout)
    secs = time.monotonic() - t
    try:
        d = json.loads(out[out.index("{"):])
    except (ValueError, json.JSONDecodeError) as e:
        raise BenchError(f"fio: unreadable output: {out[:500]}") from e
    job = d["jobs"][0]
    if job.get("error"):
        raise BenchError(f"fio {rw}: error {job['error']}")
    j = job["read" if rw == "read" else "write"]
    return j["bw_bytes"] / M, secs


def dfsio(stack, p):
    rows = []
    fsize = p["seed002_file_bytes"]
    for n in p["seed002_files"]:
        d = os.path.join(stack.mnt, f"dfsio-{n}")
        os.makedirs(d)
        files = [os.path.join(d, f"part-{i:05d}") for i in range(n)]
        timeout = 600 + n * fsize / (2 * M)  # even at 2 MiB/s
        w_mib_s, w_s = fio_files(files, "write", fsize, timeout)
        lib.drop_caches()
        r_mib_s, r_s = fio_files(files, "read", fsize, timeout)
        rows.append(dict(config=stack.config, workload="dfsio-read", files=n, file_bytes=fsize,
                         mib_s=round(r_mib_s, 2), secs=round(r_s, 2), write_mib_s=round(w_mib_s, 2),
                         write_secs=round(w_s, 2)))
        log(f"[12 seed002] {stack.config}: TestDFSIO {n} x {lib.fmt_size(fsize)}: read {r_mib_s:.1f} MiB/s "
            f"({r_s:.1f} s), write {w_mib_s:.1f} MiB/s")
        shutil.rmtree(d)
        os.sync()
    return rows


def oltp(stack, ctx, p):
    """PostgreSQL on the configuration's ext4: pgbench init, then a timed run, cold cache."""
    pw = pwd.getpwnam("postgres")
    pgdata = os.path.join(stack.mnt, "pgdata")
    sockdir = os.path.join(stack.dir, "pgsock")
    for d in (pgdata, sockdir):
        os.makedirs(d, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    os.chmod(stack.dir, 0o755)
    pglog = os.path.join(sockdir, "postgres.log")
    port = str(40000 + os.getpid() % 20000)  # a Unix socket only, in a directory of its own
    pg_ctl = pg_tool("pg_ctl")
    t = time.monotonic()
    as_postgres([pg_tool("initdb"), "-D", pgdata, "-A", "trust", "-U", "postgres", "--no-sync",
                 f"--wal-segsize={p.get('seed002_pg_wal_segsize_mb', 16)}"], timeout=600)
    log(f"[12 seed002] {stack.config}: initdb {time.monotonic() - t:.1f} s")
    opts = (f"-k {sockdir} -p {port} -c listen_addresses='' -c shared_buffers={p['seed002_pg_shared_buffers']} "
            "-c max_wal_size=1GB")
    started = False
    try:
        as_postgres([pg_ctl, "-D", pgdata, "-l", pglog, "-o", opts, "-w", "-t", "300", "start"], timeout=400)
        started = True
        log(f"[12 seed002] {stack.config}: postgres started")
        conn = ["-h", sockdir, "-p", port, "-U", "postgres"]
        t = time.monotonic()
        run(["pgbench", "-i", "-q", "-s", str(p["seed002_pg_scale"])] + conn + ["postgres"], timeout=3600)
        init_s = time.monotonic() - t
        t = time.monotonic()
        run(["psql", "-q"] + conn + ["-c", "CHECKPOINT", "postgres"], timeout=600)
        lib.drop_caches()
        ckpt_s = time.monotonic() - t
        out = run(["pgbench", "-T", str(p["seed002_pg_secs"]), "-c", "4", "-j", "2"] + conn + ["postgres"],
                  timeout=p["seed002_pg_secs"] * 4 + 600)
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        if not m:
            raise BenchError(f"pgbench: no tps in {out[-800:]}")
        lat = re.search(r"latency average = ([\d.]+) ms", out)
        tx = re.search(r"number of transactions actually processed: (\d+)", out)
        row = dict(config=stack.config, workload="pgbench", scale=p["seed002_pg_scale"], tps=float(m.group(1)),
                   lat_mean_ms=float(lat.group(1)) if lat else None, transactions=int(tx.group(1)) if tx else None,
                   init_secs=round(init_s, 1), checkpoint_secs=round(ckpt_s, 1))
        log(f"[12 seed002] {stack.config}: pgbench -s {p['seed002_pg_scale']}: {row['tps']:.1f} TPS "
            f"(init {init_s:.1f} s)")
        return [row]
    finally:
        if started:
            # The cluster is thrown away with the file system: no shutdown checkpoint.
            as_postgres([pg_ctl, "-D", pgdata, "-m", "immediate", "-w", "-t", "120", "stop"], check=False,
                        timeout=300)
        if os.path.exists(pglog):
            shutil.copy(pglog, os.path.join(ctx.out, "logs", f"seed002-{stack.config}-postgres.log"))
        shutil.rmtree(sockdir, ignore_errors=True)


def seed002_ratios(rows, p):
    """Same-run ratios of the figures in `rows` (also used to redraw a committed run)."""

    def get(config, key, **match):
        for r in rows:
            if r["config"] == config and key in r and all(r.get(k) == v for k, v in match.items()):
                return r[key]
        return None

    ratios = []

    def add(what, num, den, figure, baseline):
        if num and den:
            ratios.append({"what": what, "figure": figure, "baseline": baseline, "value": round(num / den, 3)})

    fsize = p["seed002_file_bytes"]
    for n in p["seed002_files"]:
        what = f"TestDFSIO read, {n} x {lib.fmt_size(fsize)} (paper: 1.78x-3.66x)"
        add(what, get("dhrd-cache", "mib_s", files=n), get("no-ram", "mib_s", files=n), "dhrd-cache",
            "no-ram (same HDD profile, no RAM)")
        add(what, get("dhrd-cache", "mib_s", files=n), get("nbdkit-cache", "mib_s", files=n), "dhrd-cache",
            "nbdkit cache + delay filters")
        add(what, get("dhrd-nvm", "mib_s", files=n), get("no-ram", "mib_s", files=n), "dhrd-nvm",
            "no-ram (same HDD profile, no RAM)")
        add(what, get("dhrd-no-prefill", "mib_s", files=n), get("no-ram", "mib_s", files=n), "dhrd-no-prefill",
            "no-ram (same HDD profile, no RAM)")
        add(what, get("nbdkit-cache", "mib_s", files=n), get("no-ram", "mib_s", files=n), "nbdkit-cache",
            "no-ram (same HDD profile, no RAM)")
    what = f"pgbench TPS, scale {p['seed002_pg_scale']} (paper, TPC-C: 2.39x-4.60x)"
    add(what, get("dhrd-cache", "tps"), get("no-ram", "tps"), "dhrd-cache", "no-ram (same HDD profile, no RAM)")
    add(what, get("dhrd-cache", "tps"), get("nbdkit-cache", "tps"), "dhrd-cache", "nbdkit cache + delay filters")
    add(what, get("dhrd-nvm", "tps"), get("no-ram", "tps"), "dhrd-nvm", "no-ram (same HDD profile, no RAM)")
    add(what, get("dhrd-nvm", "tps"), get("nbdkit-cache", "tps"), "dhrd-nvm", "nbdkit cache + delay filters")
    add(what, get("dhrd-no-prefill", "tps"), get("no-ram", "tps"), "dhrd-no-prefill",
        "no-ram (same HDD profile, no RAM)")
    add(what, get("nbdkit-cache", "tps"), get("no-ram", "tps"), "nbdkit-cache", "no-ram (same HDD profile, no RAM)")
    what = f"pgbench -i -s {p['seed002_pg_scale']} time, inverted (higher is faster)"
    for fig in ("dhrd-cache", "dhrd-nvm", "dhrd-no-prefill", "nbdkit-cache"):
        add(what, get("no-ram", "init_secs"), get(fig, "init_secs"), fig, "no-ram (same HDD profile, no RAM)")
    add(what, get("nbdkit-cache", "init_secs"), get("dhrd-cache", "init_secs"), "dhrd-cache",
        "nbdkit cache + delay filters")
    return ratios


def exp_seed002(ctx):
    p = ctx.p
    missing = [t for t in ("nbdfuse", "nbdkit", "pgbench", "psql", "runuser") if not shutil.which(t)]
    if missing:
        return {"title": TITLE, "skipped": "not installed: " + ", ".join(missing)}
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return {"title": TITLE, "skipped": "no postgres user (package postgresql)"}
    rows, engines, dio = [], {}, {}
    for config in ctx.pick(list(p.get("seed002_configs", CONFIGS))):
        t = time.monotonic()
        stack = Stack(ctx, config, p)
        try:
            dio[config] = stack.dio
            rows += dfsio(stack, p)
            rows += oltp(stack, ctx, p)
            if config.startswith("dhrd"):
                engines[config] = stack.engine()
        finally:
            stack.close()
        log(f"[12 seed002] {config}: {time.monotonic() - t:.0f} s")

    ratios = seed002_ratios(rows, p)
    fsize = p["seed002_file_bytes"]
    notes = [
        f"The paper's figures: TestDFSIO reads {PAPER['dfsio']}; TPC-C (MySQL) {PAPER['tpcc']}; both against "
        "the bare SSD, with 1 GB of memory storage.",
        f"Export {lib.fmt_size(p['seed002_export_bytes'])} (sparse file), RAM cache {lib.fmt_size(p['seed002_mem_bytes'])}; "
        "each configuration is the server -> nbdfuse -> loop device -> ext4 (noatime), made afresh. The loop "
        "device uses direct I/O (so the export file's page cache holds no second copy, and the loop device keeps "
        "several requests in flight): " + ", ".join(f"{c} {'on' if v else 'OFF'}" for c, v in dio.items()) + ".",
        "Backing: HDD profile. dhrd: `--backing-timing hdd` (8 ms per read or write, 10 ms per sync, 150 MB/s "
        f"shared), default durability (`sync`: a write is durable before its reply); dhrd-no-prefill and no-ram add `--no-prefill`. nbdkit: `--filter=cache --filter=delay file "
        f"rdelay={HDD_DELAY_MS}ms wdelay={HDD_DELAY_MS}ms cache=writethrough cache-on-read=true cache-max-size=RAM` "
        "(writes durable on return like dhrd's; flushes are not delayed, there is no bandwidth cap). The "
        "default writeback mode, with a cache smaller than the data written, returned corrupt data to "
        "PostgreSQL after a cache drop here, so it is not used.",
        "no-ram is dhrd with `--mem 0`: the same server, transport and device model as dhrd-cache, so that ratio "
        "measures the RAM alone; the nbdkit ratio compares two caches over two models of the same 8 ms disk.",
        f"TestDFSIO-like: N files of {lib.fmt_size(fsize)} written in parallel by fio (fsync at the end), page "
        "cache dropped, read in parallel (one fio job per file, 1 MiB psync reads); aggregate MiB/s.",
        f"TPC-C-like: PostgreSQL {pg_version()} as the postgres user, data directory on the ext4, shared_buffers "
        f"{p['seed002_pg_shared_buffers']}; `pgbench -i -s {p['seed002_pg_scale']}`, CHECKPOINT, page cache dropped, "
        f"`pgbench -T {p['seed002_pg_secs']} -c 4 -j 2` (TPC-B-like read-write transactions; MySQL's TPC-C kit is "
        "not installed here).",
    ]
    for c, e in engines.items():
        if e:
            notes.append(f"{c} RAM cache at the end: " + json.dumps(e, sort_keys=True)[:600])
    return {"title": TITLE,
            "scaling": (f"paper: 1 GB memory storage, 1-10 files of 100 MB, a 4 GB TPC-C database; here RAM "
                        f"{lib.fmt_size(p['seed002_mem_bytes'])}, files of {lib.fmt_size(fsize)} "
                        f"({', '.join(map(str, p['seed002_files']))} of them), pgbench scale {p['seed002_pg_scale']}"),
            "rows": rows, "ratios": ratios, "notes": notes, "paper": PAPER}


def pg_version():
    try:
        return run(["pgbench", "--version"], check=False).split()[-3]
    except (BenchError, IndexError):
        return "?"


if __name__ == "__main__":
    # Recomputes the ratios of a finished run from its own rows, and redraws its report:
    #   /usr/bin/python3 bench/suite/seed002.py bench/results/<run>
    import sys

    import report

    d = sys.argv[1]
    with open(os.path.join(d, "results.json")) as f:
        res = json.load(f)
    e = res["experiments"]["seed002"]
    e["ratios"] = seed002_ratios(e["rows"], res["parameters"])
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    report.write(res, d)
    print(f"wrote {d}/report.md")
