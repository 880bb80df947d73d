"""Experiment 9: dhrd in front of a Ceph RBD image (issue: the durable tier on RBD).

dhrd nbd on `rbd:POOL/IMAGE` against fio's own `rbd` engine reading and writing the same
kind of image directly through librbd, on a one-node cluster on this machine
(scripts/ceph-single-node.sh; or the cluster DHRD_CEPH_CONF names). Both clients run with
librbd's cache off, so a completed write is on the OSD for both: the same durability.

Figures: 4 KiB random reads of a loaded image (QD1 and QD16), 4 KiB random writes
(QD1 and QD16), time from process start to the first answered read on a small and a
large image, and the full load of the large image two ways, each pair alternating within
every round (who goes first rotates):

- into fresh RAM, against a plain librbd reader (`dhrd-bench rbd-read`) that reads the
  whole image into a fresh memfd with dhrd's request size and depth: the same work;
- into pre-faulted RAM (`dhrd nbd --prefault-ram`, the load timed after the pre-fault),
  against fio's rbd engine reading sequentially in 1 MiB requests at QD16 into the one
  buffer it reuses: the pipeline apart from the cost of fresh memory.

The earlier comparison, dhrd's load into fresh RAM against fio, compared unequal work
(fio never touches fresh memory) and is kept as a figure of its own (docs/rbd.md).
"""

import json
import os
import shutil
import subprocess
import time

import lib
from lib import BenchError, log, run

K, M, G = 1 << 10, 1 << 20, 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ceph-single-node.sh")
POOL = "rbd"


class Cluster:
    """The cluster for this experiment: DHRD_CEPH_CONF's, or one started here and stopped
    at the end. `conf` is a copy with `rbd_cache = false` for every client."""

    def __init__(self, ctx):
        self.dir = None
        given = os.environ.get("DHRD_CEPH_CONF")
        if given:
            base = given
        else:
            self.dir = os.path.join(ctx.ws.disk, "ceph")
            log("[9 rbd] starting a one-node Ceph cluster")
            run(["bash", SCRIPT, "start", self.dir], timeout=600)
            base = os.path.join(self.dir, "ceph.conf")
        self.conf = os.path.join(ctx.out, "logs", "rbd-ceph.conf")
        with open(base) as f:
            text = f.read()
        # Relative paths in the conf (keyring) stay valid: they are absolute in the script's.
        with open(self.conf, "w") as f:
            f.write(text + "\n[client]\nrbd_cache = false\n")
        # fio's rbd engine finds the cluster through CEPH_CONF.
        self.env = dict(os.environ, CEPH_CONF=self.conf)

    def rbd(self, *args, timeout=1800):
        return run(["rbd", "-c", self.conf] + list(args), timeout=timeout)

    def stop(self):
        if self.dir:
            run(["bash", SCRIPT, "stop", self.dir], check=False, timeout=300)
            shutil.rmtree(self.dir, ignore_errors=True)


def fio_rbd(cl, name, image, args, runtime_s):
    """One fio job on the image through fio's rbd engine (librbd directly)."""
    base = ["--ioengine=rbd", f"--pool={POOL}", f"--rbdname={image}", "--clientname=admin"]
    return lib.fio(name, base + args, runtime_s, env=cl.env)


def fio_nbd(sock, name, args, runtime_s):
    return lib.fio(name, ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}"] + args, runtime_s)


def rw_args(op, qd, size):
    # FIO_COMMON sets psync and iodepth 1; the rbd and nbd engines are asynchronous, so the
    # later --iodepth wins.
    return [f"--rw={op}", "--bs=4k", f"--iodepth={qd}", f"--size={size}"]


def baseline_random_jobs(cl, image, size, runtime, rnd, rows):
    for op in ("randread", "randwrite"):
        for qd in (1, 16):
            r = fio_rbd(cl, f"rbd-{op}-{qd}", image, rw_args(op, qd, size), runtime)
            rows.append(dict(round=rnd, config="fio-rbd", op=op, qd=qd, **r))


class DhrdRbd:
    """`dhrd nbd --backing rbd:POOL/IMAGE`; records when it was spawned."""

    def __init__(self, ctx, cl, image, extra=()):
        self.sock = os.path.join(ctx.ws.disk, f"rbd-{image}.sock")
        self.logp = os.path.join(ctx.out, "logs", f"dhrd-nbd-rbd-{image}.log")
        self.log = open(self.logp, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [ctx.ws.dhrd, "nbd", "--backing", f"rbd:{POOL}/{image}", "--ceph-conf", cl.conf,
             "--socket", self.sock] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)

    def first_read_ms(self):
        """Milliseconds from spawn to the first 4 KiB read answered (polls the socket)."""
        import nbd  # python3-libnbd

        deadline = self.t0 + lib.MOUNT_WAIT_S
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"dhrd nbd exited: {open(self.logp).read()[-2000:]}")
            try:
                h = nbd.NBD()
                h.connect_uri(f"nbd+unix:///?socket={self.sock}")
                h.pread(4096, 0)
                ms = (time.monotonic() - self.t0) * 1000
                h.shutdown()
                return ms
            except nbd.Error:
                if time.monotonic() > deadline:
                    raise BenchError(f"dhrd nbd did not answer: {open(self.logp).read()[-2000:]}")
                time.sleep(0.001)

    def wait_loaded(self):
        def loaded():
            text = open(self.logp).read()
            if "load incomplete" in text or self.proc.poll() is not None:
                raise BenchError(f"dhrd nbd did not load: {text[-2000:]}")
            return "into RAM in" in text

        lib.wait_for(loaded, lib.LOAD_WAIT_S, "dhrd nbd rbd load", 0.05)
        line = [x for x in open(self.logp).read().splitlines() if "into RAM in" in x][-1]
        # "dhrd nbd: loaded N bytes into RAM in S s"
        words = line.split()
        return int(words[words.index("loaded") + 1]), float(words[words.index("in", words.index("RAM")) + 1])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def load_pair(rnd, size, baseline, dhrd):
    """Two load measurements, (name, function giving MiB/s) each, the baseline first in
    even rounds and second in odd ones; returns their MiB/s by name."""
    out = {}
    for name, f in ((baseline, dhrd) if rnd % 2 == 0 else (dhrd, baseline)):
        out[name] = f()
        log(f"[9 rbd] round {rnd} {lib.fmt_size(size)} load, {name}: {out[name]:.0f} MiB/s")
    return out


def reader_load(ctx, cl, image):
    """`dhrd-bench rbd-read`: the whole image into a fresh memfd, dhrd's request size and depth."""
    out = run([ctx.ws.dhrd_bench, "rbd-read", "--image", f"rbd:{POOL}/{image}", "--ceph-conf", cl.conf],
              timeout=3600)
    return json.loads(out[out.index("{"):])["mib_per_sec"]


def fio_load(cl, image, size):
    r = fio_rbd(cl, "rbd-seqread-1M", image, ["--rw=read", "--bs=1M", "--iodepth=16", f"--size={size}",
                                                "--time_based=0"], 3600)
    return r["mib_s"]


def dhrd_load(ctx, cl, image, extra=(), then=None):
    """Starts dhrd on the image, times the first read and the load; `then(d)` runs on the
    loaded export. Returns (first read ms, loaded bytes, load seconds)."""
    d = DhrdRbd(ctx, cl, image, extra)
    try:
        first_ms = d.first_read_ms()
        nbytes, secs = d.wait_loaded()
        if then:
            then(d)
    finally:
        d.stop()
    return first_ms, nbytes, secs


def dhrd_random_jobs(rnd, size, rows, runtime):
    def jobs(d):
        for op in ("randread", "randwrite"):
            for qd in (1, 16):
                r = fio_nbd(d.sock, f"dhrd-{op}-{qd}", rw_args(op, qd, size), runtime)
                rows.append(dict(round=rnd, config="dhrd-nbd-rbd", op=op, qd=qd, **r))
    return jobs


def exp_rbd(ctx):
    p = ctx.p
    if not shutil.which("ceph-osd") or not shutil.which("rbd"):
        return {"title": "9. RBD tier", "skipped": "Ceph is not installed (scripts/install-deps.sh)"}
    cl = Cluster(ctx)
    sizes = p["rbd_bytes"]
    runtime = p["runtime_s"]
    rows, loads, pairs = [], [], []
    images = []
    try:
        for size in sizes:
            image = f"bench-{size // M}m"
            images.append(image)
            cl.rbd("rm", "--no-progress", f"{POOL}/{image}") if image in cl.rbd("ls", POOL).split() else None
            cl.rbd("create", "--size", f"{size // M}M", f"{POOL}/{image}")
            # Fill it, so every read reaches an object (fio writes incompressible data).
            fio_rbd(cl, f"fill-{image}", image, ["--rw=write", "--bs=4M", "--iodepth=16",
                                                  f"--size={size}", "--time_based=0"], 3600)
        big = images[-1]
        for rnd in range(p["rbd_rounds"]):
            # Baselines: librbd directly (dhrd is not running, so the lock is free).
            baseline_random_jobs(cl, big, sizes[-1], runtime, rnd, rows)
            for size, image in zip(sizes[:-1], images[:-1]):
                first_ms, nbytes, secs = dhrd_load(ctx, cl, image)
                loads.append(dict(round=rnd, image_bytes=size, first_read_ms=round(first_ms, 1), load_s=secs,
                                  load_mib_s=round(nbytes / M / secs, 1)))
            size = sizes[-1]

            def fresh():
                first_ms, nbytes, secs = dhrd_load(ctx, cl, big, then=dhrd_random_jobs(rnd, size, rows, runtime))
                loads.append(dict(round=rnd, image_bytes=size, first_read_ms=round(first_ms, 1), load_s=secs,
                                  load_mib_s=round(nbytes / M / secs, 1)))
                return nbytes / M / secs

            def prefaulted():
                _, nbytes, secs = dhrd_load(ctx, cl, big, extra=["--prefault-ram"])
                return nbytes / M / secs

            # Each pair alternates within the round: the baseline first in even rounds.
            pair = load_pair(rnd, size, ("librbd-reader-fresh", lambda: reader_load(ctx, cl, big)),
                             ("dhrd-fresh", fresh))
            pair.update(load_pair(rnd, size, ("fio-1M-qd16", lambda: fio_load(cl, big, size)),
                                  ("dhrd-prefaulted", prefaulted)))
            pairs.append(dict(round=rnd, **pair))
            # The random jobs again after dhrd's, so that a drift of the cluster during the
            # round (BlueStore's deferred writes, compaction) weighs on both sides.
            baseline_random_jobs(cl, big, sizes[-1], runtime, rnd, rows)
    finally:
        for image in images:
            run(["rbd", "-c", cl.conf, "rm", "--no-progress", f"{POOL}/{image}"], check=False, timeout=600)
        cl.stop()
    return summarize(p, sizes, rows, loads, pairs, runtime)


# Targets (docs/rbd.md): dhrd's load into fresh RAM against the plain reader doing the same;
# into pre-faulted RAM against fio.
READER_TARGET = 0.9
FIO_TARGET = 0.85


def summarize(p, sizes, rows, loads, pairs, runtime):
    def med(config, op, qd, key):
        return lib.median([r.get(key) for r in rows if r["config"] == config and r["op"] == op and r["qd"] == qd])

    table = []
    for config in ("fio-rbd", "dhrd-nbd-rbd"):
        for op in ("randread", "randwrite"):
            for qd in (1, 16):
                iops = med(config, op, qd, "iops")
                lat = med(config, op, qd, ("read" if op == "randread" else "write") + "_lat_mean_us")
                table.append(dict(config=config, op=op, qd=qd, iops=round(iops or 0),
                                  lat_mean_us=round(lat or 0, 1)))
    for name, what in (("librbd-reader-fresh", "full read into a fresh memfd (dhrd-bench rbd-read)"),
                       ("dhrd-fresh", "full load into fresh RAM"),
                       ("fio-1M-qd16", "fio rbd sequential read, 1 MiB, QD16 (one reused buffer)"),
                       ("dhrd-prefaulted", "full load into pre-faulted RAM (--prefault-ram)")):
        table.append(dict(config=name, op=what, qd="-", mib_s=round(lib.median([x[name] for x in pairs]) or 0, 1)))
    ratios = []

    def add(what, num, den, baseline, target=None):
        if num and den:
            ratios.append({"what": what, "figure": "dhrd-nbd-rbd", "baseline": baseline,
                           "value": round(num / den, 3), **({"target": target} if target else {})})

    for qd in (1, 16):
        add(f"4 KiB random read of a loaded image, QD{qd}", med("dhrd-nbd-rbd", "randread", qd, "iops"),
            med("fio-rbd", "randread", qd, "iops"), "fio rbd engine (librbd)")
        add(f"4 KiB random write, durable on return, QD{qd}", med("dhrd-nbd-rbd", "randwrite", qd, "iops"),
            med("fio-rbd", "randwrite", qd, "iops"), "fio rbd engine (librbd, cache off)")

    def per_round(num, den):
        return lib.median([x[num] / x[den] for x in pairs if x.get(den)])

    big = lib.fmt_size(sizes[-1])
    add(f"full load of {big} into fresh RAM (median of per-round ratios)", per_round("dhrd-fresh",
        "librbd-reader-fresh"), 1, "a plain librbd reader into a fresh memfd, same request size and depth",
        f">= {READER_TARGET:g}x")
    add(f"full load of {big} into pre-faulted RAM (median of per-round ratios)", per_round("dhrd-prefaulted",
        "fio-1M-qd16"), 1, "fio rbd sequential read, 1 MiB, QD16", f">= {FIO_TARGET:g}x")
    add(f"full load of {big} into fresh RAM against fio (unequal work: fio reuses its buffer; the earlier "
        "comparison)", per_round("dhrd-fresh", "fio-1M-qd16"), 1, "fio rbd sequential read, 1 MiB, QD16")
    add(f"what fresh RAM costs a plain client: the reader into a fresh memfd against fio ({big})",
        per_round("librbd-reader-fresh", "fio-1M-qd16"), 1, "fio rbd sequential read, 1 MiB, QD16")
    for r in ratios:
        if r["what"].startswith("what fresh RAM"):
            r["figure"] = "librbd-reader-fresh"
    firsts = {}
    for x in loads:
        firsts.setdefault(x["image_bytes"], []).append(x["first_read_ms"])
    notes = [f"start to first read answered, image of {lib.fmt_size(s)}: median {lib.median(v):.1f} ms over "
             f"{len(v)} start(s) (includes connecting to the monitors, opening the image and taking its "
             f"exclusive lock)" for s, v in sorted(firsts.items())]
    notes.append("fio's rbd engine opens the image itself: the random-I/O baselines run while dhrd is stopped, "
                 "before and after dhrd's jobs in every round; each figure is the median over all its runs.")
    notes.append("Loads, each pair alternating within a round: dhrd's load into fresh RAM against "
                 "`dhrd-bench rbd-read` (librbd alone, read-only, reading the image into a fresh memfd with "
                 "dhrd's 1 MiB requests and its loader threads x pieces per chunk in flight); dhrd's load into "
                 "pre-faulted RAM (`--prefault-ram`, timed after the pre-fault) against fio at 1 MiB QD16. "
                 "Fresh RAM costs zeroing and, on this VM, the host's first touch (docs/rbd.md).")
    return {
        "title": "9. RBD tier: dhrd nbd on a Ceph RBD image vs librbd (fio's rbd engine, a plain reader)",
        "scaling": f"images of {', '.join(lib.fmt_size(s) for s in sizes)} on a one-node cluster, "
                   f"{p['rbd_rounds']} round(s), {runtime} s per fio job",
        "rows": table,
        "loads": loads,
        "load_pairs": pairs,
        "raw": rows,
        "ratios": ratios,
        "notes": notes,
    }
