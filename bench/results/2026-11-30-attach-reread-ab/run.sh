#!/usr/bin/env bash
# Extract the suite's 20,000-file archive, then read it all again, into a plain directory and into
# `dhrd attach --durability fsync` of one, alternating, each on a fresh journalled ext4 (loop
# device, direct I/O). Prints the extraction and re-read times and the daemon's CPU ticks in each.
#   sudo ROUNDS=6 bench/results/2026-11-30-attach-reread-ab/run.sh   (release build of 5ee5d37)
set -euo pipefail
DHRD=${DHRD:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/dhrd}
ROUNDS=${ROUNDS:-5}
W=/var/tmp/reread; mkdir -p $W
[ -f $W/a.tar ] || (cd "$(dirname "$0")/../../suite" && python3 -c "import apps; apps.make_archive('$W/a.tar', 20000)")
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
one() {
  local cfg=$1
  truncate -s 1G $W/img; rm -f $W/img; truncate -s 1G $W/img
  mkfs.ext4 -q -F $W/img; mkdir -p $W/fs
  local loop; loop=$(losetup --direct-io=on -f --show $W/img)
  mount $loop $W/fs; mkdir $W/fs/d
  sync; echo 3 > /proc/sys/vm/drop_caches
  local pid=""
  if [ $cfg = attach ]; then
    $DHRD attach --daemon --durability fsync $W/fs/d >/dev/null 2>&1
    pid=$(pgrep -f "dhrd attach.*$W/fs/d" | head -1)
  fi
  local t0 t1 t2 c0 c1 c2
  c0=$([ -n "$pid" ] && ticks $pid || echo 0)
  t0=$(date +%s.%N); tar -xf $W/a.tar -C $W/fs/d; t1=$(date +%s.%N)
  c1=$([ -n "$pid" ] && ticks $pid || echo 0)
  local rr; rr=$(python3 -c "
import os,time
t=time.monotonic()
for d,_,fs in os.walk('$W/fs/d'):
  for f in fs:
    with open(os.path.join(d,f),'rb') as h:
      while h.read(1<<20): pass
print(time.monotonic()-t)
")
  t2=$(date +%s.%N)
  c2=$([ -n "$pid" ] && ticks $pid || echo 0)
  printf "%s extract %.3f reread %.3f daemon_ticks extract %d reread %d\n" $cfg $(echo "$t1-$t0"|bc) $rr $((c1-c0)) $((c2-c1))
  [ $cfg = attach ] && $DHRD detach $W/fs/d >/dev/null 2>&1
  umount $W/fs; losetup -d $loop; rm -f $W/img
}
for r in $(seq 1 $ROUNDS); do
  if [ $((r%2)) = 1 ]; then one plain; one attach; else one attach; one plain; fi
done
