#!/usr/bin/python3
"""One cold `dhrd mount BACKING MNT --daemon`: time to return, then open and read 4 KiB of
MNT/w/f0; unmounts 2 s later. Usage: mount_once.py DHRD BACKING MNT"""
import os, sys, time, subprocess, json
dhrd, b, m = sys.argv[1], sys.argv[2], sys.argv[3]
os.sync(); open("/proc/sys/vm/drop_caches", "w").write("3")
t0 = time.monotonic()
subprocess.run([dhrd, "mount", b, m, "--daemon", "--quiet"], check=True, capture_output=True)
t1 = time.monotonic()
fd = os.open(f"{m}/w/f0", os.O_RDONLY); os.pread(fd, 4096, 0); t2 = time.monotonic(); os.close(fd)
print(f"mount returned {1000*(t1-t0):.1f} ms, open+read {1000*(t2-t1):.2f} ms, total {1000*(t2-t0):.1f}", flush=True)
time.sleep(2)
subprocess.run([dhrd, "umount", m], check=True, capture_output=True)
time.sleep(1)
