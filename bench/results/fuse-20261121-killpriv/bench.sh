#!/bin/bash
# Interleaved A/B of dhrd-before (main 4833944) and dhrd-after (killpriv) 4 KiB random
# sync-mode writes, QD1, 1 job: --read-path cached as root and as nobody, and the default
# path as nobody (every write flagged FUSE_WRITE_KILL_SUIDGID -> one statx in "after").
# Usage: BIN_before=... BIN_after=... OUT=dir [ROUNDS=3] [RT=15] [RTD=8] [TMPFS=1] bench.sh
set -euo pipefail
ROUNDS=${ROUNDS:-3}; RT=${RT:-15}; RTD=${RTD:-8}; SIZE=256M
W=/var/tmp/kp-bench.$$; OUT=${OUT:?output directory}; mkdir -p $OUT
BIN_before=${BIN_before:?dhrd binary of the base commit}; BIN_after=${BIN_after:?dhrd binary to compare}
mkdir -p $W; chmod 755 $W
# TMPFS=1: backings on tmpfs, so no disk (noise) is involved: what remains is the FUSE
# round trips and the daemon's CPU time per write.
[ "${TMPFS:-0}" = 1 ] && mount -t tmpfs -o size=2G,mode=755 tmpfs $W
fio --name=fill --filename=$W/seed --rw=write --bs=1M --size=$SIZE --output=/dev/null
declare -A PIDS
cleanup() { for m in $W/mnt-*; do [ -d "$m" ] && { $BIN_after umount $m 2>/dev/null || fusermount3 -uz $m 2>/dev/null || true; }; done; wait 2>/dev/null || true; umount $W 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
for v in before after; do for rp in cached auto; do
  b=$W/backing-$v-$rp; m=$W/mnt-$v-$rp; mkdir -p $b $m; chmod 755 $b $m
  cp $W/seed $b/data; chown 65534:65534 $b/data; chmod 0666 $b/data
  BIN=BIN_$v; ${!BIN} mount $b $m --quiet --allow-other --read-path $rp &
  PIDS[$v-$rp]=$!
  for i in $(seq 200); do mountpoint -q $m && break; sleep 0.05; done
done; done
for m in $W/mnt-*; do $BIN_after status $m | sed -n 3p; done > $OUT/status.txt
sleep 5  # let the preload finish
COMMON="--ioengine=psync --iodepth=1 --bs=4k --size=$SIZE --rw=randwrite --numjobs=1 --time_based --group_reporting --randrepeat=0 --norandommap --output-format=json"
NB="setpriv --reuid=65534 --regid=65534 --clear-groups"
for r in $(seq $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for cfg in cached-root cached-nobody auto-nobody; do
    rp=${cfg%-*}; who=${cfg#*-}; rt=$RT; [ $rp = auto ] && rt=$RTD
    for v in $order; do
      pre=""; [ $who = nobody ] && pre=$NB
      echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) r$r $cfg $v" >> $OUT/runs.log
      # Daemon CPU (utime+stime, clock ticks) around the run: its cost per write, which
      # scheduling noise from other jobs affects far less than the IOPS.
      t0=$(awk '{print $14+$15}' /proc/${PIDS[$v-$rp]}/stat)
      $pre fio --name=w --filename=$W/mnt-$v-$rp/data --runtime=$rt $COMMON > $OUT/r$r-$cfg-$v.json
      t1=$(awk '{print $14+$15}' /proc/${PIDS[$v-$rp]}/stat)
      echo $((t1 - t0)) > $OUT/r$r-$cfg-$v.ticks
    done
  done
done
python3 - $OUT $ROUNDS <<'PY'
import json,sys,statistics as st
out,R=sys.argv[1],int(sys.argv[2])
import os
HZ=os.sysconf('SC_CLK_TCK')
def g(n):
    job=json.load(open(f'{out}/{n}.json'))['jobs'][0]
    j=job['write']
    ticks=int(open(f'{out}/{n}.ticks').read())
    ios=j['total_ios']
    rt=job['elapsed']
    fio_cpu=(job['usr_cpu']+job['sys_cpu'])/100*rt/ios*1e6
    return j['iops'], j['lat_ns']['mean']/1000, j['clat_ns']['percentile'].get('99.000000',0)/1000, ticks/HZ/ios*1e6, fio_cpu
for cfg in ['cached-root','cached-nobody','auto-nobody']:
    rows={v:[g(f'r{r}-{cfg}-{v}') for r in range(1,R+1)] for v in ['before','after']}
    for v in ['before','after']:
        x=rows[v]
        print(f"{cfg:14} {v:6}: IOPS median {st.median(a[0] for a in x):8.0f} per round {[round(a[0]) for a in x]}; mean lat median {st.median(a[1] for a in x):7.1f} us {[round(a[1],1) for a in x]}; p99 median {st.median(a[2] for a in x):.0f} us")
        print(f"{'':14} {v:6}: daemon CPU per write median {st.median(a[3] for a in x):5.1f} us {[round(a[3],1) for a in x]}; fio CPU per write median {st.median(a[4] for a in x):5.1f} us")
    rat=[rows['after'][i][0]/rows['before'][i][0] for i in range(R)]
    print(f"{cfg:14} after/before IOPS per round {[round(a,3) for a in rat]} median {st.median(rat):.3f}")
PY
