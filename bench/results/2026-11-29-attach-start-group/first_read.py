#!/usr/bin/python3
"""One cold attach: drop caches, `dhrd attach DIR --daemon`, open and read 4 KiB of
DIR/w/f0; prints the three times, waits for the warm-up, detaches.
Usage: first_read.py DHRD_BINARY DIR [durability]"""
import json, os, subprocess, sys, time

dhrd, d = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "fsync"
os.sync()
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
t0 = time.monotonic()
subprocess.run([dhrd, "attach", d, "--daemon", "--quiet", "--durability", mode], check=True,
               capture_output=True)
t1 = time.monotonic()
fd = os.open(f"{d}/w/f0", os.O_RDONLY)
t2 = time.monotonic()
os.pread(fd, 4096, 0)
t3 = time.monotonic()
os.close(fd)
print(f"attach returned {1000 * (t1 - t0):.1f} ms, open {1000 * (t2 - t1):.2f} ms, "
      f"read {1000 * (t3 - t2):.2f} ms, total {1000 * (t3 - t0):.1f}", flush=True)
while not json.loads(subprocess.run([dhrd, "status", d, "--json"], capture_output=True,
                                    text=True).stdout)["load"]["complete"]:
    time.sleep(0.05)
subprocess.run([dhrd, "detach", d], check=True, capture_output=True)
