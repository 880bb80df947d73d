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

Writes copy.json and copy.md to bench/results/fuse-<date>-copy/. Needs root (mounts).

Usage: bench/fuse/copy.py [--size-mib 512] [--rounds 3] [--dhrd target/release/dhrd]
       [--baseline-dhrd BIN] [--disk-dir /var/tmp]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


def timed_copy(src, dst, fsync_after):
    t = time.monotonic()
    sh("cp", src, dst)
    if fsync_after:
        sh("sync", dst)
    secs = time.monotonic() - t
    os.unlink(dst)
    return secs


def mount(dhrd, backing, mnt):
    log = open(mnt + ".log", "w")
    p = subprocess.Popen([dhrd, "mount", backing, mnt, "--quiet"], stdout=log, stderr=log)
    for _ in range(600):
        if subprocess.run(["mountpoint", "-q", mnt]).returncode == 0:
            out = subprocess.run([dhrd, "status", mnt], capture_output=True, text=True).stdout
            if "complete" in out:
                return p
        time.sleep(0.1)
    p.kill()
    sys.exit(f"mount of {backing} on {mnt} did not become ready")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dhrd", default=os.path.join(ROOT, "target/release/dhrd"))
    ap.add_argument("--baseline-dhrd")
    ap.add_argument("--disk-dir", default="/var/tmp")
    a = ap.parse_args()
    work = os.path.join(a.disk_dir, f"dhrd-copy.{os.getpid()}")
    out = os.path.join(ROOT, "bench/results",
                       "fuse-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-copy")
    os.makedirs(out, exist_ok=True)
    configs = [("dhrd", a.dhrd)] + ([("dhrd-baseline", a.baseline_dhrd)] if a.baseline_dhrd else [])
    mounts, procs, rows, status = {}, [], [], {}
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
            procs.append(mount(binary, b, m))
            mounts[name] = (binary, m)
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
        for c, (binary, m) in mounts.items():
            st = subprocess.run([binary, "status", m], capture_output=True, text=True).stdout
            status[c] = [ln for ln in st.splitlines() if ln.startswith(("writes:", "copies:"))]
    finally:
        for c, (binary, m) in mounts.items():
            subprocess.run([binary, "umount", m], capture_output=True)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)

    def per_round_ratio(num, den):
        v = []
        for r in range(a.rounds):
            x = [w["secs"] for w in rows if w["round"] == r and w["config"] == num]
            y = [w["secs"] for w in rows if w["round"] == r and w["config"] == den]
            if x and y:
                v.append(x[0] / y[0])
        return statistics.median(v) if v else None

    med = {c: statistics.median([w["secs"] for w in rows if w["config"] == c]) for c in names}
    ratios = {f"{c} vs ext4, time": per_round_ratio(c, "ext4") for c, _ in configs}
    if a.baseline_dhrd:
        ratios["dhrd vs dhrd-baseline, time"] = per_round_ratio("dhrd", "dhrd-baseline")
    machine = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "dhrd": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD").strip(),
        "size_mib": a.size_mib,
        "rounds": a.rounds,
    }
    with open(os.path.join(out, "copy.json"), "w") as f:
        json.dump({"machine": machine, "rows": rows, "median_secs": med, "ratios": ratios,
                   "status": status}, f, indent=1)
    lines = [f"# cp of a {a.size_mib} MiB file inside the same directory, durable", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), "",
             "| config | seconds (median) | MiB/s | per round |", "|---|---|---|---|"]
    for c in names:
        per = ", ".join(f"{w['secs']:.2f}" for w in rows if w["config"] == c)
        lines.append(f"| {c} | {med[c]:.2f} | {a.size_mib / med[c]:.0f} | {per} |")
    lines += ["", "Ratios of times (median of per-round ratios; below 1 is faster):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in ratios.items() if v is not None]
    lines += ["", "Daemon status after the last round:", ""]
    lines += [f"- {c}: " + "; ".join(s) for c, s in status.items()]
    with open(os.path.join(out, "copy.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
