#!/bin/bash
# 8 sync writers on 8 files: the same cached backing files written directly (sync flag set)
# and through the mount, alternating.
set -u
B=/var/tmp/w8; D=/work/main/target/release/dhrd
mkdir -p $B/back $B/mnt
for i in 0 1 2 3 4 5 6 7; do [ -f $B/back/j.$i.0 ] || head -c 256M /dev/urandom > $B/back/j.$i.0; done; sync
sync; echo 3 > /proc/sys/vm/drop_caches
$D mount --daemon -q $B/back $B/mnt 2>/dev/null
while ! $D status $B/mnt 2>/dev/null | grep -q "complete after"; do sleep 0.2; done
lsattr $B/back/j.0.0 | cut -c1-22
f8() { fio --name=j --directory=$1 --numjobs=8 --size=256M --rw=randwrite --bs=4k --ioengine=psync $2 --time_based --runtime=8 --group_reporting --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'; }
for r in 1 2 3; do
  echo "round $r: backing directly (flag) $(f8 $B/back '') | through dhrd $(f8 $B/mnt '') | backing O_DIRECT+O_DSYNC $(f8 $B/back '--direct=1 --sync=dsync')"
done
if [ "${REC:-0}" = 1 ]; then
  perf record -a -g -o /tmp/exp/w8-direct.data -- fio --name=j --directory=$B/back --numjobs=8 --size=256M --rw=randwrite --bs=4k --ioengine=psync --time_based --runtime=5 >/dev/null 2>&1
  perf record -a -g -o /tmp/exp/w8-dhrd.data -- fio --name=j --directory=$B/mnt --numjobs=8 --size=256M --rw=randwrite --bs=4k --ioengine=psync --time_based --runtime=5 >/dev/null 2>&1
fi
$D umount $B/mnt
