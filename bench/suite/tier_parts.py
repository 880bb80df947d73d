"""Experiment 13, parts B and C: the first read after a SIGKILL with the SSD tier full of
dirty data, and write misses on an empty cache tier (every configuration, `sync`
durability).
"""

import os
import random
import time

from lib import BenchError, log, run
from tier_model import CHUNK, K, M
import tier_servers as ts

CONFIGS = ("dhrd-tier", "ssd-tier", "nbdkit-cache", "lower")


def recovery(ctx, data, ssd, dirty_bytes):
    """Part B: fill the SSD tier with `dirty_bytes` of writes the HDD-timed lower tier has
    not caught up with, SIGKILL the daemon, restart it, and time the first served read
    (from the restart's exec to the end of a one-request replay, retried until the socket
    answers; the replay's own exec counts too, so this is an upper bound)."""
    ssd_bytes = ts.tier_bytes_for(dirty_bytes // CHUNK + 64)
    s = ts.start(ctx, "dhrd-tier", data, ssd, ssd_bytes, 64 * M)
    try:
        run(["fio", "--name=fill", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={s.sock}", "--rw=write",
             "--bs=1M", f"--size={dirty_bytes}", "--iodepth=4"], timeout=1800)
        dirty = (ts.status_of(s).get("tier") or {}).get("slots_dirty", 0)
        s.proc.kill()
        s.proc.wait()
    finally:
        s.stop()
    one = os.path.join(ctx.ws.disk, "tier-one.spc")
    with open(one, "w") as f:
        f.write("0,0,4096,R,0.0\n")
    t0 = time.monotonic()
    s = ts.start(ctx, "dhrd-tier", data, ssd, ssd_bytes, 64 * M, keep_ssd=True)
    try:
        while True:
            r = run([ctx.ws.dhrd_bench, "replay", "--trace", one, "--nbd", s.sock], check=False, timeout=60)
            if "elapsed" in r:
                break
            if time.monotonic() - t0 > 60:
                raise BenchError(f"no read served within 60 s of the restart: {r[-500:]}")
        first_read_ms = (time.monotonic() - t0) * 1000
        after = (ts.status_of(s).get("tier") or {})
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
            s = ts.start(ctx, config, data, ssd, ts.tier_bytes_for(slots), slots * CHUNK)
            try:
                j = ts.replay(ctx, s.sock, trace, 1, None, os.path.join(ctx.out, "logs", f"tier-writes-{config}.json"))
                after = (ts.status_of(s).get("tier") or {})
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


