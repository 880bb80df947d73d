#!/usr/bin/env python3
"""The daemon's CPU time per FUSE request on the small-file paths of `dhrd mount`.

CPU time (the sum of every daemon thread's run time, /proc/PID/task/*/schedstat) moves
much less than wall-clock time when other work shares the machine, so this is usable on
a busy host where throughput figures are not. Requests are counted by the kernel's
`fuse:fuse_request_send` tracepoint filtered to the mount's connection (`perf stat`).

Phases, each over `--files` files of `--file-bytes` in directories of 1,000:
  create  open(O_CREAT|O_WRONLY), write, close, chmod
  read    open, read, close (the files just written: registrations kept)
  -- the mount is stopped and mounted again (`--no-preload`), so the kernel knows no
     entry and the daemon holds no registration --
  lookup  stat of every file (one LOOKUP each)
  reopen  open, read, close (first opens of this daemon)
  reread  open, read, close again (warm: registrations kept)
  unlink  unlink of every file

The backing is a fresh journalled ext4 on a loop device over a file in `--disk-dir`,
removed at the end. Needs root and perf. Prints one line per phase:
  phase, requests, requests per file, daemon CPU us per request, per file, opcodes.

With `--null-server target/release/dhrd-bench` it measures the floor instead: the null
FUSE server of experiment 8 (`dhrd-bench fuse-transport`, legacy /dev/fuse, 1 and 8
threads, one short round of fio 4 KiB reads), its server threads' CPU time against the
requests fio sent.

Usage: bench/fuse/cpu_per_request.py [--dhrd target/release/dhrd] [--files 5000]
       [--file-bytes 4096] [--durability fsync] [--threads N] [--disk-dir /var/tmp]
       [--record PHASE] [--null-server BIN] [-- extra dhrd mount options]
With STRACE=PHASE (or all) in the environment, `strace -c -f` counts the daemon's system
calls during that phase into strace-PHASE.txt (slows the phase: read only its counts).
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

OPCODES = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 10: "UNLINK", 14: "OPEN",
           18: "RELEASE", 22: "GETXATTR", 25: "FLUSH", 35: "CREATE", 42: "BATCH_FORGET"}
FILES_PER_DIR = 1000


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def daemon_cpu_ns(pid):
    """Run time of each daemon thread by thread id: (name, ns)."""
    by_tid = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                by_tid[t] = (name, int(f.read().split()[0]))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return by_tid


def cpu_since(before, after):
    """Total ns and ns per thread name (digits dropped) between two samples."""
    by_name = {}
    for tid, (name, ns) in after.items():
        d = ns - before.get(tid, (name, 0))[1]
        key = name.rstrip("0123456789-")
        by_name[key] = by_name.get(key, 0) + d
    return sum(by_name.values()), by_name


def perf_counting(conn):
    """Starts `perf stat` counting the mount's requests, all and per opcode."""
    events = ["-e", "fuse:fuse_request_send", "--filter", f"connection == {conn}"]
    for op in OPCODES:
        events += ["-e", "fuse:fuse_request_send",
                   "--filter", f"connection == {conn} && opcode == {op}"]
    p = subprocess.Popen(["perf", "stat", "-x,", "-a"] + events,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # perf attaches
    return p


def perf_done(p):
    p.send_signal(signal.SIGINT)
    _, err = p.communicate()
    counts = []
    for line in err.splitlines():
        f = line.split(",")
        if len(f) > 2 and "fuse_request_send" in f[2]:
            counts.append(int(f[0]) if f[0].isdigit() else 0)
    total = counts[0]
    by_op = {OPCODES[op]: n for op, n in zip(OPCODES, counts[1:]) if n}
    return total, by_op


class Mount:
    def __init__(self, dhrd, backing, mnt, args, extra):
        self.mnt = mnt
        cmd = [dhrd, "mount", backing, mnt, "--durability", args.durability, "--quiet"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.p = subprocess.Popen(cmd + extra)
        for _ in range(200):
            if os.path.ismount(mnt):
                break
            time.sleep(0.05)
        else:
            raise SystemExit("the mount did not come up")
        self.conn = os.minor(os.stat(mnt).st_dev)
        time.sleep(0.5)  # the warm-up walk of the tree, if any

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=120)


def phase(name, m, nfiles, fn, record=None):
    rec = None
    if record in (name, "all"):
        out = f"perf-{name}.data"
        rec = subprocess.Popen(["perf", "record", "-q", "-g", "-o", out, "-p", str(m.p.pid)])
    if os.environ.get("STRACE") in (name, "all"):
        rec = subprocess.Popen(["strace", "-c", "-f", "-o", f"strace-{name}.txt",
                                "-p", str(m.p.pid)], stderr=subprocess.DEVNULL)
        time.sleep(1)
    perf = perf_counting(m.conn)
    cpu0 = daemon_cpu_ns(m.p.pid)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    time.sleep(0.3)  # RELEASEs and FORGETs are sent after the calls return
    cpu, by_name = cpu_since(cpu0, daemon_cpu_ns(m.p.pid))
    reqs, by_op = perf_done(perf)
    if rec:
        rec.send_signal(signal.SIGINT)
        rec.wait()
    ops = " ".join(f"{k} {v / nfiles:.2f}" for k, v in sorted(by_op.items()))
    print(f"{name:7} requests {reqs:7d} ({reqs / nfiles:.2f}/file)  daemon CPU "
          f"{cpu / 1e3 / max(reqs, 1):6.1f} us/request {cpu / 1e3 / nfiles:6.1f} us/file  "
          f"wall {wall / nfiles * 1e6:6.1f} us/file  [{ops}]", flush=True)
    threads = ", ".join(f"{k} {v / 1e3 / nfiles:.1f}" for k, v in
                        sorted(by_name.items(), key=lambda kv: -kv[1]) if v > 0)
    print(f"        daemon CPU us/file by thread: {threads}", flush=True)


def null_server(bench, threads):
    """CPU per request of the null server with `threads` /dev/fuse threads."""
    out = tempfile.mkdtemp(prefix="dhrd-null-", dir="/var/tmp")
    rec = subprocess.Popen(["perf", "record", "-q", "-a", "-e", "fuse:fuse_request_send",
                            "-o", f"{out}/perf.data"])
    time.sleep(1.0)
    p = subprocess.Popen([bench, "fuse-transport", "--threads", str(threads), "--no-uring",
                          "--rounds", "1", "--runtime", "3", "--size", "64M", "--out", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = {}
    while p.poll() is None:
        try:
            for tid, (name, ns) in daemon_cpu_ns(p.pid).items():
                if name.startswith("null-dev"):
                    seen[tid] = max(seen.get(tid, 0), ns)
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    rec.send_signal(signal.SIGINT)
    rec.wait()
    script = subprocess.run(["perf", "script", "-i", f"{out}/perf.data", "-F", "comm"],
                            capture_output=True, text=True).stdout
    reqs = sum(1 for line in script.splitlines() if line.strip() == "fio")
    cpu = sum(seen.values())
    subprocess.run(["rm", "-rf", out])
    print(f"null server, {threads} thread(s): requests {reqs}, server CPU "
          f"{cpu / 1e3 / max(reqs, 1):.1f} us/request", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dhrd", default="target/release/dhrd")
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--file-bytes", type=int, default=4096)
    ap.add_argument("--durability", default="fsync")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--disk-dir", default="/var/tmp")
    ap.add_argument("--record", help="perf record -g the daemon during this phase (or all)"
                    " into perf-PHASE.data")
    ap.add_argument("--null-server", metavar="DHRD_BENCH",
                    help="measure the null server of experiment 8 instead")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    if args.null_server:
        for t in (1, 8):
            null_server(args.null_server, t)
        return 0
    dhrd = os.path.abspath(args.dhrd)
    work = tempfile.mkdtemp(prefix="dhrd-cpu-", dir=args.disk_dir)
    img, ext4, mnt = (os.path.join(work, n) for n in ("disk.img", "ext4", "mnt"))
    os.mkdir(ext4)
    os.mkdir(mnt)
    sh("truncate", "-s", "2G", img)
    sh("mkfs.ext4", "-q", "-F", img)
    sh("mount", "-o", "loop", img, ext4)
    backing = os.path.join(ext4, "b")
    os.mkdir(backing)
    data = os.urandom(args.file_bytes)
    paths = [os.path.join(f"d{i // FILES_PER_DIR}", f"f{i}") for i in range(args.files)]
    m = None
    try:
        m = Mount(dhrd, backing, mnt, args, args.extra)
        for d in sorted({os.path.dirname(p) for p in paths}):
            os.mkdir(os.path.join(mnt, d))
        full = [os.path.join(mnt, p) for p in paths]

        def create():
            for p in full:
                fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.close(fd)
                os.chmod(p, 0o640)

        def read():
            for p in full:
                fd = os.open(p, os.O_RDONLY)
                os.read(fd, 65536)
                os.close(fd)

        def lookup():
            for p in full:
                os.stat(p)

        def unlink():
            for p in full:
                os.unlink(p)

        n = args.files
        phase("create", m, n, create, args.record)
        phase("read", m, n, read, args.record)
        m.stop()
        m = Mount(dhrd, backing, mnt, args, ["--no-preload"] + args.extra)
        phase("lookup", m, n, lookup, args.record)
        phase("reopen", m, n, read, args.record)
        phase("reread", m, n, read, args.record)
        phase("unlink", m, n, unlink, args.record)
    finally:
        if m:
            m.stop()
        subprocess.run(["umount", ext4])
        os.unlink(img)
        for d in (ext4, mnt):
            os.rmdir(d)
        os.rmdir(work)


if __name__ == "__main__":
    sys.exit(main())
