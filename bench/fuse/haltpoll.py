#!/usr/bin/env python3
"""Small files through `dhrd mount` with idle vCPUs that halt at once or poll first.

On a VM whose cpuidle driver is `haltpoll`, `haltpoll.guest_halt_poll_ns` says how long an
idle vCPU polls for work before it halts. At 0 it halts at once, and waking a thread on
it is an interrupt the hypervisor has to deliver; a FUSE request wakes a daemon thread
and its reply wakes the caller, so every round trip pays for one or two. A local file
system's create or stat wakes no one. This measures what that costs dhrd's metadata path,
in alternating rounds of the two settings:
  - Postmark (5,000 files of 500 B-10 KB, read:append 5:5), transactions/s;
  - create + stat + unlink of empty files (`dhrd-bench metaops`), 1 and 8 threads;
  - the fileserver personality (`dhrd-bench fileserver`, 16 KiB files, 50 threads);
each on a `fsync`-mode dhrd mount and on the ext4 below it (a fresh journalled ext4 on a
loop device over an image on --disk-dir: the suite's configs.JournaledDisk, as in its
experiment 4). The setting is restored on every exit path.

Writes haltpoll.json and haltpoll.md to bench/results/<date>-fuse-haltpoll/. Needs root,
postmark, and a haltpoll cpuidle driver (it says so and stops otherwise).

Usage: bench/fuse/haltpoll.py [--poll-ns 200000] [--rounds 2] [--fs-files 8000]
       [--fs-secs 10] [--dhrd target/release/dhrd] [--disk-dir /var/tmp]
"""
import argparse
import atexit
import json
import os
import signal
import subprocess
import sys

from benchlib import (DEFAULT_DHRD, ROOT, machine, machine_line, mount,
                      per_round_ratio, results_dir, unmount, write_report)

sys.path.insert(0, os.path.join(ROOT, "bench/suite"))
import configs  # noqa: E402
import experiments  # noqa: E402
import lib  # noqa: E402

POLL_PARAM = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
DRIVER = "/sys/devices/system/cpu/cpuidle/current_driver"
# Room for the workloads' files; JournaledDisk adds a quarter and 512 MiB of slack, so the
# ext4 image is 8 GiB.
DISK_BYTES = 6 << 30
PM_FILES, PM_TRANSACTIONS = 5000, 20000
META_FILES = 8000


def read(path):
    with open(path) as f:
        return f.read().strip()


def set_poll(ns):
    with open(POLL_PARAM, "w") as f:
        f.write(str(ns))


def bench_json(bench, *args):
    out = subprocess.run([bench, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[0])


def measure(bench, d, a):
    pm = experiments.postmark(d, {"pm_files": PM_FILES, "pm_transactions": PM_TRANSACTIONS})
    m1 = bench_json(bench, "metaops", "--dir", d, "--threads", "1", "--files-per-thread", str(META_FILES))
    m8 = bench_json(bench, "metaops", "--dir", d, "--threads", "8",
                    "--files-per-thread", str(META_FILES // 8))
    fs = bench_json(bench, "fileserver", "--dir", d, "--files", str(a.fs_files), "--secs", str(a.fs_secs),
                    "--mean-file-bytes", "16384")
    return {"postmark_tx_s": pm["tx_per_sec"], "metaops1_ops_s": m1["ops_per_sec"],
            "metaops8_ops_s": m8["ops_per_sec"], "fileserver_ops_s": fs["ops_per_sec"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dhrd", default=DEFAULT_DHRD)
    ap.add_argument("--disk-dir", default="/var/tmp")
    ap.add_argument("--poll-ns", type=int, default=200_000)
    ap.add_argument("--fs-files", type=int, default=8000)
    ap.add_argument("--fs-secs", type=int, default=10)
    ap.add_argument("--dhrd-bench", default=os.path.join(os.path.dirname(DEFAULT_DHRD), "dhrd-bench"))
    a = ap.parse_args()
    if not os.path.exists(POLL_PARAM) or read(DRIVER) != "haltpoll":
        sys.exit("this machine's cpuidle driver is not haltpoll: nothing to compare")
    before = read(POLL_PARAM)
    atexit.register(set_poll, before)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    ws = configs.Workspace(a.disk_dir, a.dhrd, a.dhrd_bench)
    # The mount point (and the daemon's log beside it) on --disk-dir, outside the ext4
    # that is measured.
    mnt = os.path.join(ws.disk, "mnt")
    rows = []
    settings = [0, a.poll_ns]
    try:
        with configs.JournaledDisk(ws, "haltpoll", DISK_BYTES) as jws:
            backing, plain = os.path.join(jws.disk, "backing"), os.path.join(jws.disk, "plain")
            os.makedirs(backing)
            os.makedirs(plain)
            os.makedirs(mnt)
            proc = mount(a.dhrd, backing, mnt, "--durability", "fsync")
            try:
                for r in range(a.rounds):
                    order = settings if r % 2 == 0 else settings[::-1]
                    for ns in order:
                        set_poll(ns)
                        for config, d in (("dhrd-fsync", mnt), ("ext4", plain)):
                            row = {"round": r, "poll_ns": ns, "config": config,
                                   **measure(a.dhrd_bench, d, a)}
                            print(json.dumps(row), flush=True)
                            rows.append(row)
            finally:
                # Before the ext4 below it is unmounted on leaving the with block.
                unmount(a.dhrd, mnt, proc)
    finally:
        set_poll(before)
        # Whatever a failed step left mounted or attached under the workspace goes too.
        ws.cleanup()

    metrics = ["postmark_tx_s", "metaops1_ops_s", "metaops8_ops_s", "fileserver_ops_s"]
    m = machine(poll_ns=a.poll_ns, rounds=a.rounds, **{"idle": lib.idle_and_reporting()})
    lines = ["# Small files with idle vCPUs halting at once or polling first", "", machine_line(m), "",
             "| figure | poll 0: dhrd / ext4 | ratio | poll {0}: dhrd / ext4 | ratio | dhrd gain | ext4 gain |"
             .format(a.poll_ns),
             "|---|---|---|---|---|---|---|"]
    summary = {}
    for k in metrics:
        cell = {}
        for ns in settings:
            sub = [dict(w, config=w["config"]) for w in rows if w["poll_ns"] == ns]
            med = {c: sorted(w[k] for w in sub if w["config"] == c) for c in ("dhrd-fsync", "ext4")}
            cell[ns] = {c: v[len(v) // 2] for c, v in med.items()}
            cell[ns]["ratio"] = per_round_ratio(sub, k, "dhrd-fsync", "ext4", a.rounds)
        gain = {c: per_round_ratio([dict(w, config=f"{w['config']}@{w['poll_ns']}") for w in rows], k,
                                   f"{c}@{a.poll_ns}", f"{c}@0", a.rounds) for c in ("dhrd-fsync", "ext4")}
        summary[k] = {"by_poll_ns": cell, "gain": gain}
        lo, hi = cell[0], cell[a.poll_ns]
        lines.append(f"| {k} | {lo['dhrd-fsync']:,.0f} / {lo['ext4']:,.0f} | {lo['ratio']:.2f}x "
                     f"| {hi['dhrd-fsync']:,.0f} / {hi['ext4']:,.0f} | {hi['ratio']:.2f}x "
                     f"| {gain['dhrd-fsync']:.2f}x | {gain['ext4']:.2f}x |")
    lines += ["", "Ratios are medians of per-round ratios; gains compare the two settings within a round."]
    out = results_dir("haltpoll")
    write_report(out, "haltpoll", {"machine": m, "rows": rows, "summary": summary}, lines)


if __name__ == "__main__":
    main()
