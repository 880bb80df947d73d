"""Experiment 15 (blockfs): seed 000's Figure 9 as the paper measured it, Filebench's
fileserver on a file system over the block device.

The paper ran Filebench's fileserver personality on XFS on top of each device (DBR DHRD,
DHRD, RAMDisk, SSD RAID-0) and reported DBR DHRD 28% and 54% above DHRD and the SSD
RAID-0. Experiment 4 runs the same workload (`dhrd-bench fileserver`, Filebench's
personality reimplemented) through the FUSE mount only; here it runs on one file system
(XFS, as in the paper, or ext4 where mkfs.xfs is missing) over each of:

- dhrd-nbd: `dhrd nbd` (RAM holds the whole export, every block write durable on return)
  on a preallocated image on the disk. There is no kernel nbd module here, so the export
  becomes a block device the way experiment 12 does it: `nbdfuse` exposes it as a file,
  `losetup --direct-io=on` makes that a block device (no second page cache);
- disk: the file system on a loop device with direct I/O over a preallocated image on the
  disk under test (the paper's SSD RAID-0; no raw disk is spare here);
- ramdisk: the file system on a loop device over a tmpfs file (the paper's RAMDisk);
- dhrd-mount: `dhrd mount` (the FUSE mount, default data path) with its backing directory
  on the disk's file system;
- dhrd-attach: `dhrd attach` of that file system's root (the in-place mode), where the
  `dhrd` binary has the command; otherwise the row says it is not available.

The FUSE mount and the in-place mode run with `--durability fsync`, so every row makes a
file durable exactly when the workload asks (ramdisk: never). Two modes: `buffered`
(Filebench's default: no fsync, what the paper ran) and `fsync` (fsync after every
whole-file write and append). Each configuration gets a fresh file system and runs both
modes on it, for each file count of the profile.
"""

import copy
import json
import os
import shutil
import subprocess

import configs
import lib
from lib import BenchError, log, run
from seed002 import Proc

M = 1 << 20
# XFS refuses file systems under 300 MiB (xfsprogs 5.19 on).
FS_BYTES_MIN = 512 * M
CONFIGS = ("dhrd-nbd", "disk", "ramdisk", "dhrd-mount", "dhrd-attach")
MODES = ("buffered", "fsync")
PAPER = "seed 000 Fig. 9"
TITLE = "15. Fileserver on a file system over the block device (Filebench, seed 000 Fig. 9)"


def fs_type():
    return "xfs" if shutil.which("mkfs.xfs") else "ext4"


class Undo:
    """Steps to undo, run in reverse; every one runs even when an earlier one fails."""

    def __init__(self):
        self.steps = []

    def push(self, what, f):
        self.steps.append((what, f))

    def close(self):
        errs = []
        for what, f in reversed(self.steps):
            try:
                f()
            except Exception as e:  # noqa: BLE001 - cleanup goes on; the errors are reported
                errs.append(f"{what}: {e}")
        self.steps = []
        if errs:
            raise BenchError("cleanup: " + "; ".join(errs))


def mkfs_mount(dev, mnt, fs, undo):
    if fs == "xfs":
        run(["mkfs.xfs", "-q", "-f", "-K", dev], timeout=600)
    else:
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev], timeout=600)
    os.makedirs(mnt, exist_ok=True)
    run(["mount", "-o", "noatime", dev, mnt])
    undo.push(f"umount {mnt}", lambda: run(["umount", mnt], timeout=600))


def loop_device(image, undo, direct):
    loop = run(["losetup", "--find", "--show"] + (["--direct-io=on"] if direct else []) + [image]).strip()
    undo.push(f"losetup -d {loop}", lambda: run(["losetup", "-d", loop]))
    return loop


def preallocated(path, nbytes, undo):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, nbytes)
    undo.push(f"rm {path}", lambda: os.path.exists(path) and os.unlink(path))


def fs_on_disk(ctx, name, nbytes, fs, undo):
    """The file system on a direct-I/O loop device over a preallocated image on the disk."""
    image = os.path.join(ctx.ws.disk, f"blockfs-{name}.img")
    preallocated(image, nbytes, undo)
    mnt = os.path.join(ctx.ws.disk, f"blockfs-{name}-fs")
    mkfs_mount(loop_device(image, undo, direct=True), mnt, fs, undo)
    return mnt


def fs_on_ram(ctx, nbytes, fs, undo):
    tmp = os.path.join(ctx.ws.disk, "blockfs-ram")
    os.makedirs(tmp, exist_ok=True)
    run(["mount", "-t", "tmpfs", "-o", f"size={nbytes + 64 * M}", "tmpfs", tmp])
    undo.push(f"umount {tmp}", lambda: run(["umount", tmp]))
    image = os.path.join(tmp, "image")
    with open(image, "wb") as f:
        f.truncate(nbytes)
    mnt = os.path.join(ctx.ws.disk, "blockfs-ramdisk-fs")
    mkfs_mount(loop_device(image, undo, direct=False), mnt, fs, undo)
    return mnt


def fs_on_dhrd_nbd(ctx, nbytes, fs, undo):
    """`dhrd nbd` -> nbdfuse -> loop (direct I/O) -> the file system."""
    d = os.path.join(ctx.ws.disk, "blockfs-nbd")
    os.makedirs(d, exist_ok=True)
    image, sock = os.path.join(d, "backing.img"), os.path.join(d, "nbd.sock")
    preallocated(image, nbytes, undo)
    server = Proc(ctx, "dhrd-nbd", [ctx.ws.dhrd, "nbd", "--backing", image, "--socket", sock],
                  lambda: os.path.exists(sock), "dhrd nbd socket", log_prefix="blockfs")
    undo.push("stop dhrd nbd", server.stop)
    lib.wait_for(lambda: "loaded" in open(server.logp).read(), lib.LOAD_WAIT_S, "dhrd nbd load", 0.05)
    dev = os.path.join(d, "export")
    open(dev, "w").close()  # nbdfuse mounts over a regular file
    pidfile = os.path.join(d, "nbdfuse.pid")
    fuse = Proc(ctx, "nbdfuse", ["nbdfuse", "-P", pidfile, dev, "--unix", sock],
                lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0, "nbdfuse", log_prefix="blockfs")

    def stop_fuse():
        run(["fusermount3", "-u", dev], check=False)
        fuse.stop(wait_s=30)

    undo.push("stop nbdfuse", stop_fuse)
    if os.path.getsize(dev) != nbytes:
        raise BenchError(f"nbdfuse shows {os.path.getsize(dev)} bytes of a {nbytes}-byte export")
    mnt = os.path.join(ctx.ws.disk, "blockfs-dhrd-nbd-fs")
    mkfs_mount(loop_device(dev, undo, direct=True), mnt, fs, undo)
    return mnt


def attach_available(ctx):
    """Why `dhrd attach` cannot run here, or None when it can."""
    p = subprocess.run([ctx.ws.dhrd, "attach", "--help"], capture_output=True, text=True)
    if p.returncode != 0:
        return "this dhrd has no `attach` command (the in-place mode)"
    if not hasattr(configs, "DhrdAttach"):
        return "dhrd has `attach`, but the suite has no DhrdAttach configuration yet (bench/suite/configs.py)"
    return None


def build(ctx, name, nbytes, fs, undo):
    """Sets configuration `name` up; returns (directory for the workload, when a file is
    durable in it)."""
    if name == "disk":
        return fs_on_disk(ctx, "disk", nbytes, fs, undo), "at fsync"
    if name == "ramdisk":
        return fs_on_ram(ctx, nbytes, fs, undo), "never"
    if name == "dhrd-nbd":
        return fs_on_dhrd_nbd(ctx, nbytes, fs, undo), "at fsync (each block write on return)"
    jws = copy.copy(ctx.ws)
    jws.disk = fs_on_disk(ctx, name, nbytes, fs, undo)
    if name == "dhrd-mount":
        cfg = configs.Dhrd(jws, "pagecache", durability="fsync")
    else:
        cfg = configs.DhrdAttach(jws, "fsync", root=True)
    cfg.start({}, room=nbytes // 2)
    undo.push(f"stop {name}", cfg.stop)
    return cfg.dir, "at fsync"


def fileserver(ctx, d, nfiles, fsync):
    p = ctx.p
    out = run([ctx.ws.dhrd_bench, "fileserver", "--dir", d, "--files", str(nfiles), "--threads", str(p["fs_threads"]),
               "--secs", str(p["fs_secs"]), "--mean-file-bytes", str(p["fs_mean_file_bytes"])]
              + (["--fsync"] if fsync else []), timeout=7200)
    return json.loads(out[out.index("{"):])


def run_config(ctx, name, nbytes, fs):
    """Both modes and every file count on one fresh file system over `name`."""
    rows = []
    undo = Undo()
    try:
        d, durable = build(ctx, name, nbytes, fs, undo)
        for mode in MODES:
            for nfiles in ctx.p["fs_files"]:
                r = fileserver(ctx, d, nfiles, mode == "fsync")
                rows.append({"config": name, "fs": fs, "mode": mode, "files": nfiles,
                             "durable": "never" if name == "ramdisk" else (durable if mode == "fsync" else
                                                                          "not asked (no fsync)"),
                             **{k: v for k, v in r.items() if not isinstance(v, (dict, list))}})
                log(f"[15 blockfs] {name} {mode} {nfiles} files: {r['ops_per_sec']:.0f} ops/s")
    finally:
        undo.close()
    return rows


RATIOS = (
    # figure, baseline, what, kind
    ("dhrd-nbd", "disk", "dhrd's block device vs the disk (the paper: DBR DHRD 1.54x SSD RAID-0)",
     "as the paper measured"),
    ("dhrd-nbd", "ramdisk", "dhrd's block device vs the RAM disk (the paper: the RAMDisk was best)",
     "as the paper measured"),
    ("dhrd-mount", "dhrd-nbd", "the FUSE mount vs a file system on dhrd's block device", "our own comparison"),
    ("dhrd-attach", "dhrd-nbd", "the in-place mode vs a file system on dhrd's block device", "our own comparison"),
    ("dhrd-attach", "disk", "the in-place mode vs the same file system without dhrd", "our own comparison"),
)


def exp_blockfs(ctx):
    p = ctx.p
    if not shutil.which("nbdfuse"):
        return {"title": TITLE, "skipped": "nbdfuse is not installed (scripts/install-deps.sh)"}
    fs = fs_type()
    nbytes = max(FS_BYTES_MIN, max(p["fs_files"]) * p["fs_mean_file_bytes"] * 3 + 256 * M)
    rows, failed = [], []
    for name in ctx.pick(CONFIGS):
        why = attach_available(ctx) if name == "dhrd-attach" else None
        if why:
            rows.append({"config": name, "fs": fs, "not_available": why})
            log(f"[15 blockfs] {name}: not available: {why}")
            continue
        log(f"[15 blockfs] {name}: start ({fs}, {lib.fmt_size(nbytes)})")
        try:
            rows += run_config(ctx, name, nbytes, fs)
        except BenchError as e:
            rows.append({"config": name, "fs": fs, "error": str(e)[:500]})
            failed.append(f"{name}: {e}")
    ratios = []
    for n in p["fs_files"]:
        for mode in MODES:
            for num, den, what, kind in RATIOS:
                a = next((r for r in rows if (r["config"], r.get("files"), r.get("mode")) == (num, n, mode)), None)
                b = next((r for r in rows if (r["config"], r.get("files"), r.get("mode")) == (den, n, mode)), None)
                if a and b and b.get("ops_per_sec"):
                    ratios.append({"what": f"{what}, {n} files, {mode}", "figure": num, "baseline": den,
                                   "value": round(a["ops_per_sec"] / b["ops_per_sec"], 3), "kind": kind,
                                   "paper": PAPER})
    if failed:
        raise BenchError("; ".join(failed))
    return {
        "title": TITLE,
        "paper": PAPER,
        "scaling": f"{fs} of {lib.fmt_size(nbytes)} per configuration; file counts {p['fs_files']} of "
                   f"{lib.fmt_size(p['fs_mean_file_bytes'])} mean (the paper: 32k-512k files of 128 KiB), "
                   f"{p['fs_threads']} threads (the paper: 50), {p['fs_secs']} s per point",
        "rows": rows,
        "ratios": ratios,
        "notes": [
            "dhrd-nbd is `dhrd nbd` through nbdfuse and a direct-I/O loop device (no kernel nbd module here): "
            "every block request crosses the loop device, FUSE and the NBD socket, a cost a kernel nbd client "
            "would cut; the file system's page cache sits above it, so metadata and buffered writes never "
            "reach dhrd until writeback or fsync.",
            "The paper's DHRD without DBR has no counterpart at the block level here (DBR is a read path of "
            "the FUSE mount's engine), so its 28% is not reproduced.",
            "dhrd-mount and dhrd-attach run with --durability fsync, so every row makes a file durable when "
            "the workload asks, as the disk does; in buffered mode nothing asks.",
        ],
    }
