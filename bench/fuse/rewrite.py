#!/usr/bin/env python3
"""Rewriting existing small files in place (open with O_TRUNC, write, close), as shell
redirections, editors that save in place and log rotation do.

In interleaved rounds, for each configuration, every one of --files files of --file-bytes
is rewritten once with new bytes; the time per file is reported:
  - ext4-fsync: the backing file system with an fsync before close (durable, like dhrd's
    default `sync` mode);
  - ext4: the same without fsync (not durable);
  - dhrd: a mount of --dhrd in `sync` mode (or --durability);
  - dhrd-baseline (optional, --baseline-dhrd BIN): the same with another build.
The daemons' status after the last round shows how the truncations reached them (SETATTR
requests, or opens that truncated themselves with FUSE_ATOMIC_O_TRUNC).

Writes rewrite.json and rewrite.md to bench/results/<date>-fuse-rewrite/. Needs root.

Usage: bench/fuse/rewrite.py [--files 2000] [--file-bytes 4096] [--rounds 3]
       [--dhrd target/release/dhrd] [--baseline-dhrd BIN] [--disk-dir /var/tmp]
       [--durability sync|fsync|periodic:N]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

from benchlib import (add_common_args, machine, machine_line, mount, per_round_ratio,
                      ratios_and_status_lines, results_dir, sh, unmount,
                      write_report)


def rewrite_us(base, names, data, fsync):
    t = time.perf_counter()
    for n in names:
        fd = os.open(os.path.join(base, n), os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
        os.close(fd)
    return (time.perf_counter() - t) / len(names) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-bytes", type=int, default=4096)
    add_common_args(ap)
    ap.add_argument("--durability", default="sync", help="dhrd mount --durability")
    a = ap.parse_args()
    work = os.path.join(a.disk_dir, f"dhrd-rewrite.{os.getpid()}")
    out = results_dir("rewrite")
    configs = [("dhrd", a.dhrd)] + ([("dhrd-baseline", a.baseline_dhrd)] if a.baseline_dhrd else [])
    names = [f"f{i}" for i in range(a.files)]
    seed = os.urandom(a.file_bytes)
    dirs, mounts, rows, status = {}, {}, [], {}
    try:
        for c in ["ext4", "ext4-fsync"] + [n for n, _ in configs]:
            d = os.path.join(work, c)
            os.makedirs(d)
            for n in names:
                with open(os.path.join(d, n), "wb") as f:
                    f.write(seed)
            dirs[c] = d
        sh("sync")
        for name, binary in configs:
            m = os.path.join(work, "mnt-" + name)
            os.makedirs(m)
            mounts[name] = (binary, m, mount(binary, dirs[name], m, "--durability", a.durability))
        order0 = list(dirs)
        for r in range(a.rounds):
            order = order0[r % len(order0):] + order0[:r % len(order0)]
            data = bytes([r + 1]) * a.file_bytes
            for c in order:
                base = mounts[c][1] if c in mounts else dirs[c]
                us = rewrite_us(base, names, data, c == "ext4-fsync")
                row = {"round": r, "config": c, "us_per_file": us}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
        for c, (binary, m, _) in mounts.items():
            st = sh(binary, "status", m, check=False)
            status[c] = [ln for ln in st.splitlines() if ln.startswith(("opens:", "setattrs:"))]
    finally:
        for binary, m, p in mounts.values():
            unmount(binary, m, p)
        shutil.rmtree(work, ignore_errors=True)

    cfgs = list(dirs)
    med = {c: statistics.median([w["us_per_file"] for w in rows if w["config"] == c]) for c in cfgs}
    ratio = lambda n, d: per_round_ratio(rows, "us_per_file", n, d, a.rounds)
    ref = "ext4-fsync" if a.durability == "sync" else "ext4"
    ratios = {f"{c} vs {ref}, time": ratio(c, ref) for c, _ in configs}
    if a.baseline_dhrd:
        ratios["dhrd vs dhrd-baseline, time"] = ratio("dhrd", "dhrd-baseline")
    mach = machine(files=a.files, file_bytes=a.file_bytes, rounds=a.rounds,
                   durability=a.durability)
    lines = [f"# Rewriting {a.files} files of {a.file_bytes} B in place (O_TRUNC, write, close)",
             "", machine_line(mach), "",
             "| config | us per file (median) | per round |", "|---|---|---|"]
    for c in cfgs:
        per = ", ".join(f"{w['us_per_file']:.0f}" for w in rows if w["config"] == c)
        lines.append(f"| {c} | {med[c]:.0f} | {per} |")
    lines += ratios_and_status_lines(ratios, status)
    write_report(out, "rewrite", {"machine": mach, "rows": rows, "median_us": med,
                                  "ratios": ratios, "status": status}, lines)


if __name__ == "__main__":
    main()
