#!/bin/bash
set -u
B=/var/tmp/vid; rm -rf $B; mkdir -p $B/back $B/mnt $B/plain; chattr +S $B/plain
D=/work/main/target/release/dhrd; DB=/work/main/target/release/dhrd-bench
v() { $DB video --dir $1 --bytes 1G --rounds 3 --fsync 2>/dev/null | python3 /tmp/exp/vparse.py; }
for r in 1 2; do
  echo "plain ext4 +S dir: $(v $B/plain)"
  $D mount --daemon -q $B/back $B/mnt; echo "dhrd default: $(v $B/mnt)"; $D umount $B/mnt
  $D mount --daemon -q --no-pin $B/back $B/mnt; echo "dhrd no-pin: $(v $B/mnt)"; $D umount $B/mnt
done
