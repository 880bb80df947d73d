#!/bin/bash
# per-phase metaops, sync: syncdirsync / flags / attach, alternating
set -u
dhrd=/work/main/target/release/dhrd; bench=/work/main/target/release/dhrd-bench
work=/var/tmp/mp; mkdir -p $work; N=${N:-20000}; R=${R:-3}
one() {
  cfg=$1
  rm -f $work/img; fallocate -l $((3<<30)) $work/img
  loop=$(losetup --find --show --direct-io=on $work/img)
  mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 $loop
  mkdir -p $work/fs; mount $loop $work/fs; mkdir $work/fs/d
  pid=""
  case $cfg in
    syncdirsync) mount -o remount,sync $work/fs ;;
    flags) chattr +S +D $work/fs/d ;;
    attach*) b=$dhrd; [ $cfg = attachB ] && b=${B:-$dhrd}; pid=$($b attach $work/fs/d --daemon --quiet --durability sync 2>&1 | grep -o 'daemon [0-9]*' | grep -o '[0-9]*') ;;
  esac
  c0=0; [ -n "$pid" ] && c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$($bench metaops --dir $work/fs/d --threads 1 --files-per-thread $N 2>/dev/null)
  c1=0; [ -n "$pid" ] && c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  echo "$out" | python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); p=d["phases"]; print("'$cfg'", int(d["ops_per_sec"]), " ".join("%s=%d/p50=%.0f/p99=%.0f" % (k, v["ops_per_sec"], v["p50_us"], v["p99_us"]) for k,v in p.items()), "cpu='$((c1-c0))'")'
  [ -n "$pid" ] && { $b detach $work/fs/d >/dev/null; while [ -e /proc/$pid ]; do sleep 0.05; done; }
  umount $work/fs; losetup -d $loop
}
cfgs=(${CFGS:-syncdirsync flags attach})
for r in $(seq $R); do for i in "${!cfgs[@]}"; do one ${cfgs[$(( (i + r - 1) % ${#cfgs[@]} ))]}; done; done
