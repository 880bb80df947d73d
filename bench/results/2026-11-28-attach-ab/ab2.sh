#!/bin/bash
# Interleaved rounds: design (a) attach of the fs root (remount sync), design (b) attach of a
# subdirectory (inode flags + watch), and the reference mount -o sync; then fsync mode:
# plain directory, attach --durability fsync of the root (fs mark) and of a subdirectory.
D=/work/wt/attach/target/debug/dhrd
cd /var/tmp/attx
R=${1:-5}
one() { # label dir threads n: app rate, app CPU per file, daemon CPU per file
  P=$(pgrep -f "dhrd attach" | head -1)
  d0=0; [ -n "$P" ] && d0=$(awk '{print $14+$15}' /proc/$P/stat)
  out=$(./meta $2 $3 $4)
  d1=0; [ -n "$P" ] && d1=$(awk '{print $14+$15}' /proc/$P/stat)
  echo "$1 $3t $out daemon $(( (d1 - d0) * 10000 / ($3 * $4) )) us-cpu/file"
}
for r in $(seq $R); do
  mkdir -p m/ab
  # reference: the kernel's own sync mount, no daemon
  python3 remount.py m sync >/dev/null; one ref-sync m/ab 1 300; one ref-sync m/ab 8 100; python3 remount.py m async >/dev/null
  $D attach m --quiet --daemon >/dev/null 2>&1; one a-root-sync m/ab 1 300; one a-root-sync m/ab 8 100; $D detach m >/dev/null 2>&1
  $D attach m/ab --quiet --daemon >/dev/null 2>&1; one b-flags-sync m/ab 1 300; one b-flags-sync m/ab 8 100; $D detach m/ab >/dev/null 2>&1
  one plain-async m/ab 1 3000; one plain-async m/ab 8 1000
  $D attach m --quiet --daemon --durability fsync >/dev/null 2>&1; one root-fsync m/ab 1 3000; one root-fsync m/ab 8 1000; $D detach m >/dev/null 2>&1
  $D attach m/ab --quiet --daemon --durability fsync >/dev/null 2>&1; one sub-fsync m/ab 1 3000; one sub-fsync m/ab 8 1000; $D detach m/ab >/dev/null 2>&1
done
