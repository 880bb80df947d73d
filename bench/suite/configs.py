"""The configurations the suite compares: dhrd and the tools users pick instead.

Each configuration turns a set of files (name -> size) into a directory holding those files
with the same incompressible content, ready for a workload, and undoes everything on
`stop()`. `durable` says what a completed write guarantees in that configuration, so the
report never compares a durable write with a volatile one without saying so.

| name | what | a write is durable |
|---|---|---|
| dhrd-pagecache | `dhrd mount` (sync durability) on its default data path: the backing files' page cache, passed through | on return |
| dhrd-<path> | `dhrd mount` (sync durability) on an engine path: direct, cached, passthrough | on return |
| dhrd-<path>-fsync | `dhrd mount --durability fsync` on that path | at fsync |
| dhrd-attach | `dhrd attach DIR` (sync durability) of a directory on the disk's ext4: the kernel serves DIR, the daemon pins its page cache | on return |
| dhrd-attach-fsync | `dhrd attach DIR --durability fsync` | at fsync |
| tmpfs | a tmpfs mount (RAM disk without durability) | never |
| tmpfs-copyback | tmpfs filled by `cp -a` from the disk, copied back at stop (log2ram's way) | at copy-back |
| ext4-fsync | the disk's ext4, buffered, fsync after every write, cold cache | on return |
| plain | a directory on the disk's file system, used as applications use it (their own fsyncs) | at fsync |
| ext4-buffered | the disk's ext4, buffered, no fsync (Filebench's default) | at writeback |
| ext4-direct | the disk's ext4 with O_DIRECT; writes O_DIRECT+O_DSYNC | on return |
| ext4-vmtouch | ext4 with the files preloaded by `vmtouch -t`; writes fsync'd | on return |
| ramdisk-ext4 | ext4 on a loop device over a tmpfs file (the papers' RAMDisk) | never |
| ext4-syncdirsync | ext4 mounted `sync,dirsync` on a loop device over a file on the disk | on return |
"""

import copy
import os
import re
import shutil
import subprocess
import time

import lib
from lib import BenchError, run


class Workspace:
    """Directories of one suite run: `disk` is on the disk under test."""

    def __init__(self, disk_dir, dhrd, dhrd_bench):
        self.disk = os.path.join(disk_dir, f"dhrd-suite.{os.getpid()}")
        self.dhrd = dhrd
        self.dhrd_bench = dhrd_bench
        self.src = os.path.join(self.disk, "src")
        os.makedirs(self.src, exist_ok=True)
        self._sources = {}

    def source(self, nbytes):
        """A file of `nbytes` incompressible bytes on the disk, made once per size."""
        p = self._sources.get(nbytes)
        if p is None:
            p = os.path.join(self.src, f"data-{nbytes}")
            lib.fill_file(p, nbytes)
            self._sources[nbytes] = p
        return p

    def cleanup(self):
        # Something left mounted by a failed step must be unmounted first, or the removal
        # would walk into it.
        for line in reversed(run(["findmnt", "-rno", "TARGET"], check=False).splitlines()):
            if line == self.disk or line.startswith(self.disk + "/"):
                run(["umount", "-l", line], check=False)
        for loop in run(["losetup", "-nO", "NAME,BACK-FILE"], check=False).splitlines():
            parts = loop.split(None, 1)
            if len(parts) == 2 and parts[1].startswith(self.disk + "/"):
                run(["losetup", "-d", parts[0]], check=False)
        shutil.rmtree(self.disk, ignore_errors=True)


def place(ws, root, files):
    """Copies the source data for `files` under `root`."""
    for rel, size in files.items():
        dst = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if size == 0:
            open(dst, "wb").close()
        else:
            run(["cp", "--sparse=never", ws.source(size), dst])


UNMOUNT_BUSY_WAIT_S = 10


def unmount_loop(mnt, loop):
    """Unmounts the file system at `mnt` and detaches its loop device `loop` (if any);
    returns None, the loop device a configuration holds afterwards. A busy file system is
    tried again for up to UNMOUNT_BUSY_WAIT_S: the kernel may let go of a file a moment
    after the process that held it is gone (a file released by a workqueue, as an
    io_uring's or a FUSE connection's are). Who holds it then goes to the log."""
    if is_mounted(mnt):
        t = time.monotonic()
        while subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
            if time.monotonic() - t > UNMOUNT_BUSY_WAIT_S:
                holders = run(["fuser", "-vm", mnt], check=False)
                raise BenchError(f"{mnt} still busy after {UNMOUNT_BUSY_WAIT_S} s: {holders}")
            time.sleep(0.1)
        waited = time.monotonic() - t
        if waited > 0.05:
            lib.log(f"unmount of {mnt} waited {waited:.2f} s for the file system to be free")
    if loop:
        run(["losetup", "-d", loop], check=False)
    return None


def wait_exit(pid, what):
    """Waits until process `pid` (if any) has exited, so that nothing it held stays open."""
    if pid:
        lib.wait_for(lambda: lib.process_gone(pid), lib.MOUNT_WAIT_S * 3, what, 0.01)


def is_mounted(path):
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


class Config:
    name = "?"
    durable = "?"
    # fio flags for reads and for writes in this configuration.
    fio_read = []
    fio_write = []
    # dhrd-bench workload flags (fsync after whole-file writes where the config is durable).
    workload_fsync = False

    def __init__(self, ws):
        self.ws = ws
        self.dir = None

    def start(self, files, room=0):
        """Creates `files` (name -> bytes); `room` is what the workload will add."""
        raise NotImplementedError

    def stop(self):
        pass

    def ram_bytes(self):
        """RAM held for the data right now (see experiment 7), or None."""
        return None

    def info(self):
        return {"name": self.name, "durable": self.durable}


class Dhrd(Config):
    def __init__(self, ws, read_path, durability="sync", extra=()):
        super().__init__(ws)
        self.read_path = read_path
        self.durability = durability
        self.extra = list(extra)
        self.name = f"dhrd-{read_path}" + ("" if durability == "sync" else f"-{durability}")
        self.durable = "on return" if durability == "sync" else "at fsync"
        self.workload_fsync = durability != "sync"
        self.backing = os.path.join(ws.disk, "dhrd-backing")
        self.mnt = os.path.join(ws.disk, "dhrd-mnt")
        self.pid = None

    def start(self, files, room=0, wait_loaded=True):
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        place(self.ws, self.backing, files)
        lib.drop_caches()
        self.mount()
        if wait_loaded:
            self.wait_loaded()
        self.dir = self.mnt

    def mount(self):
        out = subprocess.run(
            [self.ws.dhrd, "mount", self.backing, self.mnt, "--daemon", "--quiet",
             "--read-path", self.read_path, "--durability", self.durability] + self.extra,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=lib.MOUNT_WAIT_S,
        )
        if out.returncode != 0:
            raise BenchError(f"dhrd mount failed: {out.stdout.strip()}")
        m = re.search(r"daemon (\d+) serves", out.stdout)
        self.pid = int(m.group(1)) if m else None

    def mount_foreground(self):
        """Starts the daemon without waiting for anything; returns the process."""
        self.log = open(os.path.join(self.ws.disk, f"{self.name}.log"), "a")
        proc = subprocess.Popen(
            [self.ws.dhrd, "mount", self.backing, self.mnt, "--quiet", "--read-path", self.read_path,
             "--durability", self.durability] + self.extra, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = proc.pid
        return proc

    def status(self):
        return run([self.ws.dhrd, "status", self.mnt], check=False)

    def load_complete(self):
        return ", complete" in self.status()

    def wait_loaded(self):
        return lib.wait_for(self.load_complete, lib.LOAD_WAIT_S, f"{self.name} load", 0.05)

    def kill(self):
        """SIGKILL the daemon and remove its dead mount (the data stays on the backing)."""
        if self.pid:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
            lib.wait_for(lambda: not os.path.exists(f"/proc/{self.pid}"), lib.MOUNT_WAIT_S, "daemon exit", 0.01)
        run(["fusermount3", "-uz", self.mnt], check=False)
        self.pid = None

    def umount(self):
        if is_mounted(self.mnt):
            run([self.ws.dhrd, "umount", self.mnt], check=False, timeout=300)
            if is_mounted(self.mnt):
                run(["fusermount3", "-uz", self.mnt], check=False)
        # The daemon may still hold backing files after the mount is gone.
        wait_exit(self.pid, "dhrd mount daemon after unmount")
        self.pid = None

    def stop(self):
        self.umount()
        shutil.rmtree(self.backing, ignore_errors=True)
        self.dir = None

    def ram_bytes(self):
        """Daemon anonymous memory + its memfds' resident pages + backing page cache. (Not
        RssFile: on the page cache path it counts the daemon's pinning mappings of the
        backing files, whose pages the backing page cache counts already.)"""
        if not self.pid:
            return None
        st = lib.proc_status(self.pid)
        anon = st.get("RssAnon", 0)
        memfd = 0
        fd_dir = f"/proc/{self.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, fd)).startswith("/memfd:"):
                    memfd += lib.resident_bytes(os.path.join(fd_dir, fd))
            except OSError:
                continue
        return anon + memfd + lib.tree_resident_bytes(self.backing)


class DhrdAttach(Config):
    """`dhrd attach` of a directory on the disk: applications use the directory itself.
    On the suite's ext4 the directory is a subdirectory, so `sync` is kept by inode flags
    (docs/attach.md); `root=True` attaches the file system's root (the journalled disk of a
    fileserver run), where dhrd mounts it `sync`."""

    def __init__(self, ws, durability="sync", root=False):
        super().__init__(ws)
        self.durability = durability
        self.name = "dhrd-attach" + ("" if durability == "sync" else f"-{durability}")
        self.durable = "on return" if durability == "sync" else "at fsync"
        self.workload_fsync = durability != "sync"
        self.root = root
        self.path = ws.disk if root else os.path.join(ws.disk, "dhrd-attach")
        self.pid = None

    def start(self, files, room=0, wait_loaded=True):
        os.makedirs(self.path, exist_ok=True)
        place(self.ws, self.path, files)
        lib.drop_caches()
        self.attach()
        if wait_loaded:
            self.wait_loaded()
        self.dir = self.path

    def attach(self):
        out = subprocess.run(
            [self.ws.dhrd, "attach", self.path, "--daemon", "--quiet", "--durability", self.durability],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=lib.MOUNT_WAIT_S * 20,
        )
        if out.returncode != 0:
            raise BenchError(f"dhrd attach failed: {out.stdout.strip()}")
        m = re.search(r"daemon (\d+) holds", out.stdout)
        self.pid = int(m.group(1)) if m else None

    def status_json(self):
        import json
        return json.loads(run([self.ws.dhrd, "status", self.path, "--json"]))

    def load_complete(self):
        return bool(self.status_json()["load"]["complete"])

    def wait_loaded(self):
        return lib.wait_for(self.load_complete, lib.LOAD_WAIT_S, f"{self.name} warm-up", 0.05)

    def kill(self):
        """SIGKILL the daemon: the directory stays usable (the kernel serves it)."""
        if self.pid:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
            lib.wait_for(lambda: not os.path.exists(f"/proc/{self.pid}"), lib.MOUNT_WAIT_S, "daemon exit", 0.01)
        self.pid = None

    def detach(self):
        run([self.ws.dhrd, "detach", self.path], check=False, timeout=600)
        # `dhrd detach` returns once the control socket is gone, which the daemon removes
        # before it has closed the directory's files: a file system unmounted right after
        # would still be busy.
        wait_exit(self.pid, "dhrd attach daemon after detach")
        self.pid = None

    def stop(self):
        self.detach()
        if not self.root:
            shutil.rmtree(self.path, ignore_errors=True)
        self.dir = None

    def ram_bytes(self):
        """Daemon anonymous memory + the directory's page cache (the pinning mappings map
        those pages; not counted twice)."""
        if not self.pid:
            return None
        st = lib.proc_status(self.pid)
        return st.get("RssAnon", 0) + lib.tree_resident_bytes(self.path)


class Tmpfs(Config):
    name = "tmpfs"
    durable = "never"

    def __init__(self, ws, name=None):
        super().__init__(ws)
        if name:
            self.name = name
        self.mnt = os.path.join(ws.disk, f"{self.name}-mnt")

    def mount_tmpfs(self, nbytes):
        os.makedirs(self.mnt, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={nbytes + nbytes // 4 + (64 << 20)}", "tmpfs", self.mnt])

    def start(self, files, room=0):
        self.mount_tmpfs(sum(files.values()) + room)
        place(self.ws, self.mnt, files)
        self.dir = self.mnt

    def stop(self):
        if is_mounted(self.mnt):
            run(["umount", self.mnt])
        self.dir = None

    def ram_bytes(self):
        st = os.statvfs(self.mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize


class TmpfsCopyback(Tmpfs):
    """log2ram's way: the files live on the disk; at start they are copied into tmpfs, and
    at stop (or periodically) copied back. Durable only at copy-back."""

    durable = "at copy-back"

    def __init__(self, ws):
        super().__init__(ws, name="tmpfs-copyback")
        self.disk_dir = os.path.join(ws.disk, "copyback-disk")
        self.copy_in_s = None
        self.copy_back_s = None

    def start(self, files, room=0, cold=True):
        os.makedirs(self.disk_dir, exist_ok=True)
        place(self.ws, self.disk_dir, files)
        if cold:
            lib.drop_caches()
        self.mount_tmpfs(sum(files.values()) + room)
        t = time.monotonic()
        run(["cp", "-a", self.disk_dir + "/.", self.mnt])
        self.copy_in_s = time.monotonic() - t
        self.dir = self.mnt

    def copy_back(self):
        """Makes the tmpfs content durable on the disk, as log2ram does at shutdown."""
        t = time.monotonic()
        run(["rsync", "-a", "--delete", "--inplace", self.mnt + "/", self.disk_dir + "/"]
            if shutil.which("rsync") else ["cp", "-a", self.mnt + "/.", self.disk_dir])
        os.sync()
        self.copy_back_s = time.monotonic() - t
        return self.copy_back_s

    def stop(self):
        super().stop()
        shutil.rmtree(self.disk_dir, ignore_errors=True)


class Ext4(Config):
    """A directory on the disk's own file system (ext4 here)."""

    def __init__(self, ws, mode):
        super().__init__(ws)
        self.mode = mode
        self.name = f"ext4-{mode}"
        self.dir_path = os.path.join(ws.disk, f"ext4-{mode}")
        if mode == "fsync":
            self.durable = "on return"
            self.fio_write = ["--fsync=1"]
            self.workload_fsync = True
        elif mode == "buffered":
            self.durable = "at writeback"
        elif mode == "direct":
            self.durable = "on return"
            self.fio_read = ["--direct=1"]
            self.fio_write = ["--direct=1", "--sync=dsync"]
            self.workload_fsync = True
        elif mode == "vmtouch":
            self.durable = "on return"
            self.fio_write = ["--fsync=1"]
            self.workload_fsync = True
        else:
            raise BenchError(f"unknown ext4 mode {mode}")
        self.vmtouch_s = None

    def start(self, files, room=0):
        os.makedirs(self.dir_path, exist_ok=True)
        place(self.ws, self.dir_path, files)
        lib.drop_caches()
        if self.mode == "vmtouch":
            t = time.monotonic()
            run(["vmtouch", "-tq", self.dir_path])
            self.vmtouch_s = time.monotonic() - t
        self.dir = self.dir_path

    def stop(self):
        shutil.rmtree(self.dir_path, ignore_errors=True)
        self.dir = None

    def ram_bytes(self):
        return lib.tree_resident_bytes(self.dir_path)


class Plain(Config):
    """A directory on the disk's file system, used as it is: the applications' own fsyncs
    make their data durable, the guarantee of dhrd's `fsync` mode (the baseline of the
    applications experiment)."""

    name = "plain"
    durable = "at fsync"
    workload_fsync = True

    def __init__(self, ws):
        super().__init__(ws)
        self.dir_path = os.path.join(ws.disk, "plain")

    def start(self, files, room=0):
        os.makedirs(self.dir_path, exist_ok=True)
        place(self.ws, self.dir_path, files)
        # The same cold start as the dhrd configurations, which drop caches before they mount.
        lib.drop_caches()
        self.dir = self.dir_path

    def stop(self):
        shutil.rmtree(self.dir_path, ignore_errors=True)
        self.dir = None

    def ram_bytes(self):
        return lib.tree_resident_bytes(self.dir_path)


class RamdiskExt4(Config):
    """The papers' RAMDisk with a file system: ext4 on a loop device over a tmpfs file."""

    name = "ramdisk-ext4"
    durable = "never"
    # The image's slack for ext4 metadata and journal.
    IMAGE_SLACK_BYTES = 256 << 20

    def __init__(self, ws, name=None):
        super().__init__(ws)
        if name:
            self.name = name
        self.tmpfs = os.path.join(ws.disk, f"{self.name}-tmpfs")
        self.mnt = os.path.join(ws.disk, f"{self.name}-mnt")
        self.image = os.path.join(self.tmpfs, "image")
        self.loop = None

    def attach(self, nbytes):
        os.makedirs(self.tmpfs, exist_ok=True)
        img = nbytes + nbytes // 8 + self.IMAGE_SLACK_BYTES
        run(["mount", "-t", "tmpfs", "-o", f"size={img + (64 << 20)}", "tmpfs", self.tmpfs])
        with open(self.image, "wb") as f:
            f.truncate(img)
        self.loop = run(["losetup", "--find", "--show", self.image]).strip()

    def start(self, files, room=0):
        self.attach(sum(files.values()) + room)
        os.makedirs(self.mnt, exist_ok=True)
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.loop])
        run(["mount", self.loop, self.mnt])
        place(self.ws, self.mnt, files)
        self.dir = self.mnt

    def stop(self):
        self.loop = unmount_loop(self.mnt, self.loop)
        if is_mounted(self.tmpfs):
            run(["umount", self.tmpfs])
        self.dir = None

    def ram_bytes(self):
        st = os.statvfs(self.tmpfs)
        return (st.f_blocks - st.f_bfree) * st.f_frsize + lib.tree_resident_bytes(self.mnt)


class Ext4SyncDirsync(Config):
    """ext4 mounted `sync,dirsync`: every write and every directory change durable on return,
    the file-system-level equivalent of dhrd's sync mode. A loop device over a file on the
    disk under test, so no partition has to be given up for it."""

    name = "ext4-syncdirsync"
    durable = "on return"
    IMAGE_SLACK_BYTES = 512 << 20

    def __init__(self, ws):
        super().__init__(ws)
        self.image = os.path.join(ws.disk, "ext4-syncdirsync.img")
        self.mnt = os.path.join(ws.disk, "ext4-syncdirsync-mnt")
        self.loop = None

    def start(self, files, room=0):
        nbytes = sum(files.values()) + room
        with open(self.image, "wb") as f:
            # Allocated up front: the baseline should not pay for the host file system
            # allocating the image's blocks during the run.
            os.posix_fallocate(f.fileno(), 0, nbytes + nbytes // 4 + self.IMAGE_SLACK_BYTES)
        # Direct I/O on the backing file: the loop device's writes reach the disk instead of
        # the host file system's page cache, so a sync inside is a sync of the disk.
        self.loop = run(["losetup", "--find", "--show", "--direct-io=on", self.image]).strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.loop])
        os.makedirs(self.mnt, exist_ok=True)
        run(["mount", "-o", "sync,dirsync", self.loop, self.mnt])
        place(self.ws, self.mnt, files)
        run(["sync", "-f", self.mnt])
        lib.drop_caches()
        self.dir = self.mnt

    def stop(self):
        self.loop = unmount_loop(self.mnt, self.loop)
        if os.path.exists(self.image):
            os.unlink(self.image)
        self.dir = None

    def ram_bytes(self):
        return lib.tree_resident_bytes(self.mnt)


class JournaledDisk:
    """A fresh ext4 with its journal (mkfs's default, what users run) on a loop device with
    direct I/O over an image file on the disk under test, as a workspace whose `disk` is
    that file system. Why: the disk under test may carry an ext4 without a journal (these
    VMs' does), and a journal-less ext4 skips inodes freed in the last 30 s when it
    allocates one, scanning past them, so every create that follows deletes costs it up to
    40 times more (Postmark ran at a fifth of its rate on a journalled ext4). Metadata
    figures measured there compare against a baseline no user has. With one fresh file
    system per configuration, every configuration also starts from the same state.

    Use as a context manager; `ws` is the suite's workspace (sources stay on the disk)."""

    IMAGE_SLACK_BYTES = 512 << 20

    def __init__(self, ws, name, nbytes):
        self.ws = ws
        self.image = os.path.join(ws.disk, f"{name}.img")
        self.mnt = os.path.join(ws.disk, f"{name}-fs")
        self.nbytes = nbytes + nbytes // 4 + self.IMAGE_SLACK_BYTES
        self.loop = None

    def __enter__(self):
        with open(self.image, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, self.nbytes)
        self.loop = run(["losetup", "--find", "--show", "--direct-io=on", self.image]).strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.loop])
        os.makedirs(self.mnt, exist_ok=True)
        run(["mount", self.loop, self.mnt])
        jws = copy.copy(self.ws)
        jws.disk = self.mnt
        return jws

    def __exit__(self, *exc):
        self.loop = unmount_loop(self.mnt, self.loop)
        if os.path.exists(self.image):
            os.unlink(self.image)
        return False


def file_configs(ws, names):
    """Configurations by name (see the module table)."""
    out = []
    for n in names:
        if n in ("dhrd-attach", "dhrd-attach-fsync"):
            out.append(DhrdAttach(ws, "sync" if n == "dhrd-attach" else "fsync"))
        elif n.startswith("dhrd-"):
            parts = n.split("-")
            out.append(Dhrd(ws, parts[1], parts[2] if len(parts) > 2 else "sync"))
        elif n == "tmpfs":
            out.append(Tmpfs(ws))
        elif n == "tmpfs-copyback":
            out.append(TmpfsCopyback(ws))
        elif n == "ext4-syncdirsync":
            out.append(Ext4SyncDirsync(ws))
        elif n == "plain":
            out.append(Plain(ws))
        elif n.startswith("ext4-"):
            out.append(Ext4(ws, n[5:]))
        elif n == "ramdisk-ext4":
            out.append(RamdiskExt4(ws))
        else:
            raise BenchError(f"unknown configuration {n}")
    return out
