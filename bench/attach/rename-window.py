#!/usr/bin/env python3
"""How long a file renamed into an attached directory (`sync` kept by inode flags) goes
without its sync flag: the window docs/crash-model.md describes ("Windows of the flag
design"). Every 50 ms: write a 1-byte file in OUT (same file system, outside DIR), rename
it into DIR, and poll its flags (FS_IOC_GETFLAGS) every 0.2 ms until FS_SYNC_FL is set,
giving up after 5 s. Prints the count and the median, p90, p99 and maximum in ms. Run it
while a workload loads the directory to see the window under load.

    sudo python3 bench/attach/rename-window.py DIR OUT SECONDS
"""
import array
import fcntl
import os
import sys
import time

FS_IOC_GETFLAGS = 0x80086601
d, out, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
os.makedirs(out, exist_ok=True)
lat = []
t_end = time.time() + secs
i = 0
while time.time() < t_end:
    src = os.path.join(out, f"w{i}"); dst = os.path.join(d, f"w{i}")
    with open(src, "wb") as f: f.write(b"x")
    t0 = time.monotonic()
    os.rename(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    while True:
        buf = array.array('l', [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        if buf[0] & 0x8: break
        if time.monotonic() - t0 > 5: break
        time.sleep(0.0002)
    lat.append((time.monotonic() - t0) * 1000)
    os.close(fd); os.unlink(dst)
    i += 1
    time.sleep(0.05)
lat.sort()
q = lambda p: lat[min(len(lat)-1, int(p*len(lat)))]
print(f"renames={len(lat)} median_ms={q(0.5):.1f} p90_ms={q(0.9):.1f} p99_ms={q(0.99):.1f} max_ms={lat[-1]:.1f}")
