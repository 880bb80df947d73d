#!/bin/bash
set -u
B=/var/tmp/w6; D=/work/main/target/release/dhrd
one() { sync; echo 3 > /proc/sys/vm/drop_caches
  $D mount --daemon -q "$@" $B/back $B/mnt 2>/dev/null || exit 1
  while ! $D status $B/mnt 2>/dev/null | grep -q "complete after"; do sleep 0.05; done
  $D status $B/mnt | grep -o 'complete after [0-9.]* s'; $D umount $B/mnt; }
vt() { sync; echo 3 > /proc/sys/vm/drop_caches; t0=$(date +%s.%N); vmtouch -tq $B/back/f; t1=$(date +%s.%N); echo "vmtouch $(echo "$t1-$t0" | bc | cut -c1-5) s"; }
for r in 1 2 3; do echo "round $r: pinned $(one) | no-pin $(one --no-pin) | loader-threads 8 $(one --loader-threads 8) | $(vt)"; done
