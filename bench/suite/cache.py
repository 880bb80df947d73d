"""Experiment 10: RAM as a cache of a larger, slower backing (cache mode and read-ahead).

All backings are the same file with emulated device timing, so the figures do not depend
on this machine's disk: dhrd's `--backing-timing`, nbdkit's delay filter.

A. zipf(1.2) 4 KiB random reads (fio, QD8) of an export 4x larger than the RAM given to
   the cache, over a backing with 2 ms per request:
   - dhrd nbd with `--mem` = 1/4 of the export (cold start, no prefill);
   - the same backing without RAM (dhrd with `--mem 0`);
   - nbdkit's file plugin behind its delay filter (2 ms) and its cache filter with the same
     cache size (`cache-on-read=true`; its blocks are 64 KiB, as dhrd's chunks here).
   The hit ratio of a run is the share of reads answered in under 1 ms (a miss costs at
   least the 2 ms): the same measure for every configuration. Belady's offline optimum
   comes from `dhrd-bench cache-sim` over fio's log of dhrd's own run.
B. Scan resistance: after A's run, the zipf job again alone and then together with a
   one-pass sequential read of the whole export; the zipf job's hit ratio in both.
C. Read-ahead (M2, M5) over the HDD profile (8 ms per request, 150 MB/s), RAM 1/4 of the
   export, no prefill: a sequential 4 KiB read and a random 4 KiB read at QD1, with
   `--read-ahead none|sequential|history`.
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
SLOW_US = 2000
CHUNK = 64 * K
HIT_BELOW_NS = 1_000_000
HDD = "hdd"


def fio_json(uri, jobs, runtime_s, extra=()):
    """Runs fio with one or more jobs on the NBD `uri`; returns per-job dicts with IOPS,
    MiB/s, mean and p50 latency and the share of reads under HIT_BELOW_NS."""
    cmd = ["fio", "--output-format=json+", f"--runtime={int(runtime_s * 1000)}ms"] + list(extra)
    for name, args in jobs:
        cmd += [f"--name={name}", "--ioengine=nbd", f"--uri={uri}"] + args
    out = run(cmd, timeout=runtime_s * 4 + 600)
    try:
        d = json.loads(out[out.index("{"):])
    except (ValueError, json.JSONDecodeError) as e:
        raise BenchError(f"fio: unreadable output: {out[:500]}") from e
    res = {}
    for job in d["jobs"]:
        if job.get("error"):
            raise BenchError(f"fio {job['jobname']}: error {job['error']}")
        j = job["read"]
        bins = j["clat_ns"].get("bins", {})
        total = sum(bins.values())
        fast = sum(v for k, v in bins.items() if int(k) < HIT_BELOW_NS)
        res[job["jobname"]] = dict(
            iops=j["iops"], mib_s=j["bw_bytes"] / M, lat_mean_us=j["lat_ns"]["mean"] / 1000,
            lat_p50_us=j["clat_ns"].get("percentile", {}).get("50.000000", 0) / 1000,
            hit_ratio=(fast / total) if total else 0.0)
    return res


class Server:
    """A dhrd nbd or nbdkit process serving one Unix socket."""

    def __init__(self, ctx, name, cmd, sock, log_prefix="cache"):
        self.sock, self.name = sock, name
        self.logp = os.path.join(ctx.out, "logs", f"{log_prefix}-{name}.log")
        self.log = open(self.logp, "w")
        if os.path.exists(sock):
            os.unlink(sock)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        lib.wait_for(lambda: os.path.exists(sock) or self.proc.poll() is not None, lib.MOUNT_WAIT_S,
                     f"{name} socket")
        if self.proc.poll() is not None:
            raise BenchError(f"{name} exited: {open(self.logp).read()[-2000:]}")

    @property
    def uri(self):
        return f"nbd+unix:///?socket={self.sock}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return open(self.logp).read()


def dhrd(ctx, name, data, mem, extra=()):
    sock = os.path.join(ctx.ws.disk, f"cache-{name}.sock")
    status = os.path.join(ctx.out, "logs", f"cache-{name}.status.json")
    cmd = [ctx.ws.dhrd, "nbd", "--backing", data, "--socket", sock, "--mem", str(mem),
           "--status-file", status, "-v"] + list(extra)
    s = Server(ctx, name, cmd, sock)
    s.status = status
    return s


def engine_status(server):
    try:
        with open(server.status) as f:
            return json.load(f).get("cache", {})
    except (OSError, ValueError):
        return {}


def nbdkit_cache(ctx, name, data, mem):
    sock = os.path.join(ctx.ws.disk, f"cache-{name}.sock")
    tmp = os.path.join(ctx.ws.disk, "nbdkit-cache-tmp")
    os.makedirs(tmp, exist_ok=True)
    cmd = ["env", f"TMPDIR={tmp}", "nbdkit", "-f", "-U", sock, "--filter=cache", "--filter=delay",
           "file", data, f"rdelay={SLOW_US // 1000}ms", f"wdelay={SLOW_US // 1000}ms",
           "cache-on-read=true", f"cache-max-size={mem}", f"cache-min-block-size={CHUNK}"]
    return Server(ctx, name, cmd, sock)


def zipf_job(size, log_path=None):
    args = ["--rw=randread", "--bs=4k", "--iodepth=8", "--random_distribution=zipf:1.2",
            f"--size={size}", "--time_based", "--randrepeat=1", "--norandommap"]
    if log_path:
        args.append(f"--write_iolog={log_path}")
    return args


def scan_job(size):
    # One pass at 64 KiB per request: at 2 ms per request it spans the zipf job's run.
    return ["--rw=read", "--bs=64k", "--iodepth=1", f"--size={size}", "--time_based=0"]


def exp_cache(ctx):
    p = ctx.p
    if not shutil.which("nbdkit"):
        return {"title": "10. RAM as a cache", "skipped": "nbdkit is not installed"}
    size, mem, runtime = p["cache_bytes"], p["cache_bytes"] // 4, p["cache_runtime_s"]
    data = os.path.join(ctx.ws.disk, "cache-data")
    lib.fill_file(data, size)
    timing = ["--backing-timing", f"{SLOW_US},{SLOW_US},{SLOW_US},0", "--chunk", str(CHUNK)]
    rows, sims = [], []
    for rnd in range(p["cache_rounds"]):
        # A: each configuration from a cold start, same job, same seed.
        for config in ctx.pick(["dhrd-cache", "no-ram", "nbdkit-cache"]):
            iolog = os.path.join(ctx.out, "logs", f"cache-zipf-{rnd}.iolog") if config == "dhrd-cache" else None
            if config == "dhrd-cache":
                s = dhrd(ctx, config, data, mem, timing + ["--no-prefill"])
            elif config == "no-ram":
                s = dhrd(ctx, config, data, 0, timing + ["--no-prefill"])
            else:
                s = nbdkit_cache(ctx, config, data, mem)
            try:
                z = fio_json(s.uri, [("zipf", zipf_job(size, iolog))], runtime)["zipf"]
                rows.append(dict(round=rnd, part="A", config=config, **z))
                log(f"[10 cache] round {rnd} {config}: {z['iops']:.0f} IOPS, hit ratio {z['hit_ratio']:.3f}")
                if config != "no-ram":
                    # B: warm now; the zipf job alone, then with a scan of everything.
                    alone = fio_json(s.uri, [("zipf", zipf_job(size))], runtime)["zipf"]
                    both = fio_json(s.uri, [("zipf", zipf_job(size)), ("scan", scan_job(size))], runtime)
                    rows.append(dict(round=rnd, part="B", config=config, phase="alone", **alone))
                    rows.append(dict(round=rnd, part="B", config=config, phase="with scan", **both["zipf"]))
                    log(f"[10 cache] round {rnd} {config}: warm hit ratio {alone['hit_ratio']:.3f}, "
                        f"during a scan {both['zipf']['hit_ratio']:.3f}")
                if config == "dhrd-cache":
                    st = engine_status(s)
                    rows[-3]["engine"] = st
            finally:
                s.stop()
            if iolog:
                out = run([ctx.ws.dhrd_bench, "cache-sim", "--iolog", iolog, "--chunk", str(CHUNK),
                           "--mem", str(mem)], timeout=1800)
                sim = json.loads(out[out.index("{"):])
                sim["round"] = rnd
                sims.append(sim)
                os.unlink(iolog)
        # C: read-ahead over the HDD profile.
        ra_size = p["ra_bytes"]
        for policy in ("none", "sequential", "history"):
            s = dhrd(ctx, f"ra-{policy}", data, ra_size // 4,
                     ["--backing-timing", HDD, "--no-prefill", "--read-ahead", policy])
            try:
                seq = fio_json(s.uri, [("seq", ["--rw=read", "--bs=4k", "--iodepth=1", f"--size={ra_size}",
                                                "--time_based"])], p["ra_runtime_s"])["seq"]
                rnd_r = fio_json(s.uri, [("rand", ["--rw=randread", "--bs=4k", "--iodepth=1",
                                                   f"--size={ra_size}", "--time_based", "--randrepeat=1"])],
                                 p["ra_runtime_s"])["rand"]
                rows.append(dict(round=rnd, part="C", config=f"read-ahead {policy}", phase="sequential", **seq))
                rows.append(dict(round=rnd, part="C", config=f"read-ahead {policy}", phase="random", **rnd_r))
                log(f"[10 cache] round {rnd} read-ahead {policy}: sequential {seq['mib_s']:.1f} MiB/s, "
                    f"random {rnd_r['iops']:.0f} IOPS")
            finally:
                s.stop()
    os.unlink(data)

    def med(part, config, key, phase=None):
        return lib.median([r[key] for r in rows if r["part"] == part and r["config"] == config
                           and (phase is None or r.get("phase") == phase)])

    table = []
    for config in ("dhrd-cache", "no-ram", "nbdkit-cache"):
        if any(r["config"] == config for r in rows):
            table.append(dict(config=config, workload="zipf 4K QD8 (cold start)",
                              iops=round(med("A", config, "iops") or 0),
                              hit_ratio=round(med("A", config, "hit_ratio") or 0, 3),
                              lat_mean_us=round(med("A", config, "lat_mean_us") or 0, 1)))
    for config in ("dhrd-cache", "nbdkit-cache"):
        for phase in ("alone", "with scan"):
            if any(r["config"] == config and r.get("phase") == phase for r in rows):
                table.append(dict(config=config, workload=f"zipf warm, {phase}",
                                  iops=round(med("B", config, "iops", phase) or 0),
                                  hit_ratio=round(med("B", config, "hit_ratio", phase) or 0, 3),
                                  lat_mean_us=round(med("B", config, "lat_mean_us", phase) or 0, 1)))
    for policy in ("none", "sequential", "history"):
        c = f"read-ahead {policy}"
        table.append(dict(config=c, workload="HDD: sequential 4K QD1",
                          mib_s=round(med("C", c, "mib_s", "sequential") or 0, 2)))
        table.append(dict(config=c, workload="HDD: random 4K QD1",
                          iops=round(med("C", c, "iops", "random") or 0, 1)))
    ratios = []

    def add(what, num, den, figure, baseline):
        if num and den:
            ratios.append({"what": what, "figure": figure, "baseline": baseline, "value": round(num / den, 3)})

    add("zipf(1.2) 4 KiB reads, RAM 1/4 of the export, 2 ms backing", med("A", "dhrd-cache", "iops"),
        med("A", "no-ram", "iops"), "dhrd-cache", "same backing without RAM")
    add("zipf(1.2) 4 KiB reads, same cache size", med("A", "dhrd-cache", "iops"),
        med("A", "nbdkit-cache", "iops"), "dhrd-cache", "nbdkit file + delay + cache filter")
    if sims:
        opt = lib.median([s["belady_bypass_hit_ratio"] for s in sims])
        add("hit ratio vs Belady's optimum on the same trace", med("A", "dhrd-cache", "hit_ratio"), opt,
            "dhrd-cache", "Belady (offline, may bypass)")
    add("zipf hit ratio during a full scan (1.0 = no drop)", med("B", "dhrd-cache", "hit_ratio", "with scan"),
        med("B", "dhrd-cache", "hit_ratio", "alone"), "dhrd-cache", "the same without the scan")
    add("zipf hit ratio during a full scan (1.0 = no drop)", med("B", "nbdkit-cache", "hit_ratio", "with scan"),
        med("B", "nbdkit-cache", "hit_ratio", "alone"), "nbdkit-cache", "the same without the scan")
    for policy in ("sequential", "history"):
        c = f"read-ahead {policy}"
        add("sequential 4 KiB reads, HDD profile", med("C", c, "mib_s", "sequential"),
            med("C", "read-ahead none", "mib_s", "sequential"), c, "read-ahead none")
        add("random 4 KiB reads, HDD profile", med("C", c, "iops", "random"),
            med("C", "read-ahead none", "iops", "random"), c, "read-ahead none")
    notes = [
        f"Export {lib.fmt_size(size)}, RAM {lib.fmt_size(mem)}, chunk {CHUNK // K} KiB; fio QD8 for "
        f"{runtime} s per run; hit ratio = share of reads answered in under 1 ms.",
        "Belady's figures (`dhrd-bench cache-sim` over fio's log of the dhrd run, by chunk): " + "; ".join(
            f"optimum {s['belady_bypass_hit_ratio']:.3f} (without bypass {s['belady_hit_ratio']:.3f}), "
            f"simulated s3fifo/second {s['policies']['s3fifo/second']['hit_ratio']:.3f}, "
            f"clock/always {s['policies']['clock/always']['hit_ratio']:.3f}" for s in sims),
        f"Read-ahead runs: export {lib.fmt_size(p['ra_bytes'])}, RAM a quarter of it, chunk 1 MiB, HDD "
        f"profile (8 ms per request, 150 MB/s shared), {p['ra_runtime_s']} s per job.",
    ]
    return {"title": "10. RAM as a cache of a slower backing: cache mode, scan resistance, read-ahead",
            "rows": table, "raw": rows, "sims": sims, "ratios": ratios, "notes": notes}
