#!/bin/bash
set -u
B=/var/tmp/rr; D=/work/main/target/release/dhrd
mkdir -p $B/back $B/mnt
[ -f $B/back/f ] || { head -c 4G /dev/urandom > $B/back/f; sync; }
$D mount --daemon -q $B/back $B/mnt 2>/dev/null
while ! $D status $B/mnt 2>/dev/null | grep -q "complete after"; do sleep 0.2; done
mkdir -p /dev/shm/rr; [ -f /dev/shm/rr/f ] || cp $B/back/f /dev/shm/rr/f
fr() { fio --name=r --filename=$1 --rw=${RW:-randread} --bs=${BS:-4k} --ioengine=psync --time_based --runtime=5 --size=4G --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print("%.0f IOPS %.0f MiB/s %.2f us" % (j["iops"], j["bw"]/1024, j["clat_ns"]["mean"]/1000))'; }
for r in 1 2 3; do
 echo "round $r: tmpfs $(fr /dev/shm/rr/f) | ext4 direct $(fr $B/back/f) | dhrd $(fr $B/mnt/f)"
done
$D umount $B/mnt
