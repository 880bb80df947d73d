#!/usr/bin/env bash
# Interleaved A/B of the mount's engine path (read-path direct): 4 KiB O_DIRECT randread and
# O_DIRECT|O_DSYNC randwrite, QD1, between two dhrd binaries.
set -euo pipefail
A=/work/wt/before/target/release/dhrd; B=/work/main/target/release/dhrd
W=/var/tmp/engab; rm -rf $W; mkdir -p $W/b $W/m
fio --name=fill --filename=$W/b/f.img --rw=write --bs=1M --size=512M --direct=1 >/dev/null
one() { local bin=$1 tag=$2
  $bin mount $W/b $W/m --quiet --read-path direct --durability sync --threads 8 --daemon >/dev/null 2>&1 || { $bin mount $W/b $W/m --quiet --read-path direct --durability sync --threads 8 >/dev/null 2>&1 & sleep 2; }
  for i in $(seq 100); do mountpoint -q $W/m && break; sleep 0.1; done
  cat $W/m/f.img > /dev/null
  r=$(fio --name=r --filename=$W/m/f.img --rw=randread --bs=4k --direct=1 --ioengine=psync --time_based --runtime=5 --size=512M --output-format=json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
  w=$(fio --name=w --filename=$W/m/f.img --rw=randwrite --bs=4k --direct=1 --sync=dsync --ioengine=psync --time_based --runtime=5 --size=512M --output-format=json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))')
  fusermount3 -u $W/m || umount -l $W/m; sleep 1
  echo "$tag randread=$r randwrite=$w"
}
for r in 1 2 3 4; do one $A before; one $B after; done
rm -rf $W
