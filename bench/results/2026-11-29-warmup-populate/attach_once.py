#!/usr/bin/python3
"""One cold `dhrd attach --daemon --durability fsync` of DIR (files DIR/w/f0 and
DIR/w/f3): time to return, a 4 KiB read of f0 right after, then 4 KiB reads of f3 every
20 ms from its end backwards in 16 MiB steps while the warm-up runs (a reader of files
not yet warm), and the warm-up's time. Usage: attach_once.py DHRD DIR"""
import json, os, subprocess, sys, time

dhrd, d = sys.argv[1], sys.argv[2]
os.sync()
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
t0 = time.monotonic()
subprocess.run([dhrd, "attach", d, "--daemon", "--quiet", "--durability", "fsync"], check=True,
               capture_output=True)
t1 = time.monotonic()
fd = os.open(f"{d}/w/f0", os.O_RDONLY)
os.pread(fd, 4096, 0)
t2 = time.monotonic()
os.close(fd)
g = os.open(f"{d}/w/f3", os.O_RDONLY)
size = os.fstat(g).st_size
lat, i = [], 0
while True:
    st = json.loads(subprocess.run([dhrd, "status", d, "--json"], capture_output=True,
                                   text=True).stdout)
    if st["load"]["complete"]:
        break
    off = size - (i + 1) * (16 << 20)
    if off >= 0:
        t = time.monotonic()
        os.pread(g, 4096, off)
        lat.append(time.monotonic() - t)
    i += 1
    time.sleep(0.02)
os.close(g)
lat.sort()
probe = (f"reads of cold f3: n={len(lat)} median {1000 * lat[len(lat) // 2]:.2f} ms, "
         f"p90 {1000 * lat[int(len(lat) * 0.9)]:.1f} ms, max {1000 * lat[-1]:.1f} ms") if lat else "no reads"
print(f"attach {1000 * (t1 - t0):.0f} ms, first read {1000 * (t2 - t1):.1f} ms, "
      f"warm-up {st['warmup']['complete_after_s']:.2f} s, {probe}", flush=True)
subprocess.run([dhrd, "detach", d], check=True, capture_output=True)
