"""The seven experiments of the suite (the papers' evaluation, issue 5), scaled to this machine.

Each experiment takes the run context and returns a dict: `title`, `scaling` (how it was
scaled down from the paper), `rows` (one dict per measured point, with `config`), `ratios`
(figure / baseline from the same run) and `notes`. Configurations are started and stopped
inside the experiment, one at a time, so they never compete for the machine.
"""

import contextlib
import json
import os
import subprocess
import time

import apps
import attach
import blockfs
import configs
import lib
import cache
import nvm
import rbd
import rehypar
import seed002
import tier
from lib import BenchError, log, run

BLOCK_OPS = ("randread", "randwrite")
FILE_WORKLOADS = (
    # name, fio rw, block size, read fraction
    ("randread", "randread", "4k", None),
    ("seqread", "read", "1M", None),
    ("randrw-66-34", "randrw", "4k", 66),
    ("randwrite", "randwrite", "4k", None),
    ("seqwrite", "write", "1M", None),
)
# Worker threads for original-timing replays (requests outstanding at most).
ORIGINAL_TIMING_THREADS = 32
TRACES = (
    ("websearch", "websearch/WebSearch1.first24783.spc"),
    ("tpcc", "oltp_tpcc/tpcc-small.trace"),
    ("msr-hm0", "msr_cambridge/hm_0.first1000.csv"),
)


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def point_ratio(rows, key, num, den, what, baseline_name, **match):
    """A ratio of `key` between two configurations at the same point."""

    def find(cfg):
        for r in rows:
            if r.get("config") == cfg and all(r.get(k) == v for k, v in match.items()):
                return r.get(key)
        return None

    a, b = find(num), find(den)
    if a is None or b is None:
        return None
    where = ", ".join(f"{k}={v}" for k, v in match.items())
    return {"what": f"{what} ({where})" if where else what, "figure": num, "baseline": baseline_name or den,
            "value": ratio(a, b)}


class NbdServer:
    """`dhrd nbd` (defaults: `sync` durability) over a fresh copy of the source data on the
    disk under test, on a Unix socket; started loaded (the load finished)."""

    def __init__(self, ctx, size, name):
        self.ctx, self.size, self.name = ctx, size, name
        self.img = os.path.join(ctx.ws.disk, f"{name}.img")
        self.sock = os.path.join(ctx.ws.disk, f"{name}.sock")

    def start(self):
        run(["cp", "--sparse=never", self.ctx.ws.source(self.size), self.img])
        lib.drop_caches()
        logp = os.path.join(self.ctx.out, "logs", f"{self.name}.log")
        self.log = open(logp, "w")
        self.proc = subprocess.Popen([self.ctx.ws.dhrd, "nbd", "--backing", self.img, "--socket", self.sock],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        lib.wait_for(lambda: os.path.exists(self.sock), lib.MOUNT_WAIT_S, "dhrd nbd socket")
        lib.wait_for(lambda: "loaded" in open(logp).read(), lib.LOAD_WAIT_S, "dhrd nbd load", 0.05)
        return self.sock

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.log.close()
        os.unlink(self.img)


# --------------------------------------------------------------------------------------
# 1. Block level
# --------------------------------------------------------------------------------------


class BlockTarget:
    """Something fio can address as a device: a file in a mount, a loop device, NBD."""

    def __init__(self, name, modes, durable):
        self.name, self.modes, self.durable = name, modes, durable

    def fio_target(self):
        raise NotImplementedError


def block_targets(ctx):
    ws, size = ctx.ws, ctx.p["block_bytes"]
    out = []

    class DiskFile(BlockTarget):
        def start(self):
            self.path = os.path.join(ws.disk, "block-disk.img")
            run(["cp", "--sparse=never", ws.source(size), self.path])

        def fio_target(self, mode, op):
            args = [f"--filename={self.path}", f"--size={size}"]
            if mode == "direct":
                args += ["--direct=1"] + (["--sync=dsync"] if op == "randwrite" else [])
            return args

        def before_point(self):
            lib.drop_caches()

        def stop(self):
            os.unlink(self.path)

    out.append(DiskFile("disk", ("buffered", "direct"),
                        {"buffered": "at writeback", "direct": "on return (O_DSYNC)"}))

    class Ramdisk(BlockTarget):
        def start(self):
            self.rd = configs.RamdiskExt4(ws, name="ramdisk")
            self.rd.attach(size)
            run(["dd", f"if={ws.source(size)}", f"of={self.rd.loop}", "bs=1M", "status=none"])

        def fio_target(self, mode, op):
            return [f"--filename={self.rd.loop}", f"--size={size}"] + (["--direct=1"] if mode == "direct" else [])

        def stop(self):
            self.rd.stop()

    out.append(Ramdisk("ramdisk-loop", ("buffered", "direct"), {"buffered": "never", "direct": "never"}))

    class TmpfsFile(BlockTarget):
        def start(self):
            self.t = configs.Tmpfs(ws)
            self.t.start({"dev.img": size})

        def fio_target(self, mode, op):
            return [f"--filename={self.t.dir}/dev.img", f"--size={size}"]

        def stop(self):
            self.t.stop()

    out.append(TmpfsFile("tmpfs", ("buffered",), {"buffered": "never"}))

    class DhrdFile(BlockTarget):
        def __init__(self, read_path, modes):
            super().__init__(f"dhrd-{read_path}", modes, {m: "on return" for m in modes})
            self.read_path = read_path

        def start(self):
            self.d = configs.Dhrd(ws, self.read_path)
            self.d.start({"dev.img": size})

        def fio_target(self, mode, op):
            return [f"--filename={self.d.dir}/dev.img", f"--size={size}"] + (
                ["--direct=1"] if mode == "direct" else [])

        def stop(self):
            self.d.stop()

    # The default data path (the backing file's page cache, passed through; O_DIRECT opens
    # served by the daemon from it), and the engine's paths for the paper's comparison.
    class AttachFile(BlockTarget):
        def start(self):
            self.d = configs.DhrdAttach(ws)
            self.d.start({"dev.img": size})

        def fio_target(self, mode, op):
            return [f"--filename={self.d.dir}/dev.img", f"--size={size}"] + (
                ["--direct=1"] if mode == "direct" else [])

        def stop(self):
            self.d.stop()

    out.append(AttachFile("dhrd-attach", ("buffered", "direct"), {"buffered": "on return", "direct": "on return"}))
    out.append(DhrdFile("pagecache", ("buffered", "direct")))
    out.append(DhrdFile("cached", ("buffered",)))
    out.append(DhrdFile("direct", ("direct",)))

    class DhrdNbd(BlockTarget):
        def start(self):
            self.server = NbdServer(ctx, size, "dhrd-nbd")
            self.sock = self.server.start()

        def fio_target(self, mode, op):
            return ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={self.sock}"]

        def stop(self):
            self.server.stop()

    out.append(DhrdNbd("dhrd-nbd", ("direct",), {"direct": "on return"}))
    return out


def exp_block(ctx):
    p = ctx.p
    rows = []
    for t in block_targets(ctx):
        if ctx.only_configs and t.name not in ctx.only_configs:
            continue
        log(f"[1 block] {t.name}: start")
        t.start()
        try:
            for mode in t.modes:
                for op in BLOCK_OPS:
                    for procs in p["procs"]:
                        if hasattr(t, "before_point"):
                            t.before_point()
                        r = lib.fio(f"{t.name}-{mode}-{op}-{procs}",
                                    [f"--rw={op}", "--bs=4k", f"--numjobs={procs}"] + t.fio_target(mode, op),
                                    p["runtime_s"])
                        r.update(config=t.name, mode=mode, op=op, procs=procs, durable=t.durable[mode])
                        rows.append(r)
                        log(f"[1 block] {t.name} {mode} {op} x{procs}: {r['iops']:.0f} IOPS")
        finally:
            t.stop()
    ratios = []
    for procs in p["procs"]:
        for num, den, op, what in (
            ("dhrd-pagecache", "disk", "randread", "dhrd (page cache) read vs disk O_DIRECT"),
            ("dhrd-direct", "disk", "randread", "DBR dhrd (engine) read vs disk O_DIRECT"),
            ("dhrd-pagecache", "disk", "randwrite", "dhrd (page cache) sync write vs disk O_DIRECT+O_DSYNC"),
            ("dhrd-attach", "disk", "randwrite", "dhrd attach sync write vs disk O_DIRECT+O_DSYNC"),
            ("dhrd-direct", "disk", "randwrite", "dhrd (engine) sync write vs disk O_DIRECT+O_DSYNC"),
            ("dhrd-nbd", "disk", "randwrite", "dhrd NBD sync write vs disk O_DIRECT+O_DSYNC"),
        ):
            # The page cache path's buffered opens (passthrough); the engine's own mode.
            a = [r for r in rows if r["config"] == num and r["op"] == op and r["procs"] == procs
                 and (num not in ("dhrd-pagecache", "dhrd-attach") or r["mode"] == "buffered")]
            b = [r for r in rows if r["config"] == den and r["op"] == op and r["procs"] == procs
                 and r["mode"] == "direct"]
            if a and b:
                ratios.append({"what": f"{what} ({procs} procs)", "figure": num, "baseline": "disk direct",
                               "value": ratio(a[0]["iops"], b[0]["iops"])})
        for num, what in (("dhrd-direct", "DBR dhrd (engine) read vs loop-over-tmpfs RAM disk, direct"),
                          ("dhrd-pagecache", "dhrd (page cache) read vs tmpfs"),
                          ("dhrd-attach", "dhrd attach read vs tmpfs")):
            den = "ramdisk-loop" if num == "dhrd-direct" else "tmpfs"
            a = [r for r in rows if r["config"] == num and r["op"] == "randread" and r["procs"] == procs
                 and r["mode"] == ("direct" if num == "dhrd-direct" else "buffered")]
            b = [r for r in rows if r["config"] == den and r["op"] == "randread" and r["procs"] == procs
                 and r["mode"] == ("direct" if den == "ramdisk-loop" else "buffered")]
            if a and b:
                ratios.append({"what": f"{what} ({procs} procs)", "figure": num, "baseline": den,
                               "value": ratio(a[0]["iops"], b[0]["iops"])})
    return {
        "title": "1. Block level: 4 KiB random read and write, 1 to 32 processes (paper Figure 6)",
        "scaling": f"a {lib.fmt_size(p['block_bytes'])} device instead of the paper's RAID volume; "
                   f"{p['runtime_s']} s per point; processes {p['procs']} on {os.cpu_count()} cores; "
                   "psync, queue depth 1 per process",
        "rows": rows,
        "ratios": ratios,
        "notes": [
            "disk = a file on the disk's ext4 (there is no spare raw disk here); buffered starts with a cold "
            "cache, direct writes are O_DIRECT+O_DSYNC so they carry the same guarantee as dhrd's.",
            "ramdisk-loop = a loop device over a tmpfs file (the papers' RAMDisk); dhrd-* = one file in a "
            "`dhrd mount` (sync durability): dhrd-pagecache is the default data path (the backing file's page "
            "cache, passed through; its direct mode opens O_DIRECT, which the daemon serves from the page "
            "cache), dhrd-direct and dhrd-cached the engine's paths (RAM copy in a memfd, with and without "
            "DBR); dhrd-nbd = `dhrd nbd` through fio's libnbd engine, one connection per process.",
        ],
    }


# --------------------------------------------------------------------------------------
# 2. Trace replay
# --------------------------------------------------------------------------------------


def exp_replay(ctx):
    p, ws = ctx.p, ctx.ws
    traces_dir = ctx.traces
    if not traces_dir or not os.path.isdir(traces_dir):
        return {"title": "2. Trace replay", "skipped": f"trace directory {traces_dir} not found"}
    size = p["replay_bytes"]
    rows = []

    def targets():
        pc = configs.Dhrd(ws, "pagecache")
        yield "dhrd-pagecache", "on return", lambda: (pc.start({"dev.img": size}), f"{pc.dir}/dev.img")[1], \
            pc.stop, []
        d = configs.Dhrd(ws, "direct")
        # Replayed with O_DIRECT like disk-direct, so both see the same 4 KiB-aligned
        # request stream (the direct read path bypasses the page cache either way).
        yield "dhrd-direct", "on return", lambda: (d.start({"dev.img": size}), f"{d.dir}/dev.img")[1], d.stop, [
            "--direct"]
        at = configs.DhrdAttach(ws)
        yield "dhrd-attach", "on return", lambda: (at.start({"dev.img": size}), f"{at.dir}/dev.img")[1], at.stop, []
        c = configs.Dhrd(ws, "cached")
        yield "dhrd-cached", "on return", lambda: (c.start({"dev.img": size}), f"{c.dir}/dev.img")[1], c.stop, []
        t = configs.Tmpfs(ws)
        yield "tmpfs", "never", lambda: (t.start({"dev.img": size}), f"{t.dir}/dev.img")[1], t.stop, []
        rd = configs.RamdiskExt4(ws, name="ramdisk")

        def rd_start():
            rd.attach(size)
            return rd.loop

        yield "ramdisk-loop", "never", rd_start, rd.stop, []
        disk = os.path.join(ws.disk, "replay-disk.img")

        def disk_start():
            run(["cp", "--sparse=never", ws.source(size), disk])
            lib.drop_caches()
            return disk

        # `dhrd nbd` in `sync` durability over a file of the same disk: the block path,
        # replayed by the NBD client built into the replayer (one connection per worker).
        nbd = NbdServer(ctx, size, "replay-dhrd-nbd")
        yield "dhrd-nbd", "on return", nbd.start, nbd.stop, []
        yield "disk-direct", "on return (fdatasync)", disk_start, lambda: os.unlink(disk), ["--direct", "--fsync-writes"]
        yield "disk-fsync", "on return (fdatasync)", disk_start, lambda: os.unlink(disk), ["--fsync-writes"]
        yield "disk-buffered", "at writeback", disk_start, lambda: os.unlink(disk), []

    for name, durable, start, stop, extra in targets():
        if ctx.only_configs and name not in ctx.only_configs:
            continue
        log(f"[2 replay] {name}: start")
        path = start()
        try:
            def replay(tname, rel, tag, qd_label, args):
                """One `dhrd-bench replay --verify` of a trace; returns its row and the full JSON."""
                out = os.path.join(ctx.out, "logs", f"replay-{name}-{tname}-{tag}.json")
                target = ["--nbd", path] if name == "dhrd-nbd" else ["--target", path]
                run([ws.dhrd_bench, "replay", "--trace", os.path.join(traces_dir, rel)] + target + [
                     "--size", str(size), "--verify", "--json", out] + args + extra, timeout=3600)
                d = json.load(open(out))
                if not d["verify"]["ok"]:
                    raise BenchError(f"replay verify failed on {name} with {tname}")
                r = {"config": name, "trace": tname, "qd": qd_label, "durable": durable, "iops": d["iops"],
                     "mib_s": d["mib_per_s"], "requests": d["requests"], "verify_ok": d["verify"]["ok"]}
                lat = d["latency_us"]
                for k in ("read", "write"):
                    if lat.get(k) and lat[k].get("count"):
                        r[f"{k}_lat_p50_us"] = lat[k]["p50"]
                        r[f"{k}_lat_p99_us"] = lat[k]["p99"]
                return r, d

            for tname, rel in TRACES:
                for qd in p["replay_qd"]:
                    r, _ = replay(tname, rel, f"qd{qd}", qd,
                                  ["--queue-depth", str(qd), "--repeat", str(p["replay_repeat"])])
                    rows.append(r)
                    log(f"[2 replay] {name} {tname} qd{qd}: {r['iops']:.0f} IOPS")
            # The trace's own arrival times (sped up): latency under a realistic load
            # rather than at saturation.
            tname, rel = TRACES[0]
            r, d = replay(tname, rel, "original", f"original x{p['replay_speedup']:g}",
                          ["--queue-depth", str(ORIGINAL_TIMING_THREADS), "--timing", "original",
                           "--speedup", str(p["replay_speedup"])])
            late = d.get("lateness_us") or {}
            r["late_p99_us"] = (late.get("hist") or {}).get("p99")
            r["late_over_1ms"] = late.get("late_over_1ms")
            rows.append(r)
            log(f"[2 replay] {name} {tname} original timing: read p99 {r.get('read_lat_p99_us')} us")
        finally:
            stop()
    ratios = []
    for tname, _ in TRACES:
        for qd in p["replay_qd"]:
            for num, den, what in (("dhrd-pagecache", "ramdisk-loop", "dhrd (page cache) vs RAM disk"),
                                   ("dhrd-attach", "ramdisk-loop", "dhrd attach vs RAM disk"),
                                   ("dhrd-pagecache", "disk-fsync", "dhrd (page cache) vs ext4 + fdatasync per write"),
                                   ("dhrd-nbd", "disk-fsync",
                                    "dhrd nbd (sync) vs ext4 + fdatasync per write (issue 32 target >= 1.5)"),
                                   ("dhrd-pagecache", "tmpfs", "dhrd (page cache) vs tmpfs"),
                                   ("dhrd-direct", "ramdisk-loop", "DBR dhrd (engine) vs RAM disk"),
                                   ("dhrd-direct", "disk-direct", "DBR dhrd (engine) vs disk O_DIRECT")):
                r = point_ratio(rows, "iops", num, den, what, None, trace=tname, qd=qd)
                if r:
                    ratios.append(r)
    return {
        "title": "2. Trace replay: SPC WebSearch, TPC-C (DiskSim), MSR hm_0 (paper Figure 7)",
        "scaling": f"offsets folded into a {lib.fmt_size(size)} target (`dhrd-bench replay` states the rule); "
                   f"each trace replayed {p['replay_repeat']} times in a row, as fast as possible, "
                   f"queue depths {p['replay_qd']}; WebSearch also with its own timing sped up "
                   f"{p['replay_speedup']:g}x; every read verified against a shadow of the writes",
        "rows": rows,
        "ratios": ratios,
        "notes": ["disk-direct replays with O_DIRECT and disk-fsync buffered, both with an fdatasync after every "
                  "write (durable like dhrd's sync mode); disk-buffered leaves writes in the page cache. "
                  "dhrd-direct (engine) and disk-direct replay with O_DIRECT (lengths rounded up to 4 KiB), the "
                  "others buffered (512-byte alignment), as `dhrd-bench replay` states; dhrd-pagecache is the "
                  "default data path, whose buffered writes are synchronous (sync flag)."],
    }


# --------------------------------------------------------------------------------------
# 3. File level
# --------------------------------------------------------------------------------------

FILE_CONFIGS = ("dhrd-pagecache", "dhrd-cached", "dhrd-direct", "tmpfs", "ext4-fsync", "ext4-direct",
                "ext4-vmtouch", "ramdisk-ext4")


def exp_file(ctx):
    p = ctx.p
    size = p["file_bytes"]
    rows = []
    for cfg in configs.file_configs(ctx.ws, ctx.pick(FILE_CONFIGS)):
        log(f"[3 file] {cfg.name}: start")
        cfg.start({"data": size})
        try:
            for wname, rw, bs, mix in FILE_WORKLOADS:
                is_read = rw in ("randread", "read")
                if cfg.name in ("ext4-fsync",):
                    lib.drop_caches()
                args = [f"--filename={cfg.dir}/data", f"--size={size}", f"--rw={rw}", f"--bs={bs}",
                        "--numjobs=1"]
                if mix:
                    args.append(f"--rwmixread={mix}")
                if isinstance(cfg, configs.Dhrd) or cfg.name in ("tmpfs", "ext4-vmtouch", "ramdisk-ext4"):
                    args.append("--invalidate=0")
                args += cfg.fio_read if is_read else (cfg.fio_write or cfg.fio_read)
                r = lib.fio(f"{cfg.name}-{wname}", args, p["runtime_s"])
                r.update(config=cfg.name, workload=wname, durable=cfg.durable)
                rows.append(r)
                log(f"[3 file] {cfg.name} {wname}: {r['iops']:.0f} IOPS {r['mib_s']:.1f} MiB/s")
        finally:
            cfg.stop()
    ratios = []
    reads = (("dhrd-pagecache", "tmpfs", "dhrd (page cache) vs tmpfs"),
             ("dhrd-pagecache", "ext4-vmtouch", "dhrd (page cache) vs vmtouch-preloaded ext4"),
             ("dhrd-pagecache", "ext4-direct", "dhrd (page cache) vs ext4 O_DIRECT"),
             ("dhrd-direct", "ext4-direct", "DBR dhrd (engine) vs ext4 O_DIRECT"),
             ("dhrd-direct", "dhrd-cached", "DBR dhrd (engine) vs dhrd without DBR"))
    # Writes only against configurations whose writes are durable on return too.
    writes = (("dhrd-pagecache", "ext4-direct", "dhrd (page cache) vs ext4 O_DIRECT+O_DSYNC"),
              ("dhrd-pagecache", "ext4-fsync", "dhrd (page cache) vs ext4 write+fsync"),
              ("dhrd-pagecache", "ext4-vmtouch", "dhrd (page cache) vs vmtouch-preloaded ext4 (write+fsync)"),
              ("dhrd-direct", "ext4-direct", "dhrd (engine) vs ext4 O_DIRECT+O_DSYNC"))
    for wname, rw, *_ in FILE_WORKLOADS:
        key = "mib_s" if wname.startswith("seq") else "iops"
        for num, den, what in (reads if rw in ("randread", "read") else writes):
            r = point_ratio(rows, key, num, den, f"{what}, {key}", None, workload=wname)
            if r:
                ratios.append(r)

    def get(cfg, wl, k):
        return next((r.get(k) for r in rows if r["config"] == cfg and r["workload"] == wl), None)

    # Issue 3's yardstick for the mixed workload: what a RAM read and a raw durable write
    # would give if nothing else cost anything.
    t_read = get("tmpfs", "randread", "read_lat_mean_us")
    t_write = get("ext4-direct", "randwrite", "write_lat_mean_us")
    for cfg in ("dhrd-pagecache", "dhrd-direct"):
        got = get(cfg, "randrw-66-34", "iops")
        if t_read and t_write and got:
            ideal = 1e6 / (0.66 * t_read + 0.34 * t_write)
            ratios.append({"what": "mixed 66:34 vs 1/(0.66 t_read(tmpfs) + 0.34 t_write(O_DIRECT+O_DSYNC))",
                           "figure": cfg, "baseline": "formula from tmpfs and ext4-direct", "value": ratio(got, ideal)})
    return {
        "title": "3. File level: sequential 1 MiB and random 4 KiB read/write, mixed 66:34 (paper Figure 8)",
        "scaling": f"one file of {lib.fmt_size(size)} per configuration, 1 process, queue depth 1, "
                   f"{p['runtime_s']} s per point",
        "rows": rows,
        "ratios": ratios,
        "notes": ["dhrd writes are durable on return (sync mode); ext4-fsync, ext4-direct (O_DSYNC) and "
                  "ext4-vmtouch (fsync) likewise; tmpfs and ramdisk-ext4 never are.",
                  "dhrd-pagecache is the default data path: the kernel serves every open, read-write ones "
                  "included, from the backing file's page cache; dhrd-direct and dhrd-cached are the engine's "
                  "paths (every write, and every read on the direct path, through the daemon)."],
    }


# --------------------------------------------------------------------------------------
# 4. Fileserver
# --------------------------------------------------------------------------------------

# Each dhrd mode meets the ext4 that promises the same: fsync mode plain ext4, sync mode
# ext4 mounted `sync,dirsync` (and ext4 with an fsync per write, what users script today).
FILESERVER_CONFIGS = ("dhrd-pagecache", "dhrd-pagecache-fsync", "dhrd-attach", "dhrd-attach-fsync", "tmpfs",
                      "ext4-buffered", "ext4-fsync", "ext4-syncdirsync", "ramdisk-ext4")
# The metadata workloads compare each dhrd durability mode with the ext4 that promises the
# same: fsync mode with plain ext4, sync mode with ext4 mounted `sync,dirsync`.
METADATA_CONFIGS = ("dhrd-pagecache", "dhrd-pagecache-fsync", "dhrd-attach", "dhrd-attach-fsync", "tmpfs",
                    "ext4-buffered", "ext4-syncdirsync")
# Room on the metadata workloads' file system: their files are empty or up to 10 KB.
META_ROOM_BYTES = 512 << 20
METADATA_RATIOS = (("dhrd-pagecache-fsync", "ext4-buffered"), ("dhrd-pagecache", "ext4-syncdirsync"),
                   ("dhrd-attach-fsync", "ext4-buffered"), ("dhrd-attach", "ext4-syncdirsync"),
                   ("dhrd-pagecache-fsync", "tmpfs"))


def postmark(bench_dir, p):
    """Runs Postmark in `bench_dir`; returns its figures, the transaction phase timed here.

    Postmark reports whole seconds; it flushes its progress line by line, so the phase is
    timed from "Performing transactions" to the "Done" that ends it."""
    import shutil as _shutil
    if not _shutil.which("postmark"):
        raise BenchError("postmark is not installed (bash scripts/install-deps.sh installs it)")
    loc = os.path.join(bench_dir, "dhrd-postmark")
    os.makedirs(loc)
    cfg = os.path.join(bench_dir, "dhrd-postmark.cfg")
    with open(cfg, "w") as f:
        f.write(f"set location {loc}\nset number {p['pm_files']}\nset size 500 10000\n"
                f"set bias read 5\nset transactions {p['pm_transactions']}\nset seed 1\nrun\nquit\n")
    t0 = time.monotonic()
    proc = subprocess.Popen(["postmark", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, marks = b"", {}
    while True:
        c = os.read(proc.stdout.fileno(), 4096)
        if not c:
            break
        out += c
        now = time.monotonic()
        if "tx_start" not in marks and b"Performing transactions" in out:
            marks["tx_start"] = now
        if "tx_start" in marks and "tx_end" not in marks and \
                b"Done" in out[out.index(b"Performing transactions"):]:
            marks["tx_end"] = now
    rc = proc.wait()
    total_s = time.monotonic() - t0
    os.unlink(cfg)
    text = out.decode(errors="replace")
    if rc != 0 or "tx_end" not in marks:
        raise BenchError(f"postmark failed ({rc}) in {bench_dir}: {text[-2000:]}")
    shutil_rm(loc)
    tx_s = marks["tx_end"] - marks["tx_start"]
    return {"transactions": p["pm_transactions"], "files": p["pm_files"], "tx_secs": round(tx_s, 3),
            "tx_per_sec": round(p["pm_transactions"] / max(tx_s, 1e-6), 1), "total_secs": round(total_s, 3)}


def shutil_rm(path):
    import shutil as _shutil
    _shutil.rmtree(path, ignore_errors=True)


def disk_for(ctx, name, nbytes):
    """Where configuration `name` keeps its files: a fresh journalled ext4 for dhrd and the
    ext4 baselines (configs.JournaledDisk says why); the RAM configurations, and
    ext4-syncdirsync, which makes its own journalled ext4 the same way, as they are."""
    if name in ("tmpfs", "ramdisk-ext4", "ext4-syncdirsync"):
        return contextlib.nullcontext(ctx.ws)
    return configs.JournaledDisk(ctx.ws, "fileserver-disk", nbytes)


def exp_fileserver(ctx):
    p = ctx.p
    rows = []
    for name in ctx.pick(FILESERVER_CONFIGS):
        for nfiles in p["fs_files"]:
            log(f"[4 fileserver] {name} {nfiles} files: start")
            room = nfiles * p["fs_mean_file_bytes"] * 3 + (256 << 20)
            # fsync after every whole-file write and append where the configuration
            # promises durability (ext4-fsync, and dhrd's sync mode, where it is cheap).
            fsync = name in ("ext4-fsync", "ext4-syncdirsync", "dhrd-pagecache", "dhrd-attach")
            with disk_for(ctx, name, room) as ws:
                cfg = configs.file_configs(ws, [name])[0]
                cfg.start({}, room=room)
                try:
                    out = run([ctx.ws.dhrd_bench, "fileserver", "--dir", cfg.dir,
                               "--files", str(nfiles), "--threads", str(p["fs_threads"]),
                               "--secs", str(p["fs_secs"]), "--mean-file-bytes", str(p["fs_mean_file_bytes"])]
                              + (["--fsync"] if fsync else []), timeout=7200)
                    d = json.loads(out[out.index("{"):])
                finally:
                    cfg.stop()
            r = {"workload": "fileserver", "config": cfg.name, "files": nfiles, "durable": cfg.durable,
                 "fsync": fsync}
            r.update({k: v for k, v in d.items() if not isinstance(v, (dict, list))})
            r["flowops"] = d.get("flowops")
            rows.append(r)
            log(f"[4 fileserver] {cfg.name} {nfiles}: {r.get('ops_per_sec', 0):.0f} ops/s")
    ratios = []
    for n in p["fs_files"]:
        for num, den in (("dhrd-pagecache", "ext4-fsync"), ("dhrd-pagecache-fsync", "ext4-buffered"),
                         ("dhrd-pagecache", "tmpfs"), ("dhrd-pagecache-fsync", "ramdisk-ext4"),
                         ("dhrd-attach", "ext4-fsync"), ("dhrd-attach-fsync", "ext4-buffered"),
                         ("dhrd-pagecache", "ext4-syncdirsync"), ("dhrd-attach", "ext4-syncdirsync")):
            r = point_ratio([x for x in rows if x["workload"] == "fileserver"], "ops_per_sec", num, den,
                            f"fileserver {num} vs {den}, ops/s", None, files=n)
            if r:
                ratios.append(r)

    for name in ctx.pick(METADATA_CONFIGS):
        room = META_ROOM_BYTES
        with disk_for(ctx, name, room) as ws:
            cfg = configs.file_configs(ws, [name])[0]
            cfg.start({}, room=room)
            try:
                for threads in (1, 8):
                    log(f"[4 fileserver] metaops {cfg.name} {threads} thread(s): start")
                    out = run([ctx.ws.dhrd_bench, "metaops", "--dir", cfg.dir, "--threads", str(threads),
                               "--files-per-thread", str(p["meta_files"] // threads)], timeout=3600)
                    d = json.loads(out[out.index("{"):])
                    rows.append({"workload": "metaops", "config": cfg.name, "threads": threads,
                                 "durable": cfg.durable, "ops_per_sec": d["ops_per_sec"],
                                 **{f"{k}_per_sec": v["ops_per_sec"] for k, v in d["phases"].items()}})
                    log(f"[4 fileserver] metaops {cfg.name} {threads}: {d['ops_per_sec']:.0f} ops/s")
                log(f"[4 fileserver] postmark {cfg.name}: start")
                pm = postmark(cfg.dir, p)
                rows.append({"workload": "postmark", "config": cfg.name, "durable": cfg.durable, **pm})
                log(f"[4 fileserver] postmark {cfg.name}: {pm['tx_per_sec']:.0f} tx/s")
            finally:
                cfg.stop()
    for num, den in METADATA_RATIOS:
        for threads in (1, 8):
            r = point_ratio([x for x in rows if x["workload"] == "metaops"], "ops_per_sec", num, den,
                            f"create+stat+unlink {num} vs {den}, ops/s", None, threads=threads)
            if r:
                ratios.append(r)
        r = point_ratio([x for x in rows if x["workload"] == "postmark"], "tx_per_sec", num, den,
                        f"Postmark {num} vs {den}, transactions/s", None)
        if r:
            ratios.append(r)
    return {
        "title": "4. Fileserver, Postmark and metadata (Filebench fileserver personality, reimplemented) "
                 "(paper Figure 9)",
        "scaling": f"fileserver: file counts {p['fs_files']} with a mean file size of "
                   f"{lib.fmt_size(p['fs_mean_file_bytes'])} (Filebench: 128 KiB; smaller here so 80% preallocation "
                   f"fits in RAM and on the disk), {p['fs_threads']} threads, {p['fs_secs']} s per point; "
                   f"metaops: {p['meta_files']} empty files created, stat'ed and unlinked by 1 and by 8 threads; "
                   f"Postmark: {p['pm_files']} files of 500 B-10 KB, {p['pm_transactions']} transactions, "
                   f"read:append 5:5",
        "rows": rows,
        "ratios": ratios,
        "notes": ["fileserver: dhrd-pagecache (sync durability) makes every create, write, append and delete "
                  "durable before it returns and runs with `--fsync` like ext4-fsync and ext4-syncdirsync "
                  "(fsync after every whole-file write and append); dhrd-pagecache-fsync, ext4-buffered, tmpfs "
                  "and ramdisk-ext4 do not sync (Filebench's default).",
                  "metaops and Postmark: dhrd-pagecache is compared with ext4 mounted sync,dirsync (every "
                  "change durable on return, on a loop device over a file on the same disk); "
                  "dhrd-pagecache-fsync with ext4 without syncs. Postmark's transaction phase is timed by the "
                  "suite (Postmark itself reports whole seconds)."],
    }


# --------------------------------------------------------------------------------------
# 5. Video
# --------------------------------------------------------------------------------------

VIDEO_CONFIGS = ("dhrd-pagecache", "dhrd-pagecache-fsync", "dhrd-attach", "dhrd-attach-fsync", "tmpfs-copyback",
                 "ext4-fsync", "ext4-buffered", "ramdisk-ext4")


def _video_once(ctx, cfg, rep):
    """One run of the workload in a fresh start of `cfg`: its row."""
    p = ctx.p
    log(f"[5 video] {cfg.name}, repeat {rep}: start")
    cfg.start({}, room=p["video_bytes"] * (p["video_rounds"] + 1) + (64 << 20))
    try:
        out = run([ctx.ws.dhrd_bench, "video", "--dir", cfg.dir, "--bytes", str(p["video_bytes"]),
                   "--rounds", str(p["video_rounds"]), "--keep"]
                  + (["--fsync"] if cfg.durable == "on return" or cfg.workload_fsync else []), timeout=7200)
        d = json.loads(out[out.index("{"):])
        r = {"config": cfg.name, "repeat": rep, "durable": cfg.durable}
        r.update({k: v for k, v in d.items() if not isinstance(v, (dict, list))})
        r["rounds"] = d.get("rounds")
        if isinstance(cfg, configs.TmpfsCopyback):
            r["copy_back_s"] = cfg.copy_back()
            r["total_with_copy_back_s"] = r.get("total_secs", 0) + r["copy_back_s"]
        log(f"[5 video] {cfg.name}, repeat {rep}: {r.get('total_secs', 0):.2f} s")
        return r
    finally:
        cfg.stop()


def exp_video(ctx):
    """Each configuration runs the workload `video_repeats` times, the order reversed every
    other repeat; a ratio is the median of the repeats' ratios. One run each swung the
    `fsync`-mode mount against ext4-fsync from 1.23x to 0.577x between two invocations of
    the same build: the time is mostly the disk's writeback of the new files."""
    p = ctx.p
    cfgs = configs.file_configs(ctx.ws, ctx.pick(VIDEO_CONFIGS))
    rows = []
    for rep in range(p["video_repeats"]):
        for cfg in (cfgs if rep % 2 == 0 else cfgs[::-1]):
            rows.append(_video_once(ctx, cfg, rep))

    def median_speedup(num, den, num_key="total_secs", den_key="total_secs"):
        """Time ratios den / num of the same repeats (a speed-up of `num`), their median."""
        def series(cfg, key):
            by_rep = {r["repeat"]: r.get(key) for r in rows if r["config"] == cfg}
            return [by_rep.get(rep) for rep in range(p["video_repeats"])]
        return lib.median_ratio(series(den, den_key), series(num, num_key))

    n = p["video_repeats"]
    ratios = []
    for num, den in (("dhrd-pagecache", "ext4-fsync"), ("dhrd-pagecache", "ext4-buffered"), ("dhrd-pagecache", "ramdisk-ext4"),
                     ("dhrd-pagecache-fsync", "ext4-fsync"), ("dhrd-attach", "ext4-fsync"),
                     ("dhrd-attach-fsync", "ext4-fsync")):
        v = median_speedup(num, den)
        if v is not None:
            ratios.append({"what": f"speed-up of {num} over {den} (time ratio), median of {n}", "figure": num,
                           "baseline": den, "value": v})
    v = median_speedup("dhrd-pagecache", "tmpfs-copyback", den_key="total_with_copy_back_s")
    if v is not None:
        ratios.append({"what": f"speed-up of dhrd-pagecache over tmpfs + copy-back (log2ram), incl. the copy-back, "
                               f"median of {n}", "figure": "dhrd-pagecache", "baseline": "tmpfs-copyback", "value": v})
    return {
        "title": "5. Video: read a large file, modify part of it, save as another file, three times (Figure 12)",
        "scaling": f"{lib.fmt_size(p['video_bytes'])} file, {p['video_rounds']} rounds, {n} repeats",
        "rows": rows,
        "ratios": ratios,
        "notes": ["Durable configurations fsync each new file inside the timing: those durable on return (in "
                  "dhrd's sync mode the fsync costs nothing more) and dhrd's fsync mode, whose guarantee is "
                  "then ext4-fsync's; tmpfs-copyback's figure adds the copy back to the disk that makes its "
                  "result durable."],
    }


# --------------------------------------------------------------------------------------
# 6. Warm-up
# --------------------------------------------------------------------------------------


def try_first_read(path, offset):
    """True once 4 KiB at `offset` could be read (the file is absent until the mount is up)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return len(os.pread(fd, 4096, offset)) == 4096
    finally:
        os.close(fd)


def exp_warmup(ctx):
    p, ws = ctx.p, ctx.ws
    rows = []
    for size in p["warm_bytes"]:
        label = lib.fmt_size(size)
        files = {"data": size}
        # dhrd: mount to first read and to full load, cold cache.
        d = configs.Dhrd(ws, "pagecache")
        os.makedirs(d.backing, exist_ok=True)
        os.makedirs(d.mnt, exist_ok=True)
        configs.place(ws, d.backing, files)
        times = {"first": [], "load": []}
        for _ in range(p["warm_rounds"]):
            lib.drop_caches()
            t0 = time.monotonic()
            # A foreground daemon, polled for the first read: `--daemon` itself polls the
            # mount every few ms, which would blur the figure.
            proc = d.mount_foreground()
            try:
                lib.wait_for(lambda: try_first_read(os.path.join(d.mnt, "data"), size // 2),
                             lib.MOUNT_WAIT_S, "the first read", 0.0002)
                times["first"].append(time.monotonic() - t0)
                d.wait_loaded()
                times["load"].append(time.monotonic() - t0)
            finally:
                d.umount()
                proc.wait(timeout=300)
        # Foreground reads during the load vs after it.
        lib.drop_caches()
        d.mount()
        during_s = max(0.5, min(p["runtime_s"], 0.7 * lib.median(times["load"])))
        fa = [f"--filename={d.mnt}/data", f"--size={size}", "--rw=randread", "--bs=4k", "--numjobs=1",
              "--invalidate=0"]
        during = lib.fio("during-load", fa, during_s)
        loaded_at_end = d.load_complete()
        d.wait_loaded()
        after = lib.fio("after-load", fa, during_s)
        d.stop()
        row = {"config": "dhrd-pagecache", "bytes": size, "size": label,
               "mount_to_first_read_ms": lib.median(times["first"]) * 1000,
               "full_load_s": lib.median(times["load"]),
               "during_read_iops": during["read_iops"], "during_read_p50_us": during["read_lat_p50_us"],
               "during_read_p99_us": during["read_lat_p99_us"], "during_window_s": during_s,
               "load_finished_within_window": loaded_at_end,
               "after_read_iops": after["read_iops"], "after_read_p50_us": after["read_lat_p50_us"],
               "after_read_p99_us": after["read_lat_p99_us"]}
        # Restart keeps RAM: SIGKILL the daemon once the data is warm, mount again, read
        # everything; the disk should barely be read (the page cache is the kernel's).
        d.start(files)
        d.kill()
        before = lib.device_read_bytes(ws.disk)
        t0 = time.monotonic()
        d.mount()
        d.wait_loaded()
        row["remount_warm_s"] = time.monotonic() - t0
        run(["dd", f"if={d.mnt}/data", "of=/dev/null", "bs=1M", "status=none"])
        row["remount_disk_read_bytes"] = lib.device_read_bytes(ws.disk) - before
        row["remount_disk_read_fraction"] = round(row["remount_disk_read_bytes"] / size, 4)
        d.stop()
        rows.append(row)
        log(f"[6 warm-up] dhrd {label}: first read {row['mount_to_first_read_ms']:.1f} ms, "
            f"load {row['full_load_s']:.2f} s; after SIGKILL and remount {row['remount_disk_read_bytes']} "
            f"bytes read from the disk")
        # log2ram: nothing is readable from tmpfs until the copy is done.
        cb = configs.TmpfsCopyback(ws)
        cps = []
        for _ in range(p["warm_rounds"]):
            cb.start(files, cold=True)
            cps.append(cb.copy_in_s)
            cb.stop()
        rows.append({"config": "tmpfs-copyback", "bytes": size, "size": label,
                     "mount_to_first_read_ms": lib.median(cps) * 1000, "full_load_s": lib.median(cps)})
        # vmtouch: ext4 answers at once (from the disk) and is warm when vmtouch -t ends.
        e = configs.Ext4(ws, "vmtouch")
        vts = []
        for _ in range(p["warm_rounds"]):
            e.start(files)
            vts.append(e.vmtouch_s)
            e.stop()
        rows.append({"config": "ext4-vmtouch", "bytes": size, "size": label, "full_load_s": lib.median(vts)})
        log(f"[6 warm-up] {label}: cp -a {lib.median(cps):.2f} s, vmtouch -t {lib.median(vts):.2f} s")
    ratios = []
    for size in p["warm_bytes"]:
        lab = lib.fmt_size(size)
        r = point_ratio(rows, "full_load_s", "tmpfs-copyback", "dhrd-pagecache",
                        "cp -a time / dhrd full-load time", "dhrd-pagecache", size=lab)
        if r:
            r["figure"] = "dhrd-pagecache"
            r["baseline"] = "tmpfs-copyback (cp -a)"
            ratios.append(r)
        r = point_ratio(rows, "full_load_s", "ext4-vmtouch", "dhrd-pagecache",
                        "vmtouch -t time / dhrd full-load time", "dhrd-pagecache", size=lab)
        if r:
            r["figure"] = "dhrd-pagecache"
            r["baseline"] = "ext4-vmtouch (vmtouch -t)"
            ratios.append(r)
        a = [x for x in rows if x["config"] == "dhrd-pagecache" and x["size"] == lab]
        if a and a[0].get("remount_disk_read_fraction") is not None:
            ratios.append({"what": f"disk reads during a remount after SIGKILL and a full read, share of the data "
                                   f"(size={lab})", "figure": "dhrd-pagecache", "baseline": "data size",
                           "value": a[0]["remount_disk_read_fraction"]})
        b = [x for x in rows if x["config"] == "tmpfs-copyback" and x["size"] == lab]
        if a and b:
            ratios.append({"what": f"time to first read: cp -a / dhrd mount (size={lab})", "figure": "dhrd-pagecache",
                           "baseline": "tmpfs-copyback", "value": ratio(b[0]["mount_to_first_read_ms"],
                                                                        a[0]["mount_to_first_read_ms"])})
    return {
        "title": "6. Warm-up: mount to first read, time to full load, reads during the load",
        "scaling": f"data sizes {[lib.fmt_size(s) for s in p['warm_bytes']]} (one file), cold page cache, "
                   f"median of {p['warm_rounds']} rounds",
        "rows": rows,
        "ratios": ratios,
        "notes": ["dhrd: from starting `dhrd mount --daemon` to the first 4 KiB read returning, and to the status "
                  "saying complete. tmpfs-copyback: a service using log2ram's way can read only after `cp -a` "
                  "finished. ext4-vmtouch: reads work at once (from the disk) and are RAM-speed after `vmtouch -t`.",
                  "During the warm-up, reads of pages not read in yet are served from the disk by the kernel; "
                  "files applications open are warmed first.",
                  "remount_disk_read_bytes: read from the disk's block device between a SIGKILL of the warm "
                  "daemon and the end of a full read through a new mount (device-wide, so other activity "
                  "counts too)."],
    }


# --------------------------------------------------------------------------------------
# 7. Memory
# --------------------------------------------------------------------------------------

MEMORY_CONFIGS = ("dhrd-pagecache", "dhrd-cached", "tmpfs", "tmpfs-copyback", "ext4-vmtouch", "ramdisk-ext4")


def exp_memory(ctx):
    p = ctx.p
    size = p["mem_bytes"]
    rows = []
    for cfg in configs.file_configs(ctx.ws, ctx.pick(MEMORY_CONFIGS)):
        log(f"[7 memory] {cfg.name}: start")
        cfg.start({"data": size})
        try:
            # Read everything once through the configuration, as an application would.
            run(["dd", f"if={cfg.dir}/data", "of=/dev/null", "bs=1M", "status=none"])
            ram = cfg.ram_bytes()
            if isinstance(cfg, configs.Dhrd) and cfg.read_path == "cached":
                ram += lib.resident_bytes(os.path.join(cfg.dir, "data"))
            rows.append({"config": cfg.name, "data_bytes": size, "ram_bytes": ram,
                         "ram_per_data_byte": round(ram / size, 3), "durable": cfg.durable})
            log(f"[7 memory] {cfg.name}: {ram / size:.3f} bytes of RAM per byte of data")
        finally:
            cfg.stop()
    ratios = []
    for den in ("tmpfs", "ext4-vmtouch", "ramdisk-ext4"):
        r = point_ratio(rows, "ram_bytes", "dhrd-pagecache", den, f"RAM of dhrd-pagecache vs {den}", None)
        if r:
            ratios.append(r)
    return {
        "title": "7. Memory: RAM per byte of data, after everything was read once",
        "scaling": f"one file of {lib.fmt_size(size)}",
        "rows": rows,
        "ratios": ratios,
        "notes": ["dhrd: daemon RSS (anonymous and file) + resident memfd pages + page cache held by the backing "
                  "files (+ the mount's own page cache for the cached read path). tmpfs: its used blocks. "
                  "ext4-vmtouch: the files' page cache. ramdisk-ext4: the tmpfs image + the page cache of the "
                  "ext4 on top (the double caching of a RAM disk with a file system)."],
    }


def exp_transport(ctx):
    """The FUSE transport alone (`dhrd-bench fuse-transport`): a null server over /dev/fuse
    with 1 and 8 threads and over FUSE-over-io_uring, against tmpfs. It bounds what any
    daemon-served request can cost on this machine, which is what the choice of transport
    for dhrd's metadata path rests on."""
    p = ctx.p
    out = os.path.join(ctx.out, "logs", "fuse-transport")
    log("[8 transport] null FUSE server over /dev/fuse and io_uring vs tmpfs: start")
    run([ctx.ws.dhrd_bench, "fuse-transport", "--size", str(p["transport_bytes"]),
         "--rounds", str(p["transport_rounds"]), "--runtime", str(p["transport_runtime_s"]),
         "--out", out])
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    rows = [{"workload": m["workload"], "target": m["target"], "iops": round(m["iops"]),
             "clat_mean_us": round(m["clat_mean_us"], 2), "clat_p99_us": round(m["clat_p99_us"], 2),
             "iops_vs_tmpfs": round(m["iops_vs_tmpfs"], 3)} for m in summary["medians"]]
    for r in rows:
        log(f"[8 transport] {r['target']} {r['workload']}: {r['iops']} IOPS, {r['iops_vs_tmpfs']}x tmpfs")
    return {
        "title": "8. FUSE transport: a null server over /dev/fuse and io_uring vs tmpfs",
        "scaling": f"one file of {lib.fmt_size(p['transport_bytes'])}, {p['transport_rounds']} interleaved "
                   f"round(s) of {p['transport_runtime_s']} s",
        "rows": rows,
        "ratios": [],
        "notes": [f"io_uring transport: {summary.get('uring_status', 'unknown')}",
                  "the daemon does no work of its own: this is the floor of a request served by any FUSE "
                  "daemon on this machine (docs/benchmarks.md, 'FUSE transport')"],
    }


EXPERIMENTS = {
    "block": exp_block,
    "replay": exp_replay,
    "file": exp_file,
    "fileserver": exp_fileserver,
    "blockfs": blockfs.exp_blockfs,
    "video": exp_video,
    "warmup": exp_warmup,
    "memory": exp_memory,
    "transport": exp_transport,
    "attach": attach.exp_attach,
    "rbd": rbd.exp_rbd,
    "cache": cache.exp_cache,
    "seed002": seed002.exp_seed002,
    "nvm": nvm.exp_nvm,
    "tier": tier.exp_tier,
    "rehypar": rehypar.exp_rehypar,
    "apps": apps.exp_apps,
}
