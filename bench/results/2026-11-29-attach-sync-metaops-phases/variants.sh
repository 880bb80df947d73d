#!/bin/bash
# metaops sync: attach with several binaries, alternating. usage: N=.. R=.. ab.sh name=BIN ...
set -u
bench=/work/main/target/release/dhrd-bench
work=/var/tmp/mpab; mkdir -p $work; N=${N:-10000}; R=${R:-3}
one() {
  name=${1%%=*}; b=${1#*=}
  rm -f $work/img; fallocate -l $((3<<30)) $work/img
  loop=$(losetup --find --show --direct-io=on $work/img)
  mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 $loop
  mkdir -p $work/fs; mount $loop $work/fs; mkdir $work/fs/d
  pid=""
  if [ "$b" = syncdirsync ]; then mount -o remount,sync $work/fs; else pid=$($b attach $work/fs/d --daemon --quiet --durability sync 2>&1 | grep -o 'daemon [0-9]*' | grep -o '[0-9]*'); fi
  c0=0; [ -n "$pid" ] && c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$($bench metaops --dir $work/fs/d --threads 1 --files-per-thread $N 2>/dev/null)
  c1=0; [ -n "$pid" ] && c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  echo "$out" | python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); p=d["phases"]; print("'$name'", int(d["ops_per_sec"]), " ".join("%s=%d/p50=%.0f/p99=%.0f" % (k, v["ops_per_sec"], v["p50_us"], v["p99_us"]) for k,v in p.items()), "cpu='$((c1-c0))'")'
  [ -n "$pid" ] && { $b detach $work/fs/d >/dev/null 2>&1; while [ -e /proc/$pid ]; do sleep 0.05; done; }
  umount $work/fs; losetup -d $loop
}
cfgs=("$@")
for r in $(seq $R); do for i in "${!cfgs[@]}"; do one "${cfgs[$(( (i + r - 1) % ${#cfgs[@]} ))]}"; done; done
