#!/usr/bin/env python3
"""Many small files through `dhrd mount`: what a tree larger than the object cache costs.

For each configuration, in interleaved rounds (the machine is shared and noisy, so only
ratios within one round are compared):
  - read every file (open, one 64 KiB read, close) twice after the load completed; the
    second pass is reported, in microseconds per file;
  - `du -s` of the tree after the kernel dropped its dentries and inodes (one stat per
    file: LOOKUPs, or READDIRPLUS entries);
  - the daemon's reads served from RAM and from the backing (dhrd status).
Configurations: dhrd (the binary given with --dhrd), optionally a second dhrd binary
(--baseline-dhrd, e.g. an older build, for an A/B comparison), and the backing ext4
directory itself with a warm page cache.

Writes smallfiles.json and smallfiles.md to bench/results/<date>-fuse-smallfiles/.
Needs root (mounts, drop_caches).

Usage: bench/fuse/smallfiles.py [--files 20000] [--file-bytes 1024] [--rounds 3]
       [--dhrd target/release/dhrd] [--baseline-dhrd BIN] [--disk-dir /var/tmp]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import (add_common_args, machine, machine_line, per_round_ratio, results_dir,
                      sh, write_report)

FILES_PER_DIR = 1000


def drop_kernel_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def make_tree(root, files, file_bytes):
    os.makedirs(root)
    paths = []
    for i in range(files):
        d = os.path.join(root, f"d{i // FILES_PER_DIR}")
        if i % FILES_PER_DIR == 0:
            os.mkdir(d)
        p = os.path.join(d, f"f{i}")
        with open(p, "wb") as f:
            f.write(os.urandom(file_bytes))
        paths.append(os.path.relpath(p, root))
    return paths


READ_BYTES = 64 << 10  # one read(2) per file, as `cat` of a small file does


def read_all_us(base, paths):
    t = time.perf_counter()
    for p in paths:
        fd = os.open(os.path.join(base, p), os.O_RDONLY)
        os.read(fd, READ_BYTES)
        os.close(fd)
    return (time.perf_counter() - t) / len(paths) * 1e6


def du_secs(path):
    drop_kernel_caches()
    t = time.perf_counter()
    sh("du", "-s", path)
    return time.perf_counter() - t


def status_reads(dhrd, mnt):
    st = sh(dhrd, "status", mnt)
    line = next((l for l in st.splitlines() if l.startswith("reads (daemon):")), "")
    def num(key):
        try:
            return int(line.split(key)[1].split(",")[0].strip())
        except (IndexError, ValueError):
            return None
    return num("RAM "), num("backing ")


def run_dhrd(dhrd, backing, mnt, paths):
    sh(dhrd, "mount", backing, mnt, "--daemon", "--quiet")
    try:
        deadline = time.time() + 600
        while "complete" not in sh(dhrd, "status", mnt) and time.time() < deadline:
            time.sleep(0.05)
        read_all_us(mnt, paths)
        us = read_all_us(mnt, paths)
        ram, backing_reads = status_reads(dhrd, mnt)
        du = du_secs(mnt)
    finally:
        sh(dhrd, "umount", mnt, check=False)
    return {"read_us_per_file": us, "du_secs": du, "reads_ram": ram, "reads_backing": backing_reads}


def run_ext4(backing, paths):
    read_all_us(backing, paths)
    us = read_all_us(backing, paths)
    return {"read_us_per_file": us, "du_secs": du_secs(backing)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--file-bytes", type=int, default=1024)
    add_common_args(ap)
    a = ap.parse_args()
    work = os.path.join(a.disk_dir, f"dhrd-smallfiles.{os.getpid()}")
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    out = results_dir("smallfiles")
    configs = [("dhrd", a.dhrd)] + ([("dhrd-baseline", a.baseline_dhrd)] if a.baseline_dhrd else [])
    try:
        paths = make_tree(backing, a.files, a.file_bytes)
        os.makedirs(mnt)
        rows = []
        for rnd in range(a.rounds):
            for name, binary in configs:
                r = run_dhrd(binary, backing, mnt, paths)
                r.update(config=name, round=rnd)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
            r = run_ext4(backing, paths)
            r.update(config="ext4-warm", round=rnd)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
    finally:
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    def ratio(metric, num, den):
        return per_round_ratio(rows, metric, num, den, a.rounds)

    names = [c for c, _ in configs] + ["ext4-warm"]
    med = {c: {m: statistics.median([r[m] for r in rows if r["config"] == c])
               for m in ("read_us_per_file", "du_secs")} for c in names}
    mach = machine(files=a.files, file_bytes=a.file_bytes, rounds=a.rounds)
    ratios = {f"{c} vs ext4-warm, {m}": ratio(m, c, "ext4-warm")
              for c, _ in configs for m in ("read_us_per_file", "du_secs")}
    if a.baseline_dhrd:
        for m in ("read_us_per_file", "du_secs"):
            ratios[f"dhrd vs dhrd-baseline, {m}"] = ratio(m, "dhrd", "dhrd-baseline")
    lines = [f"# Small files through dhrd mount ({a.files} files of {a.file_bytes} B)", "",
             machine_line(mach), "",
             "| config | read, us per file (median) | du -s, cold kernel cache, s (median) | daemon reads RAM / backing (last round) |",
             "|---|---|---|---|"]
    for c in names:
        last = [r for r in rows if r["config"] == c][-1]
        reads = f"{last.get('reads_ram')} / {last.get('reads_backing')}" if "reads_ram" in last else "-"
        lines.append(f"| {c} | {med[c]['read_us_per_file']:.1f} | {med[c]['du_secs']:.3f} | {reads} |")
    lines += ["", "Ratios (median of per-round ratios; below 1 means faster than the reference):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in ratios.items() if v is not None]
    write_report(out, "smallfiles", {"machine": mach, "rows": rows, "medians": med,
                                     "ratios": ratios}, lines)


if __name__ == "__main__":
    main()
