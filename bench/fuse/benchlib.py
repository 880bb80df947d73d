"""Shared pieces of the Python FUSE benchmarks in bench/fuse/: running commands, mounting
a dhrd build, the machine description, same-round ratios and the results directory."""
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DHRD = os.path.join(ROOT, "target/release/dhrd")


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


def add_common_args(ap, rounds=3):
    """The options every FUSE benchmark here takes: rounds, the dhrd build, an optional
    baseline build, and where on the disk to work."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--dhrd", default=DEFAULT_DHRD)
    ap.add_argument("--baseline-dhrd")
    ap.add_argument("--disk-dir", default="/var/tmp")


def mount(dhrd, backing, mnt, *extra):
    """Starts `dhrd mount` in the foreground (its log next to the mount point) and waits
    until the load is complete; returns the process."""
    log = open(mnt + ".log", "w")
    p = subprocess.Popen([dhrd, "mount", backing, mnt, "--quiet", *extra],
                         stdout=log, stderr=log)
    for _ in range(6000):
        if subprocess.run(["mountpoint", "-q", mnt]).returncode == 0:
            if "complete" in sh(dhrd, "status", mnt, check=False):
                return p
        time.sleep(0.01)
    p.kill()
    sys.exit(f"mount of {backing} on {mnt} did not become ready")


def unmount(dhrd, mnt, proc):
    subprocess.run([dhrd, "umount", mnt], capture_output=True)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def results_dir(tag):
    """A new run folder, bench/results/<date>-fuse-<tag>[-n] (bench/new-run-dir.sh)."""
    return subprocess.run([os.path.join(ROOT, "bench", "new-run-dir.sh"), "fuse-" + tag],
                          check=True, capture_output=True, text=True).stdout.strip()


def machine(**params):
    m = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "dhrd": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD").strip(),
    }
    m.update(params)
    return m


def per_round_ratio(rows, metric, num, den, rounds):
    """Median over rounds of num/den, each ratio taken within one round (the machines are
    shared and noisy, so runs of different rounds are not compared)."""
    vals = []
    for r in range(rounds):
        n = [w[metric] for w in rows if w["config"] == num and w["round"] == r]
        d = [w[metric] for w in rows if w["config"] == den and w["round"] == r]
        if n and d and d[0]:
            vals.append(n[0] / d[0])
    return statistics.median(vals) if vals else None


def write_report(out, tag, data, lines):
    """Writes <tag>.json (every number) and <tag>.md (the table), prints the table."""
    with open(os.path.join(out, tag + ".json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out, tag + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"results in {out}")


def machine_line(m):
    return "Machine: " + ", ".join(f"{k} {v}" for k, v in m.items())


def ratios_and_status_lines(ratios, status):
    """The report's tail: same-round time ratios, then the daemons' status lines."""
    lines = ["", "Ratios of times (median of per-round ratios; below 1 is faster):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in ratios.items() if v is not None]
    lines += ["", "Daemon status after the last round:", ""]
    lines += [f"- {c}: " + "; ".join(s) for c, s in status.items()]
    return lines
