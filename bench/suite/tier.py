"""Experiment 13: the tiered device (SPEC T1) on user block traces, seed 000's Figure 11.

A large slow lower tier (a file with the HDD profile: 8 ms per request, 150 MB/s) under a
cache tier, with the cache tier holding the chunks that serve 70% and then 80% of the
trace's requests, as the paper assumes ("70% and 80% of all I/O traces are allocated to
SSD or DHRD"). Configurations, all durable (a write is acknowledged once it is on the SSD
or the lower tier):

- dhrd-tier: `dhrd nbd --tier-ssd` with the SSD profile, RAM (`--mem`) the size of the SSD
  tier, in cache mode: the paper's "DBR DHRD + HDD";
- ssd-tier: the same with `--mem 0`, the SSD cache alone over the same lower tier: the
  SSHD / flashcache configuration ("SSD + HDD");
- nbdkit-cache: nbdkit's file plugin behind its delay filter (8 ms) and its cache filter,
  write-through, with room for the same chunks below its reclaim threshold (its cache file
  lives in the page cache: a RAM cache without a durable copy of its own);
- lower: the lower tier alone (`dhrd nbd --mem 0` on the HDD profile).

Placement: `dhrd-bench replay --write-plan` folds the trace exactly as the replay will;
the hottest 64 KiB chunks are chosen until the requests whose every chunk is chosen
reach the level. Each configuration starts empty, reads every chosen chunk twice (dhrd
promotes on the second access) and then replays the trace once through its own NBD
connection per worker (`dhrd-bench replay --nbd`). A request counts as served by the
cache tier when it completes in under 7.5 ms: a request that reaches the lower tier takes
at least its 8 ms, while a synced SSD write takes 2-5 ms under load. The SSD tier has one
slot per chosen chunk plus one per chunk the trace writes, so writes never push placed
chunks out.

Part B times the first read after a SIGKILL with the SSD tier full of dirty data. Part C
times write misses: 4 KiB writes at queue depth 1 to random places of the whole lower tier,
each configuration starting with an empty cache tier, so that no write finds its chunk
cached: what a cold write costs (dhrd's tier fills only the parts a write touches; nbdkit
writes through to the delayed file). Without
the public traces (a bare clone, as in the smoke run) a synthetic trace stands in.
"""

import collections
import json
import os
import shutil
import time

import lib
from cache import Server
from lib import BenchError, log, run

K, M = 1 << 10, 1 << 20
CHUNK = 64 * K
HIT_BELOW_US = 7500
LEVELS = (0.7, 0.8)
TRACES = {
    "hm_0": "msr_cambridge/hm_0.first1000.csv",
    "websearch": "websearch/WebSearch1.first24783.spc",
    "tpcc": "oltp_tpcc/tpcc-small.trace",
}
CONFIGS = ("dhrd-tier", "ssd-tier", "nbdkit-cache", "lower")
# The SSD tier's header, slot-table entry and table copies (crates/dhrd-tier/src/tiered/layout.rs).
TIER_HEADER_BYTES, TIER_ENTRY_BYTES, TIER_TABLES = 4096, 64, 2
NBDKIT_DELAY_MS = 8
NBDKIT_LOW_THRESHOLD_PERCENT = 80


def synthetic_trace(path, size, requests, seed=13):
    """An SPC trace for when the public traces are not on this machine (the suite's smoke
    run on a bare clone): 70% reads, 4-64 KiB, four in five to a hot tenth of `size`."""
    import random
    r = random.Random(seed)
    with open(path, "w") as f:
        for i in range(requests):
            span = size // 10 if r.random() < 0.8 else size
            off = r.randrange(0, span - 64 * K) // 4096 * 4096
            op = "R" if r.random() < 0.7 else "W"
            f.write(f"0,{off // 512},{r.choice((4, 8, 16, 64)) * K},{op},{i / 1000:.3f}\n")


def plan(ctx, trace, data, max_requests):
    """The trace folded onto `data` as the replay folds it: [(is_write, offset, len)]."""
    path = os.path.join(ctx.ws.disk, "tier-plan.txt")
    cmd = [ctx.ws.dhrd_bench, "replay", "--trace", trace, "--target", data, "--direct", "--write-plan", path]
    if max_requests:
        cmd += ["--max-requests", str(max_requests)]
    run(cmd, timeout=600)
    reqs = []
    with open(path) as f:
        for line in f:
            op, off, ln = line.split()
            reqs.append((op == "W", int(off), int(ln)))
    os.unlink(path)
    return reqs


def chunks_of(off, ln):
    return range(off // CHUNK, (off + ln - 1) // CHUNK + 1)


def placement(reqs, level):
    """Hottest chunks first until `level` of the requests touch only chosen chunks.
    Returns (chosen chunks, chunks the trace writes, the share served by the tier)."""
    count = collections.Counter(c for _, o, n in reqs for c in chunks_of(o, n))
    needs = collections.defaultdict(list)
    left = []
    for k, (_, o, n) in enumerate(reqs):
        cs = list(chunks_of(o, n))
        left.append(len(cs))
        for c in cs:
            needs[c].append(k)
    served, chosen = 0, []
    for c, _ in count.most_common():
        if served >= level * len(reqs):
            break
        chosen.append(c)
        for k in needs[c]:
            left[k] -= 1
            if left[k] == 0:
                served += 1
    written = {c for w, o, n in reqs if w for c in chunks_of(o, n)}
    return chosen, written, served / max(1, len(reqs))


def tier_bytes_for(slots):
    """The SSD size that opens with exactly `slots` slots (`dhrd_tier::ssd_bytes_for`)."""
    table = -(-TIER_ENTRY_BYTES * slots // TIER_HEADER_BYTES) * TIER_HEADER_BYTES
    return TIER_HEADER_BYTES + TIER_TABLES * table + slots * CHUNK


def warm_trace(path, chunks):
    """An SPC trace reading each chunk twice (first all once, then all again)."""
    with open(path, "w") as f:
        for _ in range(2):
            for c in chunks:
                f.write(f"0,{c * CHUNK // 512},{CHUNK},R,0.0\n")


def replay(ctx, sock, trace, qd, max_requests, json_path):
    cmd = [ctx.ws.dhrd_bench, "replay", "--trace", trace, "--nbd", sock, "--queue-depth", str(qd),
           "--fast-below-us", str(HIT_BELOW_US), "--json", json_path]
    if max_requests:
        cmd += ["--max-requests", str(max_requests)]
    run(cmd, timeout=3600)
    with open(json_path) as f:
        return json.load(f)


def nbdkit_cache_bytes(mem):
    """nbdkit's cache filter reclaims down to 80% of cache-max-size once it passes 95%
    (its cache-low-threshold and cache-high-threshold defaults), so it gets room for the
    placed chunks below its low threshold."""
    return -(-mem * 100 // NBDKIT_LOW_THRESHOLD_PERCENT // CHUNK) * CHUNK


def start(ctx, config, data, ssd, ssd_bytes, mem, keep_ssd=False):
    sock = os.path.join(ctx.ws.disk, f"tier-{config}.sock")
    if config == "nbdkit-cache":
        tmp = os.path.join(ctx.ws.disk, "nbdkit-cache-tmp")
        os.makedirs(tmp, exist_ok=True)
        cmd = ["env", f"TMPDIR={tmp}", "nbdkit", "-f", "-U", sock, "--filter=cache", "--filter=delay",
               "file", data, f"rdelay={NBDKIT_DELAY_MS}ms", f"wdelay={NBDKIT_DELAY_MS}ms", "cache=writethrough",
               "cache-on-read=true", f"cache-max-size={nbdkit_cache_bytes(mem)}",
               f"cache-min-block-size={CHUNK}"]
        s = Server(ctx, config, cmd, sock, log_prefix="tier")
        s.status = None
        return s
    status = os.path.join(ctx.out, "logs", f"tier-{config}.status.json")
    cmd = [ctx.ws.dhrd, "nbd", "--backing", data, "--backing-timing", "hdd", "--socket", sock,
           "--chunk", str(CHUNK), "--status-file", status, "--no-prefill"]
    if not keep_ssd:
        # Each configuration starts afresh: whatever an earlier one's cache tier still held
        # (part B kills it on purpose) is thrown away, so its mark on the lower tier goes.
        cmd.append("--drop-cache-mark")
    if config == "lower":
        cmd += ["--mem", "0"]
    else:
        if os.path.exists(ssd) and not keep_ssd:
            os.unlink(ssd)
        cmd += ["--tier-ssd", ssd, "--tier-ssd-size", str(ssd_bytes), "--tier-ssd-timing", "ssd",
                "--mem", str(mem if config == "dhrd-tier" else 0)]
    s = Server(ctx, config, cmd, sock, log_prefix="tier")
    s.status = status
    return s


def status_of(server):
    if not server.status:
        return {}
    time.sleep(1.2)  # the status file is rewritten every second
    try:
        with open(server.status) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def recovery(ctx, data, ssd, dirty_bytes):
    """Part B: fill the SSD tier with `dirty_bytes` of writes the HDD-timed lower tier has
    not caught up with, SIGKILL the daemon, restart it, and time the first served read
    (from the restart's exec to the end of a one-request replay, retried until the socket
    answers; the replay's own exec counts too, so this is an upper bound)."""
    ssd_bytes = tier_bytes_for(dirty_bytes // CHUNK + 64)
    s = start(ctx, "dhrd-tier", data, ssd, ssd_bytes, 64 * M)
    try:
        run(["fio", "--name=fill", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={s.sock}", "--rw=write",
             "--bs=1M", f"--size={dirty_bytes}", "--iodepth=4"], timeout=1800)
        dirty = (status_of(s).get("tier") or {}).get("slots_dirty", 0)
        s.proc.kill()
        s.proc.wait()
    finally:
        s.stop()
    one = os.path.join(ctx.ws.disk, "tier-one.spc")
    with open(one, "w") as f:
        f.write("0,0,4096,R,0.0\n")
    t0 = time.monotonic()
    s = start(ctx, "dhrd-tier", data, ssd, ssd_bytes, 64 * M, keep_ssd=True)
    try:
        while True:
            r = run([ctx.ws.dhrd_bench, "replay", "--trace", one, "--nbd", s.sock], check=False, timeout=60)
            if "elapsed" in r:
                break
            if time.monotonic() - t0 > 60:
                raise BenchError(f"no read served within 60 s of the restart: {r[-500:]}")
        first_read_ms = (time.monotonic() - t0) * 1000
        after = (status_of(s).get("tier") or {})
    finally:
        # A clean stop would wait for the write-back of everything; the data is thrown away.
        s.proc.kill()
        s.stop()
        os.unlink(one)
    return dict(dirty_bytes=dirty_bytes, dirty_chunks_at_kill=dirty, dirty_at_open=after.get("dirty_at_open", 0),
                first_read_ms=round(first_read_ms, 1))


def write_misses(ctx, data, ssd, requests):
    """Part C: `requests` 4 KiB writes at QD 1 to random 4 KiB-aligned places of the whole
    lower tier, on an empty cache tier with room for all of them."""
    import random
    r = random.Random(17)
    trace = os.path.join(ctx.ws.disk, "tier-writes.spc")
    blocks = os.path.getsize(data) // (4 * K)
    with open(trace, "w") as f:
        for i in range(requests):
            f.write(f"0,{r.randrange(blocks) * 8},{4 * K},W,{i / 1000:.3f}\n")
    slots = requests + 64
    out = []
    try:
        for config in ctx.pick(CONFIGS):
            s = start(ctx, config, data, ssd, tier_bytes_for(slots), slots * CHUNK)
            try:
                j = replay(ctx, s.sock, trace, 1, None, os.path.join(ctx.out, "logs", f"tier-writes-{config}.json"))
                after = (status_of(s).get("tier") or {})
            finally:
                s.stop()
            w = j["latency_us"]["write"]
            out.append(dict(config=config, iops=j["iops"], write_p50_us=w.get("p50"), write_p99_us=w.get("p99"),
                            partial_fills=after.get("partial_fills")))
            log(f"[13 tier] write misses, {config}: {j['iops']:.0f} IOPS, p50 {w.get('p50')} us, "
                f"p99 {w.get('p99')} us")
    finally:
        os.unlink(trace)
    return out


def exp_tier(ctx):
    p = ctx.p
    if not shutil.which("nbdkit"):
        return {"title": "13. Tiered storage", "skipped": "nbdkit is not installed"}
    size, max_requests = p["tier_bytes"], p["tier_requests"]
    data = os.path.join(ctx.ws.disk, "tier-lower")
    ssd = os.path.join(ctx.ws.disk, "tier-ssd")
    warm = os.path.join(ctx.ws.disk, "tier-warm.spc")
    lib.fill_file(data, size)
    rows, placements, rec, misses = [], [], {}, []
    traces = [t for t in p["tier_traces"] if os.path.exists(os.path.join(ctx.traces, TRACES[t]))]
    synthetic = os.path.join(ctx.ws.disk, "tier-synthetic.spc")
    if not traces:
        # The public traces live outside the repository; without them the experiment
        # still runs, on a synthetic trace, and says so.
        log(f"[13 tier] no trace of {p['tier_traces']} under {ctx.traces}: a synthetic trace instead")
        traces = ["synthetic"]
        synthetic_trace(synthetic, size, max_requests or 8000)
    try:
        for rnd in range(p["tier_rounds"]):
            for tname in traces:
                trace = synthetic if tname == "synthetic" else os.path.join(ctx.traces, TRACES[tname])
                reqs = plan(ctx, trace, data, max_requests)
                for level in LEVELS:
                    chosen, written, planned = placement(reqs, level)
                    slots = len(set(chosen) | written)
                    ssd_bytes, mem = tier_bytes_for(slots), slots * CHUNK
                    if rnd == 0:
                        placements.append(dict(trace=tname, level=level, requests=len(reqs), chunks=len(chosen),
                                               written_chunks=len(written), ssd_bytes=ssd_bytes,
                                               planned_share=round(planned, 3)))
                    warm_trace(warm, chosen)
                    for qd in p["tier_qd"]:
                        for config in ctx.pick(CONFIGS):
                            s = start(ctx, config, data, ssd, ssd_bytes, mem)
                            try:
                                if config != "lower":
                                    replay(ctx, s.sock, warm, 8, None, os.path.join(ctx.out, "logs", "tier-warm.json"))
                                before = status_of(s)
                                j = replay(ctx, s.sock, trace, qd, max_requests,
                                           os.path.join(ctx.out, "logs", f"tier-{tname}-{config}.json"))
                                after = status_of(s)
                            finally:
                                s.stop()
                            fs = j.get("fast_share") or {}
                            tb, ta = before.get("tier", {}), after.get("tier", {})
                            row = dict(round=rnd, trace=tname, level=level, qd=qd, config=config,
                                       iops=j["iops"], hit_share=fs.get("all", 0.0), hit_mean_us=fs.get("mean_us", 0.0),
                                       read_p50_us=j["latency_us"]["read"].get("p50"),
                                       read_p99_us=j["latency_us"]["read"].get("p99"),
                                       write_p50_us=j["latency_us"]["write"].get("p50"),
                                       write_p99_us=j["latency_us"]["write"].get("p99"),
                                       requests=j["requests"])
                            if ta:
                                row["written_back_mib"] = round(
                                    (ta.get("written_back", 0) - tb.get("written_back", 0)) * CHUNK / M, 2)
                                row["promotions"] = ta.get("promotions", 0) - tb.get("promotions", 0)
                            if "waits_on_load" in after.get("writes", {}):
                                row["write_waits_on_load"] = (after["writes"]["waits_on_load"]
                                                              - before.get("writes", {}).get("waits_on_load", 0))
                            if after.get("cache"):
                                row["ram_hit_ratio"] = round(after["cache"].get("hit_ratio", 0.0), 3)
                            rows.append(row)
                            log(f"[13 tier] round {rnd} {tname} {int(level * 100)}% QD{qd} {config}: "
                                f"{j['iops']:.0f} IOPS, {fs.get('all', 0):.3f} under {HIT_BELOW_US} us "
                                f"(mean {fs.get('mean_us', 0):.0f} us)")
        misses = write_misses(ctx, data, ssd, p["tier_miss_writes"])
        rec = recovery(ctx, data, ssd, p["tier_dirty_bytes"])
        log(f"[13 tier] recovery: {lib.fmt_size(rec['dirty_bytes'])} written, {rec['dirty_chunks_at_kill']} chunks "
            f"dirty shortly before the SIGKILL, {rec['dirty_at_open']} at the restart; first read "
            f"{rec['first_read_ms']} ms after the restart")
    finally:
        for f in (data, ssd, warm, synthetic):
            if os.path.exists(f):
                os.unlink(f)

    def med(trace, level, qd, config, key):
        return lib.median([r[key] for r in rows if r["trace"] == trace and r["level"] == level
                           and r["qd"] == qd and r["config"] == config and r.get(key) is not None])

    table, ratios = [], []
    for tname in traces:
        for level in LEVELS:
            for qd in p["tier_qd"]:
                for config in CONFIGS:
                    if not any(r["config"] == config and r["trace"] == tname for r in rows):
                        continue
                    row = dict(trace=tname, level=f"{int(level * 100)}%", qd=qd, config=config)
                    for key in ("iops", "hit_share", "hit_mean_us", "read_p50_us", "read_p99_us",
                                "write_p50_us", "write_p99_us", "written_back_mib", "ram_hit_ratio",
                                "write_waits_on_load"):
                        v = med(tname, level, qd, config, key)
                        if v is not None:
                            row[key] = round(v, 3 if key in ("hit_share", "ram_hit_ratio") else 1)
                    table.append(row)
                what = f"{tname}, cache tier {int(level * 100)}%, QD{qd}"

                def add(figure, baseline, key, label, what=what, tname=tname, level=level, qd=qd):
                    num, den = med(tname, level, qd, figure, key), med(tname, level, qd, baseline, key)
                    if key == "hit_mean_us":
                        num, den = den, num  # a shorter service time is the better one
                    if num and den:
                        ratios.append({"what": f"{what}: {label}", "figure": figure, "baseline": baseline,
                                       "value": round(num / den, 3)})

                add("dhrd-tier", "ssd-tier", "iops", "IOPS")
                add("dhrd-tier", "lower", "iops", "IOPS")
                add("dhrd-tier", "nbdkit-cache", "iops", "IOPS")
                add("dhrd-tier", "ssd-tier", "hit_mean_us", "service time of cache-tier hits (inverse)")
    by_config = {m["config"]: m for m in misses}
    for base in ("ssd-tier", "lower", "nbdkit-cache"):
        if "dhrd-tier" in by_config and base in by_config and by_config[base]["iops"]:
            ratios.append({"what": "write misses (4 KiB, QD1, empty cache tier): IOPS", "figure": "dhrd-tier",
                           "baseline": base,
                           "value": round(by_config["dhrd-tier"]["iops"] / by_config[base]["iops"], 3)})
    notes = [
        *(["No public trace was found under " + ctx.traces + ": a synthetic trace (70% reads, 4-64 KiB, "
           "80% of requests to a hot tenth) stood in."] if traces == ["synthetic"] else []),
        f"Lower tier {lib.fmt_size(size)} with the HDD profile (8 ms per request, 150 MB/s; concurrent "
        f"requests overlap their latency); SSD tier with the SSD profile (80 us reads, 25 us writes, 1 ms "
        f"flush, 500 MB/s); chunk {CHUNK // K} KiB; RAM = SSD tier size; "
        f"{max_requests or 'all'} requests per trace; a hit is a request under {HIT_BELOW_US} us.",
        "Placement (chunks chosen to serve the level; SSD tier size): " + "; ".join(
            f"{x['trace']} {int(x['level'] * 100)}%: {x['chunks']} chunks ({x['written_chunks']} written), "
            f"{lib.fmt_size(x['ssd_bytes'])}, plan {x['planned_share']:.3f} of {x['requests']} requests"
            for x in placements),
        f"Recovery (part B): {lib.fmt_size(rec.get('dirty_bytes', 0))} written through the tier, "
        f"{rec.get('dirty_chunks_at_kill')} chunks dirty in its last status before the SIGKILL, "
        f"{rec.get('dirty_at_open')} found dirty at the restart; first read served "
        f"{rec.get('first_read_ms')} ms after the restart began (target < 1 s).",
        "Write misses (part C): " + "; ".join(
            f"{m['config']} {m['iops']:.0f} IOPS, write p50 {m['write_p50_us']} us, p99 {m['write_p99_us']} us"
            for m in misses) + ".",
        "With a miss costing 8 ms and a hit 0.03-2 ms, the mean request time is set by the misses: "
        "the IOPS ratio of two cache tiers at the same hit share is bounded by "
        "(m*t_lower + h*t_ssd) / (m*t_lower + h*t_ram), near 1 at 20-30% misses. The service time "
        "of the hits themselves is the cache tier's own speed-up.",
    ]
    return {"title": "13. Tiered storage: RAM + SSD cache tier over an HDD-timed lower tier (seed 000 Fig. 11)",
            "rows": table, "raw": rows, "placements": placements, "recovery": rec, "write_misses": misses,
            "ratios": ratios,
            "notes": notes}
