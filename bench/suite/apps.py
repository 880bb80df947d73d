"""Experiment 18 (apps): real small-file applications on dhrd in `fsync` mode against a plain
directory of the same file system (issue 33; the in-place mode's targets from issue 31).

Configurations, all measured in the same run, in rounds whose order rotates (who goes first
changes every round), each on a fresh journalled ext4 of its own (configs.JournaledDisk: the
disk's own ext4 may have no journal, and a fresh one per configuration means that no run
inherits another's freed inodes or dirty data):
- plain: a directory of that ext4, used as it is; the applications' own fsyncs make their
  data durable;
- dhrd-pagecache-fsync: `dhrd mount --durability fsync --allow-other` of a backing directory
  on it (other users: PostgreSQL runs as `postgres`);
- dhrd-attach-fsync: `dhrd attach DIR --durability fsync` of a directory on it.
All three promise the same: data is durable once the application's fsync returns.

Workloads, in this order, in the configuration's directory:
- extract: `tar -xf` of an archive of `apps_files` files of 1-8 KiB, 50 to a directory, with
  deterministic names and content, made once per run on the suite's disk; then a syncfs of
  the ext4 (untimed), so that the next workload does not pay for this one's writeback;
- re-read: every extracted file read to its end, warm (right after the extraction);
- SQLite: `apps_sqlite_commits` single-row INSERT transactions, WAL, synchronous=FULL;
- pgbench: a throwaway cluster (initdb and pg_ctl as `postgres`, a Unix socket only),
  `pgbench -i -s S`, then `pgbench -T T -c 4 -j 2` read-write (TPC-B-like) and select-only
  (`-S`);
- git clone: `git clone --no-hardlinks` of a bare clone of this repository, made once per
  run on the suite's disk; git status: the median of `apps_git_status_runs` runs in it.

Figures: seconds or a rate per workload; the daemon's CPU seconds (utime + stime of
/proc/PID/stat before and after) per workload and over the configuration's whole run, and
per file for the extraction, the re-read and the clone. A daemon that exits during a
workload fails the experiment: its figure would not be dhrd's. Ratios: the median over the
rounds of each round's dhrd figure against the plain directory's, oriented so that higher
is better.

pgbench is skipped, loudly, with the reason in the rows, the ratios and the notes, where
PostgreSQL is not installed or does not run on the plain directory (the first run of each
experiment is on it); a failure on a dhrd configuration after that fails the experiment.
The same holds for git where the suite does not run from a git repository. Never a figure
that was not measured.
"""

import io
import os
import pwd
import random
import re
import shutil
import subprocess
import tarfile
import time

import configs
import lib
from lib import BenchError, as_postgres, log, pg_tool, run

TITLE = "18. Small-file applications in fsync mode: the FUSE mount and the in-place mode vs a plain directory"
CONFIGS = ("plain", "dhrd-pagecache-fsync", "dhrd-attach-fsync")
BASELINE = "plain"
MOUNT, ATTACH = "dhrd-pagecache-fsync", "dhrd-attach-fsync"
# Archive layout: file sizes drawn from [FILE_MIN_BYTES, FILE_MAX_BYTES], FILES_PER_DIR files
# per directory, DIRS_PER_TOP directories under each top-level one; a fixed seed and mtime.
FILE_MIN_BYTES, FILE_MAX_BYTES = 1 << 10, 8 << 10
FILES_PER_DIR, DIRS_PER_TOP = 50, 20
ARCHIVE_SEED, ARCHIVE_MTIME = 33, 1_700_000_000
# Room on each configuration's ext4 beyond the extracted tree and the database: the clone
# and ext4's own metadata.
ROOM_SLACK_BYTES = 256 << 20
# A pgbench scale unit is about 15 MiB of tables and indexes; twice that for the WAL it writes.
PG_SCALE_BYTES = 32 << 20
# (key, what, higher is better, target of the FUSE mount (issue 33), of the in-place mode)
# The in-place mode keeps ext4's own speed for every operation (issue 31: >= 0.95x for the
# extraction, the re-read and SQLite); pgbench's 0.95x is issue 33's, for the mount as well.
FIGURES = (
    ("extract_s", "extracting an archive of {files} files of 1-8 KiB", False, 0.5, 0.95),
    ("reread_s", "reading them all again, warm", False, 0.5, 0.95),
    ("sqlite_commits_per_s", "SQLite commits, WAL, synchronous=full", True, 0.9, 0.95),
    ("pgbench_rw_tps", "pgbench read-write, 4 clients", True, 0.95, 0.95),
    ("pgbench_ro_tps", "pgbench select-only, 4 clients", True, 0.95, 0.95),
    ("git_clone_s", "git clone --no-hardlinks of a local repository ({git_files} files)", False, None, None),
    ("git_status_s", "git status in the clone", False, None, None),
)


def make_archive(path, nfiles):
    """Writes the archive of `nfiles` small files to `path`; returns the bytes of file data.
    Names, sizes, content and metadata depend on `nfiles` only, so every run extracts the
    same tree."""
    rng = random.Random(ARCHIVE_SEED)
    total, dirs = 0, set()
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(nfiles):
            d = f"tree/t{i // (FILES_PER_DIR * DIRS_PER_TOP):03d}/d{(i // FILES_PER_DIR) % DIRS_PER_TOP:02d}"
            for part in (d.rsplit("/", 1)[0], d):
                if part not in dirs:
                    dirs.add(part)
                    t.addfile(_tarinfo(part, tarfile.DIRTYPE, 0o755))
            size = rng.randint(FILE_MIN_BYTES, FILE_MAX_BYTES)
            info = _tarinfo(f"{d}/f{i:06d}.dat", tarfile.REGTYPE, 0o644)
            info.size = size
            t.addfile(info, io.BytesIO(rng.randbytes(size)))
            total += size
    return total


def _tarinfo(name, kind, mode):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, ARCHIVE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def git_source(ctx):
    """A bare clone of the repository the suite runs from, in the suite's workspace; returns
    (path, files in its HEAD, None) or (None, None, why not)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # The suite runs as root; the checkout may belong to someone else.
    git = ["git", "-c", "safe.directory=*"]
    if subprocess.run(git + ["-C", root, "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        return None, None, f"{root} is not a git repository"
    src = os.path.join(ctx.ws.disk, "apps-src.git")
    run(git + ["clone", "-q", "--bare", "--no-hardlinks", root, src], timeout=600)
    files = len(run(git + ["-C", src, "ls-tree", "-r", "--name-only", "HEAD"]).splitlines())
    return src, files, None


def pg_unavailable():
    """Why PostgreSQL cannot run here, or None."""
    missing = [t for t in ("pgbench", "runuser") if not shutil.which(t)]
    for t in ("initdb", "pg_ctl"):
        try:
            pg_tool(t)
        except BenchError:
            missing.append(t)
    if missing:
        return "not installed: " + ", ".join(missing) + " (package postgresql, scripts/install-deps.sh)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user (package postgresql)"
    return None


class Daemon:
    """CPU seconds of a configuration's daemon (None for the plain directory), and a check
    that it still runs."""

    def __init__(self, name, pid):
        self.name, self.pid = name, pid
        if name != BASELINE and not pid:
            raise BenchError(f"{name}: the daemon's pid is not known (`--daemon` prints it)")

    def cpu_s(self, what):
        if not self.pid:
            return None
        c = lib.proc_cpu_s(self.pid)
        if c is None:
            raise BenchError(f"{self.name}: the daemon {self.pid} exited (at {what})")
        return c

    def measure(self, what, fn):
        """Runs `fn`; returns (seconds, daemon CPU seconds or None, fn's result)."""
        c0 = self.cpu_s(what)
        t = time.monotonic()
        out = fn()
        secs = time.monotonic() - t
        c1 = self.cpu_s(what)
        return secs, (c1 - c0 if c0 is not None else None), out


def row(rnd, cfg, workload, secs, cpu_s, rate=None, unit=None, files=None, **extra):
    r = {"round": rnd, "config": cfg, "workload": workload, "secs": round(secs, 6), "rate": rate,
         "rate_unit": unit, "daemon_cpu_s": None if cpu_s is None else round(cpu_s, 2)}
    if files and cpu_s is not None:
        r["daemon_cpu_us_per_file"] = round(cpu_s / files * 1e6, 1)
    r.update(extra)
    return r


def files_workloads(ctx, d, dm, sync_root, rnd, art, figs):
    """Extraction, warm re-read and SQLite in `d`; returns their rows."""
    n = ctx.p["apps_files"]
    rows = []
    tree = os.path.join(d, "unpacked")
    os.makedirs(tree)
    secs, cpu, _ = dm.measure("extract", lambda: run(["tar", "-xf", art["archive"], "-C", tree], timeout=7200))
    figs["extract_s"] = secs
    rows.append(row(rnd, dm.name, "extract", secs, cpu, round(n / secs), "files/s", n))
    run(["sync", "-f", sync_root], timeout=600)
    secs, cpu, nbytes = dm.measure("re-read", lambda: lib.read_tree(tree))
    if nbytes != art["bytes"]:
        raise BenchError(f"{dm.name}: read back {nbytes} bytes of the archive's {art['bytes']}")
    figs["reread_s"] = secs
    rows.append(row(rnd, dm.name, "re-read", secs, cpu, round(n / secs), "files/s", n))
    commits = ctx.p["apps_sqlite_commits"]
    script = ("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);"
              + "".join(f"INSERT INTO t(v) VALUES('{'x' * 100}');" for _ in range(commits)))
    db = os.path.join(d, "bench.db")
    secs, cpu, _ = dm.measure("SQLite", lambda: subprocess.run(
        ["sqlite3", db], input=script, text=True, check=True, stdout=subprocess.DEVNULL, timeout=3600))
    figs["sqlite_commits_per_s"] = commits / secs
    rows.append(row(rnd, dm.name, "SQLite", secs, cpu, round(commits / secs, 1), "commits/s"))
    return rows


def pgbench(ctx, d, dm, rnd, figs):
    """A throwaway PostgreSQL cluster in `d`: pgbench's tables, then a read-write and a
    select-only run of 4 clients; returns their rows."""
    p = ctx.p
    pw = pwd.getpwnam("postgres")
    pgdata = os.path.join(d, "pgdata")
    # The socket and the server log live outside the configuration (and a socket path
    # must stay short).
    sock = os.path.join(ctx.ws.disk, "apps-pgsock")
    for x in (pgdata, sock):
        os.makedirs(x, exist_ok=True)
        os.chown(x, pw.pw_uid, pw.pw_gid)
    os.chmod(pgdata, 0o700)
    pglog = os.path.join(sock, "postgres.log")
    port = str(40000 + os.getpid() % 20000)
    pg_ctl = pg_tool("pg_ctl")
    as_postgres([pg_tool("initdb"), "-D", pgdata, "-A", "trust", "-U", "postgres", "--no-sync"], timeout=600)
    opts = (f"-k {sock} -p {port} -c listen_addresses='' -c shared_buffers={p['apps_pg_shared_buffers']} "
            f"-c max_wal_size={p['apps_pg_max_wal']}")
    rows, started = [], False
    try:
        as_postgres([pg_ctl, "-D", pgdata, "-l", pglog, "-o", opts, "-w", "-t", "300", "start"], timeout=400)
        started = True
        conn = ["-h", sock, "-p", port, "-U", "postgres"]
        run(["pgbench", "-i", "-q", "-s", str(p["apps_pg_scale"])] + conn + ["postgres"], timeout=3600)
        for key, what, flags in (("pgbench_rw_tps", "pgbench read-write", []),
                                 ("pgbench_ro_tps", "pgbench select-only", ["-S"])):
            secs, cpu, out = dm.measure(what, lambda: run(
                ["pgbench", "-T", str(p["apps_pg_secs"]), "-c", "4", "-j", "2"] + flags + conn + ["postgres"],
                timeout=p["apps_pg_secs"] * 4 + 600))
            m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
            if not m:
                raise BenchError(f"{dm.name}: {what}: no tps in {out[-800:]}")
            figs[key] = float(m.group(1))
            rows.append(row(rnd, dm.name, what, secs, cpu, round(figs[key], 1), "TPS", scale=p["apps_pg_scale"]))
    finally:
        if started:
            # Thrown away with the file system: no shutdown checkpoint.
            as_postgres([pg_ctl, "-D", pgdata, "-m", "immediate", "-w", "-t", "120", "stop"], check=False,
                        timeout=300)
        if os.path.exists(pglog):
            shutil.copy(pglog, os.path.join(ctx.out, "logs", f"apps-{dm.name}-round{rnd}-postgres.log"))
        shutil.rmtree(sock, ignore_errors=True)
    return rows


def git_workloads(ctx, d, dm, rnd, art, figs):
    """A clone of the local repository into `d`, then `git status` in it; returns their rows."""
    clone = os.path.join(d, "clone")
    secs, cpu, _ = dm.measure("git clone", lambda: run(
        ["git", "clone", "-q", "--no-hardlinks", art["git_src"], clone], timeout=3600))
    figs["git_clone_s"] = secs
    rows = [row(rnd, dm.name, "git clone", secs, cpu, round(art["git_files"] / secs), "files/s",
                art["git_files"])]
    runs = []
    for _ in range(ctx.p["apps_git_status_runs"]):
        runs.append(dm.measure("git status", lambda: run(["git", "-C", clone, "status", "--porcelain"]))[:2])
    secs = lib.median([s for s, _ in runs])
    cpus = [c for _, c in runs if c is not None]
    figs["git_status_s"] = secs
    rows.append(row(rnd, dm.name, "git status", secs, lib.median(cpus) if cpus else None,
                    runs=len(runs)))
    return rows


def make_config(jws, name):
    if name == MOUNT:
        # PostgreSQL runs as another user than the daemon's.
        return configs.Dhrd(jws, "pagecache", "fsync", extra=["--allow-other"])
    return configs.file_configs(jws, [name])[0]


def one_config(ctx, name, rnd, art, skips):
    """All workloads on configuration `name` on a fresh journalled ext4; returns its rows and
    figures. A pgbench failure on the plain directory before any success sets skips["pgbench"]."""
    p = ctx.p
    room = art["bytes"] * 2 + p["apps_pg_scale"] * PG_SCALE_BYTES + lib.parse_size(p["apps_pg_max_wal"]) \
        + ROOM_SLACK_BYTES
    rows, figs = [], {}
    with configs.JournaledDisk(ctx.ws, "apps-disk", room) as jws:
        cfg = make_config(jws, name)
        log(f"[18 apps] round {rnd} {name}: start")
        try:
            cfg.start({})
            dm = Daemon(name, getattr(cfg, "pid", None))
            t0, c0 = time.monotonic(), dm.cpu_s("start")
            rows += files_workloads(ctx, cfg.dir, dm, jws.disk, rnd, art, figs)
            if not skips.get("pgbench"):
                try:
                    rows += pgbench(ctx, cfg.dir, dm, rnd, figs)
                    art["pg_ran"] = True
                except BenchError as e:
                    if name != BASELINE or art.get("pg_ran"):
                        raise
                    skips["pgbench"] = f"PostgreSQL did not run on the plain directory: {str(e)[-600:]}"
                    log(f"[18 apps] pgbench SKIPPED: {skips['pgbench']}")
            if not skips.get("git"):
                rows += git_workloads(ctx, cfg.dir, dm, rnd, art, figs)
            c1 = dm.cpu_s("the end")
            rows.append(row(rnd, name, "whole run", time.monotonic() - t0, None if c0 is None else c1 - c0))
        finally:
            cfg.stop()
    for r in rows:
        log(f"[18 apps] round {rnd} {name} {r['workload']}: {r['secs']:.2f} s"
            + (f", {r['rate']} {r['rate_unit']}" if r.get("rate") is not None else "")
            + (f", daemon CPU {r['daemon_cpu_s']} s" if r.get("daemon_cpu_s") is not None else ""))
    return rows, figs


def ratios_of(figs, names, skips, p, git_files):
    """The median over rounds of each round's ratio against the plain directory."""
    out = []
    for cfg in (MOUNT, ATTACH):
        if cfg not in names or BASELINE not in names:
            continue
        for key, what, higher, t_mount, t_attach in FIGURES:
            target = t_mount if cfg == MOUNT else t_attach
            text = what.format(files=p["apps_files"], git_files=git_files)
            skip = skips.get("pgbench" if key.startswith("pgbench") else "git" if key.startswith("git") else "")
            per_round = []
            for rnd in range(p["apps_rounds"]):
                a, b = figs.get((rnd, cfg), {}).get(key), figs.get((rnd, BASELINE), {}).get(key)
                if a and b:
                    per_round.append(a / b if higher else b / a)
            v = lib.median(per_round)
            out.append({"what": f"{text}, fsync mode vs a plain directory"
                                + (f" (target >= {target:g})" if target else "")
                                + (f": SKIPPED, {skip}" if skip else ""),
                        "figure": cfg, "baseline": "plain directory", "value": None if v is None else round(v, 3),
                        "key": key,
                        **({"target": f">= {target:g}x"} if target else {})})
    return out


def summary_of(rows, names, skips):
    """Per configuration, the median over rounds of each workload's figures ("skipped" for a
    workload that did not run)."""
    out = []
    for cfg in names:
        s = {"config": cfg}
        for wl, key, field in (("extract", "extract_s", "secs"), ("re-read", "reread_s", "secs"),
                               ("SQLite", "sqlite_commits_per_s", "rate"),
                               ("pgbench read-write", "pgbench_rw_tps", "rate"),
                               ("pgbench select-only", "pgbench_ro_tps", "rate"),
                               ("git clone", "git_clone_s", "secs"), ("git status", "git_status_s", "secs"),
                               ("extract", "extract_cpu_us_per_file", "daemon_cpu_us_per_file"),
                               ("re-read", "reread_cpu_us_per_file", "daemon_cpu_us_per_file"),
                               ("whole run", "run_cpu_s", "daemon_cpu_s")):
            s[key] = lib.median([r.get(field) for r in rows if r["config"] == cfg and r["workload"] == wl])
            if s[key] is None and skips.get(wl.split()[0]):
                s[key] = "skipped"
        out.append(s)
    return out


def exp_apps(ctx):
    p = ctx.p
    lib.need_tools(["tar", "sqlite3", "git", "sync"])
    names = ctx.pick(CONFIGS)
    if not names:
        raise BenchError("apps: --configs keeps none of " + ", ".join(CONFIGS))
    art = {"archive": os.path.join(ctx.ws.disk, "apps-archive.tar")}
    art["bytes"] = make_archive(art["archive"], p["apps_files"])
    skips = {"pgbench": pg_unavailable()}
    art["git_src"], art["git_files"], skips["git"] = git_source(ctx)
    for what, why in skips.items():
        if why:
            log(f"[18 apps] {what} SKIPPED: {why}")
    rows, figs = [], {}
    try:
        for rnd in range(p["apps_rounds"]):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                r, f = one_config(ctx, name, rnd, art, skips)
                rows += r
                figs[(rnd, name)] = f
    finally:
        os.unlink(art["archive"])
        if art["git_src"]:
            shutil.rmtree(art["git_src"], ignore_errors=True)
    for what, why in skips.items():
        if why:
            for rnd in range(p["apps_rounds"]):
                rows += [{"round": rnd, "config": c, "workload": what, "skipped": why} for c in names]
    notes = [f"{what.upper()} SKIPPED: {why}" for what, why in skips.items() if why]
    notes += [
        "Each configuration runs on a fresh journalled ext4 (a direct-I/O loop device over a preallocated "
        "image on the disk under test, as in experiment 4), made for it in every round; the plain directory "
        "and the dhrd backing are directories of it. Every configuration is durable at fsync.",
        "The extraction is `tar -xf` alone (no fsync, as tar does); a syncfs of the ext4 follows, untimed. "
        "The re-read reads every file to its end right after it, warm.",
        "Daemon CPU: utime + stime of the daemon's /proc/PID/stat (every thread) around each workload; "
        "'whole run' from after the start to before the stop. Clock ticks of 10 ms bound its precision.",
        f"pgbench: PostgreSQL {pg_version()} as the postgres user, shared_buffers "
        f"{p['apps_pg_shared_buffers']}, max_wal_size {p['apps_pg_max_wal']}, fsync on; `pgbench -i -s "
        f"{p['apps_pg_scale']}`, then `pgbench -T {p['apps_pg_secs']} -c 4 -j 2` and the same with `-S`.",
    ]
    return {
        "title": TITLE,
        "scaling": f"issue 33: about 22,000 files (300 MB); here {p['apps_files']} files of 1-8 KiB "
                   f"({art['bytes'] / (1 << 20):.1f} MiB), "
                   f"{p['apps_sqlite_commits']} SQLite commits, pgbench scale {p['apps_pg_scale']} for "
                   f"{p['apps_pg_secs']} s per run, {p['apps_git_status_runs']} git status runs; "
                   f"{p['apps_rounds']} round(s), the order rotating",
        "rows": rows,
        "summary": summary_of(rows, names, skips),
        "ratios": ratios_of(figs, names, skips, p, art["git_files"]),
        "notes": notes,
    }


def pg_version():
    try:
        return run(["pgbench", "--version"], check=False).split()[-3]
    except (BenchError, IndexError):
        return "?"
