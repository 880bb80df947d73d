#!/bin/bash
W=/var/tmp/arena; B=/work/main/target/release/dhrd
for oc in 1024 64; do
  $B mount $W/b $W/m --quiet --object-cache $oc & sleep 1
  for i in $(seq 300); do $B status $W/m | grep -q complete && break; sleep 0.2; done
  pid=$(pgrep -f "dhrd mount $W/b" | head -1)
  grep -E "^(Rss|Anonymous|Shared|Private)" /proc/$pid/smaps_rollup | tr '\n' ' '; echo
  python3 -c "
for d in range(100):
    for i in range(1000):
        with open(f'$W/m/d{d}/f{i}','rb') as f: f.read()
"
  echo "object-cache $oc after read:"; grep -E "^(Rss|Anonymous|Shared|Private)" /proc/$pid/smaps_rollup | tr '\n' ' '; echo
  $B status $W/m | grep -E "load:|RAM:"
  $B umount $W/m; sleep 1
done
