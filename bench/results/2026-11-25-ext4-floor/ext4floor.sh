#!/bin/bash
# ext4's own floor for synchronous writes on this disk, no FUSE: video-style 1 MiB extending
# writes of a new file, and 8 writers on 8 files, sync flag vs O_DSYNC vs O_DIRECT+O_DSYNC.
set -u
D=/var/tmp/ext4floor; rm -rf $D; mkdir -p $D; cd $D
echo "== 1 GiB new file, 1 MiB writes"
for round in 1 2; do
for mode in dsync direct-dsync syncflag fsync-end overwrite-syncflag overwrite-direct-dsync; do
  rm -f f; sync; echo 3 > /proc/sys/vm/drop_caches
  case $mode in
    dsync) args="oflag=dsync";;
    direct-dsync) args="oflag=direct,dsync";;
    syncflag) touch f; chattr +S f; args="conv=notrunc";;
    fsync-end) args="conv=fsync";;
    overwrite-syncflag) dd if=/dev/zero of=f bs=1M count=1024 conv=fsync status=none; chattr +S f; args="conv=notrunc";;
    overwrite-direct-dsync) dd if=/dev/zero of=f bs=1M count=1024 conv=fsync status=none; args="conv=notrunc oflag=direct,dsync";;
  esac
  t0=$(date +%s.%N)
  dd if=/dev/zero of=f bs=1M count=1024 $args status=none
  t1=$(date +%s.%N)
  echo "round $round $mode: $(echo "1024/($t1-$t0)" | bc -l | cut -c1-7) MiB/s"
done; done
rm -f f
echo "== 4 KiB random sync writes, 8 jobs on 8 files of 256 MiB, 10 s"
for round in 1 2; do
for mode in direct-dsync dsync syncflag; do
  rm -f j.*; 
  for i in 0 1 2 3 4 5 6 7; do fallocate -l 256M j.$i.0; dd if=/dev/zero of=j.$i.0 bs=1M count=256 conv=notrunc,fsync status=none; done
  case $mode in
    direct-dsync) a="--direct=1 --sync=dsync";;
    dsync) a="--sync=dsync";;
    syncflag) for i in 0 1 2 3 4 5 6 7; do chattr +S j.$i.0; done; a="";;
  esac
  # fio names files jobname.N.0
  iops=$(fio --name=j --directory=$D --numjobs=8 --size=256M --rw=randwrite --bs=4k --ioengine=psync $a \
     --time_based --runtime=10 --group_reporting --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))')
  echo "round $round 8 files $mode: $iops IOPS"
done; done
rm -rf $D
