#!/usr/bin/env python3
"""Copying a file inside a `dhrd mount` (`cp`, which uses copy_file_range), durable.

In interleaved rounds (the machine is shared and noisy, so only ratios within one round
are compared), for each configuration: copy a --size file to a new name in the same
directory and time it until the copy is durable, then delete the copy.
  - ext4: `cp` on the backing file system, then `sync FILE` (fsync of the copy; without it
    the copy sits in the page cache only);
  - dhrd: `cp` through a mount in the default `sync` durability (every byte is on the
    backing when cp returns, so nothing is added);
  - dhrd-baseline (optional, --baseline-dhrd BIN): the same with another build, e.g. one
    without the daemon-side copy, where the kernel falls back to 64 KiB reads and writes.
The daemon's status after the last round shows whether the copies reached it as
COPY_FILE_RANGE requests.

Writes copy.json and copy.md to bench/results/<date>-fuse-copy/. Needs root (mounts).

Usage: bench/fuse/copyrange.py [--size-mib 512] [--rounds 3] [--dhrd target/release/dhrd]
       [--baseline-dhrd BIN] [--disk-dir /var/tmp]
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


def timed_copy(src, dst, fsync_after):
    t = time.monotonic()
    sh("cp", src, dst)
    if fsync_after:
        sh("sync", dst)
    secs = time.monotonic() - t
    os.unlink(dst)
    return secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=512)
    add_common_args(ap)
    a = ap.parse_args()
    work = os.path.join(a.disk_dir, f"dhrd-copy.{os.getpid()}")
    out = results_dir("copy")
    configs = [("dhrd", a.dhrd)] + ([("dhrd-baseline", a.baseline_dhrd)] if a.baseline_dhrd else [])
    mounts, rows, status = {}, [], {}
    try:
        os.makedirs(os.path.join(work, "ext4"))
        src = os.path.join(work, "ext4", "data")
        sh("fio", "--name=fill", f"--filename={src}", "--rw=write", "--bs=1M",
           f"--size={a.size_mib}M", "--output=/dev/null")
        for name, binary in configs:
            b, m = os.path.join(work, "backing-" + name), os.path.join(work, "mnt-" + name)
            os.makedirs(b)
            os.makedirs(m)
            shutil.copyfile(src, os.path.join(b, "data"))
            sh("sync")
            mounts[name] = (binary, m, mount(binary, b, m))
        names = ["ext4"] + [n for n, _ in configs]
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for c in order:
                if c == "ext4":
                    secs = timed_copy(src, src + ".copy", True)
                else:
                    m = mounts[c][1]
                    secs = timed_copy(os.path.join(m, "data"), os.path.join(m, "data.copy"), False)
                row = {"round": r, "config": c, "secs": secs, "mib_per_s": a.size_mib / secs}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
        for c, (binary, m, _) in mounts.items():
            st = sh(binary, "status", m, check=False)
            status[c] = [ln for ln in st.splitlines() if ln.startswith(("writes:", "copies:"))]
    finally:
        for binary, m, p in mounts.values():
            unmount(binary, m, p)
        shutil.rmtree(work, ignore_errors=True)

    med = {c: statistics.median([w["secs"] for w in rows if w["config"] == c]) for c in names}
    ratio = lambda n, d: per_round_ratio(rows, "secs", n, d, a.rounds)
    ratios = {f"{c} vs ext4, time": ratio(c, "ext4") for c, _ in configs}
    if a.baseline_dhrd:
        ratios["dhrd vs dhrd-baseline, time"] = ratio("dhrd", "dhrd-baseline")
    mach = machine(size_mib=a.size_mib, rounds=a.rounds)
    lines = [f"# cp of a {a.size_mib} MiB file inside the same directory, durable", "",
             machine_line(mach), "",
             "| config | seconds (median) | MiB/s | per round |", "|---|---|---|---|"]
    for c in names:
        per = ", ".join(f"{w['secs']:.2f}" for w in rows if w["config"] == c)
        lines.append(f"| {c} | {med[c]:.2f} | {a.size_mib / med[c]:.0f} | {per} |")
    lines += ratios_and_status_lines(ratios, status)
    write_report(out, "copy", {"machine": mach, "rows": rows, "median_secs": med,
                               "ratios": ratios, "status": status}, lines)


if __name__ == "__main__":
    main()
