"""dhrd benchmark suite: dhrd and its baselines, same machine, same invocation.

Usage (as root; `bench/suite.sh` builds the binaries first):
    /usr/bin/python3 bench/suite/run.py PROFILE [--only EXP,...] [--configs NAME,...]
        [--disk-dir DIR] [--out DIR] [--traces DIR] [--dhrd BIN] [--dhrd-bench BIN]
        [--set NAME=VALUE ...]

PROFILE is `tiny` (seconds; the test suite's smoke run), `quick` (minutes) or `full` (the
committed figures, about an hour). Writes results.json, report.md and one PNG per
experiment into bench/results/<date>-<subject>-<profile>/ (or --out), and a log of every
command; the subject is `suite`, or with --only the experiments joined by `+`
(bench/new-run-dir.sh, docs/benchmarks.md "Run folders").

--set overrides one of the profile's parameters for this run (more alternating rounds of
a figure that swings, say: `--set attach_writer_rounds=11`); the value is a Python
literal of the parameter's type, and the report names every override.
"""

import argparse
import ast
import json
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import configs  # noqa: E402
import experiments  # noqa: E402
import lib  # noqa: E402
import report  # noqa: E402

K, M, G = 1 << 10, 1 << 20, 1 << 30

PROFILES = {
    "tiny": dict(
        attach_bytes=[8 * M, 32 * M], attach_files=300, attach_sqlite_commits=100, attach_kill_gap_s=0.2, attach_writer_rounds=1, attach_archive_rounds=1,
        runtime_s=0.3, block_bytes=32 * M, procs=[1, 2], replay_bytes=16 * M, replay_qd=[1],
        replay_repeat=1, replay_speedup=200, file_bytes=32 * M, fs_files=[200], fs_threads=4, fs_secs=1,
        fs_mean_file_bytes=16 * K, meta_files=400, pm_files=200, pm_transactions=500, video_bytes=16 * M,
        video_rounds=3, video_repeats=1, warm_bytes=[32 * M],
        warm_rounds=1, mem_bytes=32 * M, transport_bytes=16 * M, transport_rounds=1, transport_runtime_s=1,
        rbd_bytes=[16 * M, 64 * M], rbd_rounds=1,
        cache_bytes=64 * M, cache_runtime_s=2, cache_rounds=1, ra_bytes=32 * M, ra_runtime_s=1,
        seed002_export_bytes=128 * M, seed002_mem_bytes=16 * M, seed002_file_bytes=2 * M, seed002_files=[1, 2],
        seed002_pg_scale=1, seed002_pg_secs=1, seed002_pg_shared_buffers="16MB", seed002_pg_wal_segsize_mb=1,
        seed002_configs=["dhrd-cache", "nbdkit-cache"],
        nvm_bytes=16 * M, nvm_runtime_s=0.1, nvm_sweep="short",
        nvm_devices=("nvm", "hdd"),
        tier_bytes=64 * M, tier_requests=300, tier_rounds=1, tier_traces=["tpcc"], tier_qd=[8], tier_dirty_bytes=16 * M, tier_miss_writes=40,
        rehypar_device_mib=64, rehypar_files=1000, rehypar_threads=[1, 16], rehypar_rounds=1, rehypar_window_ms=2,
        apps_files=200, apps_rounds=1, apps_sqlite_commits=100, apps_pg_scale=1, apps_pg_secs=1,
        apps_pg_shared_buffers="16MB", apps_pg_max_wal="128MB", apps_git_status_runs=2,
    ),
    "quick": dict(
        attach_bytes=[256 * M, 1 * G], attach_files=5000, attach_sqlite_commits=1000, attach_kill_gap_s=1, attach_writer_rounds=3, attach_archive_rounds=3,
        runtime_s=3, block_bytes=1 * G, procs=[1, 2, 4, 8], replay_bytes=1 * G, replay_qd=[1, 8],
        replay_repeat=5, replay_speedup=20, file_bytes=1 * G, fs_files=[2000, 8000], fs_threads=50, fs_secs=10,
        fs_mean_file_bytes=16 * K, meta_files=8000, pm_files=5000, pm_transactions=20000,
        video_bytes=512 * M, video_rounds=3, video_repeats=2, warm_bytes=[512 * M, 2 * G],
        warm_rounds=1, mem_bytes=1 * G, transport_bytes=256 * M, transport_rounds=3, transport_runtime_s=3,
        rbd_bytes=[64 * M, 1 * G], rbd_rounds=2,
        cache_bytes=1 * G, cache_runtime_s=20, cache_rounds=1, ra_bytes=512 * M, ra_runtime_s=15,
        seed002_export_bytes=2 * G, seed002_mem_bytes=512 * M, seed002_file_bytes=50 * M, seed002_files=[1, 4, 10],
        seed002_pg_scale=16, seed002_pg_secs=20, seed002_pg_shared_buffers="128MB",
        nvm_bytes=256 * M, nvm_runtime_s=3,
        tier_bytes=1 * G, tier_requests=8000, tier_rounds=1, tier_traces=["hm_0", "websearch", "tpcc"],
        tier_qd=[8], tier_dirty_bytes=256 * M, tier_miss_writes=400,
        rehypar_device_mib=256, rehypar_files=10000, rehypar_threads=[1, 16], rehypar_rounds=3, rehypar_window_ms=2,
        apps_files=2000, apps_rounds=2, apps_sqlite_commits=500, apps_pg_scale=4, apps_pg_secs=5,
        apps_pg_shared_buffers="128MB", apps_pg_max_wal="1GB", apps_git_status_runs=3,
    ),
    "full": dict(
        attach_bytes=[1 * G, 6 * G], attach_files=20000, attach_sqlite_commits=5000, attach_kill_gap_s=2, attach_writer_rounds=11, attach_archive_rounds=21,
        runtime_s=5, block_bytes=4 * G, procs=[1, 2, 4, 8, 16, 32], replay_bytes=4 * G,
        replay_qd=[1, 8], replay_repeat=10, replay_speedup=5, file_bytes=4 * G, fs_files=[8000, 32000, 128000],
        fs_threads=50, fs_secs=20, fs_mean_file_bytes=16 * K, meta_files=40000, pm_files=5000,
        pm_transactions=50000, video_bytes=2 * G, video_rounds=3, video_repeats=3,
        warm_bytes=[1 * G, 6 * G], warm_rounds=2, mem_bytes=4 * G,
        transport_bytes=256 * M, transport_rounds=5, transport_runtime_s=4,
        rbd_bytes=[256 * M, 4 * G], rbd_rounds=3,
        cache_bytes=1 * G, cache_runtime_s=40, cache_rounds=2, ra_bytes=1 * G, ra_runtime_s=20,
        seed002_export_bytes=4 * G, seed002_mem_bytes=1 * G, seed002_file_bytes=100 * M, seed002_files=[1, 4, 10],
        seed002_pg_scale=32, seed002_pg_secs=60, seed002_pg_shared_buffers="128MB",
        nvm_bytes=512 * M, nvm_runtime_s=8,
        tier_bytes=1 * G, tier_requests=None, tier_rounds=2, tier_traces=["hm_0", "websearch", "tpcc"],
        tier_qd=[8], tier_dirty_bytes=1 * G, tier_miss_writes=1000,
        rehypar_device_mib=1024, rehypar_files=40000, rehypar_threads=[1, 16], rehypar_rounds=3, rehypar_window_ms=2,
        apps_files=20000, apps_rounds=3, apps_sqlite_commits=2000, apps_pg_scale=16, apps_pg_secs=20,
        apps_pg_shared_buffers="128MB", apps_pg_max_wal="1GB", apps_git_status_runs=5,
    ),
}
ORDER = ("block", "replay", "file", "fileserver", "blockfs", "video", "warmup", "memory", "transport", "attach", "rbd",
         "cache", "nvm", "seed002", "tier", "rehypar", "apps")
TOOLS = ("fio", "vmtouch", "fincore", "losetup", "mkfs.ext4", "fusermount3", "mountpoint", "findmnt")


class Context:
    def __init__(self, profile, p, ws, out, traces, only_configs):
        self.profile, self.p, self.ws, self.out, self.traces = profile, p, ws, out, traces
        self.only_configs = only_configs

    def pick(self, names):
        return [n for n in names if not self.only_configs or n in self.only_configs]


def with_overrides(profile, sets):
    """The profile's parameters with each `NAME=VALUE` of `sets` applied, and the applied
    overrides. A name the profile lacks, or a value not of the parameter's type, is an
    error: a typo must not leave a run at the profile's default while its report claims
    otherwise."""
    p = dict(profile)
    applied = {}
    for item in sets or []:
        name, sep, text = item.partition("=")
        if not sep or name not in p:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(p))}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"--set {item!r}: {text!r} is not a Python literal ({e})") from None
        if type(value) is not type(p[name]):
            raise ValueError(f"--set {item!r}: {name} takes a {type(p[name]).__name__}, "
                             f"got a {type(value).__name__}")
        p[name] = applied[name] = value
    return p, applied


def installed_form(dhrd, ws):
    """A copy of `dhrd` without its debug information, as the Debian package ships it
    (scripts/build-deb.sh), in the workspace on the disk under test (its cleanup removes
    it). Why: the release build keeps debug information for profiles, about 22 MiB of the
    26 MiB file, and a cold start reads part of it, since the disk's 8 MiB readahead
    windows around the first faults reach past the code: `dhrd --version` with the page
    cache dropped took 44-48 ms as built and 29-33 ms stripped. Returns (binary, how the
    report names it)."""
    out = os.path.join(ws.disk, "dhrd")
    try:
        subprocess.run(["objcopy", "--strip-debug", dhrd, out], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        lib.log(f"bench suite: objcopy --strip-debug failed ({e}); running {dhrd} as built")
        return dhrd, "as built (with debug information; objcopy failed)"
    return out, "without debug information, as the package ships it (objcopy --strip-debug)"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    ap = argparse.ArgumentParser(description="dhrd benchmark suite")
    ap.add_argument("profile", choices=sorted(PROFILES))
    ap.add_argument("--only", help="comma-separated experiments: " + ",".join(ORDER))
    ap.add_argument("--configs", help="comma-separated configuration names to keep")
    ap.add_argument("--disk-dir", default="/var/tmp", help="directory on the disk under test")
    ap.add_argument("--out", help="result directory (default bench/results/<date>-<subject>-<profile>)")
    ap.add_argument("--traces", default=os.environ.get("DHRD_TRACES_DIR",
                                                       os.path.join(root, "..", "shared", "traces")))
    ap.add_argument("--dhrd", default=os.path.join(target, "release", "dhrd"))
    ap.add_argument("--dhrd-bench", default=os.path.join(target, "release", "dhrd-bench"))
    ap.add_argument("--keep-debuginfo", action="store_true",
                    help="run the dhrd binary as built, not stripped as the package ships it")
    ap.add_argument("--set", action="append", metavar="NAME=VALUE",
                    help="override one of the profile's parameters (repeatable)")
    a = ap.parse_args()
    try:
        p, overrides = with_overrides(PROFILES[a.profile], a.set)
    except ValueError as e:
        sys.exit(f"bench suite: {e}")

    if os.geteuid() != 0:
        sys.exit("bench suite: needs root (mounts, loop devices, dropping caches)")
    only = a.only.split(",") if a.only else list(ORDER)
    bad = [x for x in only if x not in experiments.EXPERIMENTS]
    if bad:
        sys.exit(f"bench suite: unknown experiment(s) {bad}; choose from {', '.join(ORDER)}")
    for b in (a.dhrd, a.dhrd_bench):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench suite: {b} not found; run bench/suite.sh (it builds the release binaries)")
    try:
        lib.need_tools(TOOLS)
    except lib.BenchError as e:
        sys.exit(f"bench suite: {e}")

    subject = "+".join(only) if a.only else "suite"
    out = a.out or subprocess.run(
        [os.path.join(root, "bench", "new-run-dir.sh"), f"{subject}-{a.profile}"],
        check=True, capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    lib.LOG = open(os.path.join(out, "logs", "commands.log"), "w")
    ws = configs.Workspace(a.disk_dir, a.dhrd, a.dhrd_bench)
    binary = "as built (with debug information)"
    if not a.keep_debuginfo:
        ws.dhrd, binary = installed_form(a.dhrd, ws)
    ctx = Context(a.profile, p, ws, out, os.path.abspath(a.traces),
                  set(a.configs.split(",")) if a.configs else None)
    results = {
        "profile": a.profile,
        "parameters": p,
        "overrides": overrides,
        "command": " ".join(sys.argv),
        "machine": lib.machine(a.disk_dir),
        "dhrd_binary": binary,
        "experiments": {},
    }
    lib.log(f"bench suite: profile {a.profile}, results in {out}")
    t0 = time.monotonic()
    failed = []
    try:
        for name in ORDER:
            if name not in only:
                continue
            te = time.monotonic()
            try:
                r = experiments.EXPERIMENTS[name](ctx)
            except Exception as e:  # one broken experiment must not lose the others' results
                lib.log(f"experiment {name} failed: {e}")
                if lib.LOG:
                    lib.LOG.write(traceback.format_exc())
                r = {"title": name, "error": str(e)}
                failed.append(name)
            r["seconds"] = round(time.monotonic() - te, 1)
            results["experiments"][name] = r
            # Written after each experiment so an interrupted run keeps what it measured.
            with open(os.path.join(out, "results.json"), "w") as f:
                json.dump(results, f, indent=1, default=str)
    finally:
        ws.cleanup()
    results["seconds"] = round(time.monotonic() - t0, 1)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    report.write(results, out)
    lib.log(f"bench suite: done in {results['seconds']} s; {out}/report.md")
    if failed:
        sys.exit(f"bench suite: experiment(s) failed: {', '.join(failed)} (see {out}/logs/commands.log)")


if __name__ == "__main__":
    main()
