"""Experiment 13's servers and replays: `dhrd nbd` over the HDD-timed lower tier with or
without the SSD tier and RAM, nbdkit's cache filter, and `dhrd-bench replay --nbd`.

Every server starts afresh (its SSD file removed, the lower tier's cache mark dropped) and
is stopped without waiting for the write-back: the data is thrown away after each run.
"""

import json
import os
import time

from cache import Server
from lib import run
from tier_model import CHUNK

HIT_BELOW_US = 7500
# The SSD tier's header, slot-table entry and table copies (crates/dhrd-tier/src/tiered/layout.rs).
TIER_HEADER_BYTES, TIER_ENTRY_BYTES, TIER_TABLES = 4096, 64, 2
NBDKIT_DELAY_MS = 8
NBDKIT_LOW_THRESHOLD_PERCENT = 80
# The status file is rewritten every second (crates/dhrd-cli/src/nbd.rs).
STATUS_FRESH_S = 1.2


def tier_bytes_for(slots):
    """The SSD size that opens with exactly `slots` slots (`dhrd_tier::ssd_bytes_for`)."""
    table = -(-TIER_ENTRY_BYTES * slots // TIER_HEADER_BYTES) * TIER_HEADER_BYTES
    return TIER_HEADER_BYTES + TIER_TABLES * table + slots * CHUNK


def nbdkit_cache_bytes(mem):
    """nbdkit's cache filter reclaims down to 80% of cache-max-size once it passes 95%
    (its cache-low-threshold and cache-high-threshold defaults), so it gets room for the
    placed chunks below its low threshold."""
    return -(-mem * 100 // NBDKIT_LOW_THRESHOLD_PERCENT // CHUNK) * CHUNK


def write_trace(path, reqs):
    """An SPC trace of folded requests (is_write, offset, len); the replay folds them onto
    the same export unchanged (aligned offsets inside the span)."""
    with open(path, "w") as f:
        for i, (w, off, ln) in enumerate(reqs):
            f.write(f"0,{off // 512},{ln},{'W' if w else 'R'},{i / 1e6:.6f}\n")


def warm_trace(path, chunks):
    """An SPC trace reading each chunk twice (first all once, then all again)."""
    write_trace(path, [(False, c * CHUNK, CHUNK) for c in chunks] * 2)


def replay(ctx, sock, trace, qd, max_requests, json_path):
    cmd = [ctx.ws.dhrd_bench, "replay", "--trace", trace, "--nbd", sock, "--queue-depth", str(qd),
           "--fast-below-us", str(HIT_BELOW_US), "--json", json_path]
    if max_requests:
        cmd += ["--max-requests", str(max_requests)]
    run(cmd, timeout=3600)
    with open(json_path) as f:
        return json.load(f)


def mean_us(j):
    """The mean request time of a replay (reads and writes together)."""
    lat = j["latency_us"]
    n = sum(lat[k].get("count", 0) for k in ("read", "write"))
    if not n:
        return None
    return sum(lat[k].get("mean", 0) * lat[k].get("count", 0) for k in ("read", "write")) / n


def start(ctx, config, data, ssd, ssd_bytes, mem, durability="sync", keep_ssd=False):
    """One configuration: `dhrd-tier` (RAM `mem` over the SSD tier; RAM keeps what the
    warm-up put there: no eviction, no read-ahead), `ssd-tier` (`--mem 0`), `lower` (the
    HDD-timed file alone) or `nbdkit-cache` (its cache filter with room for `mem`)."""
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
           "--chunk", str(CHUNK), "--status-file", status, "--no-prefill", "--durability", durability,
           "--writeback-drain-secs", "0"]
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
        if config == "dhrd-tier":
            cmd += ["--cache-policy", "off", "--read-ahead", "none"]
    s = Server(ctx, config, cmd, sock, log_prefix="tier")
    s.status = status
    return s


def status_of(server):
    if not server.status:
        return {}
    time.sleep(STATUS_FRESH_S)
    try:
        with open(server.status) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


REQUEST_KEYS = ("read_requests_ssd", "read_requests_lower", "write_requests_ssd", "write_requests_lower")


def request_counts(before, after):
    """The tier's per-request counts between two status snapshots."""
    tb, ta = before.get("tier", {}), after.get("tier", {})
    return {k: ta.get(k, 0) - tb.get(k, 0) for k in REQUEST_KEYS}
