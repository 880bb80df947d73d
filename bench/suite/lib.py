"""Shared helpers of the benchmark suite: running commands, fio, caches, memory, machine.

Every helper raises `BenchError` with the command and its output when something fails, so a
broken configuration stops the suite with a message that says what went wrong instead of
producing a number that is not one.
"""

import json
import os
import platform
import re
import shutil
import subprocess
import time

# fio settings shared by every run: synchronous I/O at queue depth 1 per process, as the
# papers' figures measure, with random offsets drawn afresh each run.
FIO_COMMON = [
    "--ioengine=psync",
    "--iodepth=1",
    "--time_based",
    "--group_reporting",
    "--randrepeat=0",
    "--norandommap",
    "--output-format=json",
]

# How long a mount, an NBD server or a load may take before the suite gives up.
MOUNT_WAIT_S = 20.0
LOAD_WAIT_S = 1800.0


class BenchError(Exception):
    pass


LOG = None  # an open file: every command and its output goes there


def log(msg):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


def run(cmd, check=True, capture=True, timeout=None, env=None):
    """Runs a command; returns its stdout (text)."""
    if LOG:
        LOG.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        LOG.flush()
    try:
        p = subprocess.run(
            [str(c) for c in cmd],
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"timed out after {timeout} s: {' '.join(map(str, cmd))}") from e
    except FileNotFoundError as e:
        raise BenchError(f"not installed: {cmd[0]}") from e
    if capture and LOG and p.stderr:
        LOG.write(p.stderr[-4000:])
    if check and p.returncode != 0:
        raise BenchError(
            f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n{(p.stderr or '')[-2000:]}"
        )
    return p.stdout or ""


def need_tools(tools):
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise BenchError(
            "missing tools: " + ", ".join(missing) + " (bash .ci/run installs them; see docs/benchmarks.md)"
        )


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", str(s).strip(), re.I)
    if not m:
        raise BenchError(f"bad size {s!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(m.group(1)) * mult


def fmt_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fill_file(path, nbytes):
    """Writes `nbytes` of incompressible data (fio's refill buffers), then syncs it."""
    run(
        [
            "fio",
            "--name=fill",
            f"--filename={path}",
            "--rw=write",
            "--bs=1M",
            f"--size={nbytes}",
            "--refill_buffers",
            "--end_fsync=1",
            "--output=/dev/null",
        ]
    )
    # fio leaves the pages cached; benchmarks decide themselves what is warm.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fio(name, args, runtime_s, env=None):
    """Runs one fio job (in `env` if given); returns a flat dict of IOPS, MiB/s and latency (us)
    per direction."""
    out = run(["fio", f"--name={name}", f"--runtime={int(runtime_s * 1000)}ms"] + FIO_COMMON + args, env=env)
    try:
        d = json.loads(out[out.index("{"):])
    except (ValueError, json.JSONDecodeError) as e:
        raise BenchError(f"fio {name}: unreadable output: {out[:500]}") from e
    job = d["jobs"][0]
    if job.get("error"):
        raise BenchError(f"fio {name}: error {job['error']}")
    r = {}
    for k in ("read", "write"):
        j = job[k]
        if j["io_bytes"] == 0:
            continue
        pct = j["clat_ns"].get("percentile", {})
        r[k + "_iops"] = j["iops"]
        r[k + "_mib_s"] = j["bw_bytes"] / (1 << 20)
        r[k + "_lat_mean_us"] = j["lat_ns"]["mean"] / 1000
        r[k + "_lat_p50_us"] = pct.get("50.000000", 0) / 1000
        r[k + "_lat_p99_us"] = pct.get("99.000000", 0) / 1000
    sync = job.get("sync", {})
    if sync.get("total_ios"):
        # fio times the fsync/fdatasync after a write separately from the write: kept as its
        # own figure (the report shows it next to the write latency). IOPS already include
        # it, since the runs are time-based.
        r["sync_lat_mean_us"] = sync["lat_ns"]["mean"] / 1000
    r["iops"] = r.get("read_iops", 0) + r.get("write_iops", 0)
    r["mib_s"] = r.get("read_mib_s", 0) + r.get("write_mib_s", 0)
    return r


def meminfo():
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            m[k] = int(v.split()[0]) * 1024
    return m


def resident_bytes(path):
    """Bytes of `path` held in the page cache (fincore); 0 if it cannot tell."""
    try:
        out = run(["fincore", "-bno", "RES", path], check=False).strip()
        return int(out.split()[0]) if out else 0
    except (BenchError, ValueError, IndexError):
        return 0


def device_read_bytes(path):
    """Bytes read so far from the block device holding `path` (/sys/dev/block/*/stat)."""
    st = os.stat(path)
    try:
        with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat") as f:
            return int(f.read().split()[2]) * 512
    except (OSError, ValueError, IndexError):
        return 0


def tree_resident_bytes(root):
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            if os.path.isfile(p) and not os.path.islink(p):
                total += resident_bytes(p)
    return total


def proc_status(pid):
    st = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                st[k] = int(v.split()[0]) * 1024
    return st


def as_postgres(cmd, **kw):
    """Runs `cmd` as the `postgres` user (PostgreSQL refuses to run as root)."""
    return run(["runuser", "-u", "postgres", "--"] + cmd, **kw)


def pg_tool(name):
    """The path of PostgreSQL's `name` (initdb, pg_ctl: not on PATH in Debian)."""
    p = shutil.which(name)
    if p:
        return p
    for v in sorted(os.listdir("/usr/lib/postgresql"), reverse=True) if os.path.isdir("/usr/lib/postgresql") else []:
        c = f"/usr/lib/postgresql/{v}/bin/{name}"
        if os.access(c, os.X_OK):
            return c
    raise BenchError(f"not installed: {name}")


def proc_cpu_s(pid):
    """CPU seconds (user + system, every thread) process `pid` has used so far, from
    /proc/PID/stat; None without a pid or once the process is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields are counted after its end.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def process_gone(pid):
    """True once process `pid` has exited: no longer in /proc, or a zombie (which holds no
    files any more) that nobody reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].split()[0] == "Z"


def timed(fn):
    """Seconds `fn()` took."""
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def read_tree(root):
    """Reads every file under `root` to its end, as an application would; returns the bytes."""
    n = 0
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                while True:
                    b = fh.read(1 << 20)
                    if not b:
                        break
                    n += len(b)
    return n


def machine(disk_dir):
    """What the run ran on, for the report."""

    def sh(cmd):
        try:
            return run(cmd, check=False).strip()
        except BenchError:
            return ""

    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    dev = sh(["findmnt", "-no", "SOURCE,FSTYPE", "-T", disk_dir])
    disk = sh(["lsblk", "-dno", "NAME,MODEL,SIZE,ROTA"]).replace("\n", "; ")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": meminfo().get("MemTotal", 0),
        "kernel": platform.release(),
        "disk_dir": disk_dir,
        "disk_dir_fs": dev,
        "disks": disk,
        "fio": sh(["fio", "--version"]),
        "rustc": sh(["rustc", "--version"]),
        "idle": idle_and_reporting(),
        "dhrd_commit": sh(["git", "-C", root, "rev-parse", "--short", "HEAD"]),
        "dhrd_dirty": bool(sh(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])),
    }


def idle_and_reporting():
    """How idle vCPUs wait and what happens to freed RAM: on a VM both move the figures.

    An idle CPU that halts at once (cpuidle driver `haltpoll` with `guest_halt_poll_ns` 0)
    makes every wake-up of a thread on it an interrupt the hypervisor delivers, which every
    FUSE round trip pays; free page reporting hands freed RAM back to the host, so the next
    first touch of it faults on the host too (docs/fuse.md, docs/rbd.md). Missing files
    are left out."""
    out = {}
    for key, path in (
        ("cpuidle_driver", "/sys/devices/system/cpu/cpuidle/current_driver"),
        ("cpuidle_governor", "/sys/devices/system/cpu/cpuidle/current_governor_ro"),
        ("guest_halt_poll_ns", "/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        ("page_reporting_order", "/sys/module/page_reporting/parameters/page_reporting_order"),
        ("page_reporting_min_free_ms", "/sys/module/page_reporting/parameters/min_free_ms"),
    ):
        try:
            with open(path) as f:
                out[key] = f.read().strip()
        except OSError:
            pass
    return out


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def median_ratio(nums, dens):
    """The median of the ratios num / den of two series measured side by side, one pair per
    round (so a slow hour weighs on both sides of each ratio); pairs with a missing number
    or a zero denominator are left out, None when none remain."""
    return median([n / d for n, d in zip(nums, dens) if n is not None and d])


def wait_for(pred, timeout_s, what, interval_s=0.02):
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        if pred():
            return time.monotonic() - t
        time.sleep(interval_s)
    raise BenchError(f"timed out after {timeout_s} s waiting for {what}")
