#!/bin/bash
# Eight sync writers of one order-0 file with the sync flag: with no mapping of it, with
# an mlocked MAP_SHARED mapping held by another process (how a pin holds a file), and
# with an mlocked MAP_PRIVATE one. Usage: sudo RT=5 bash run.sh ROUNDS
set -u
ROUNDS=$1; RT=${RT:-5}; B=/var/tmp/mapab; mkdir -p $B
[ -f /dev/shm/pinab/src ] || dd if=/dev/urandom of=/dev/shm/pinab/src bs=1M count=1024 status=none
cp /dev/shm/pinab/src $B/f; chattr +S $B/f; cp /dev/shm/pinab/src $B/raw
o0() { python3 -c "
import os; fd=os.open('$B/f', os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.posix_fadvise(fd,0,0,os.POSIX_FADV_RANDOM)
while os.read(fd, 1<<20): pass"; }
fio_() { fio --name=x --filename=$1 --size=1G --rw=randwrite --bs=4k --numjobs=${J:-8} --ioengine=psync --time_based --runtime=$RT --group_reporting --randrepeat=0 --norandommap --invalidate=0 "${@:2}" --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(round(j['write']['iops']))"; }
for r in $(seq $ROUNDS); do
  line="r=$r raw $(fio_ $B/raw --direct=1 --sync=dsync)"
  for k in none shared private; do
    o0
    if [ $k != none ]; then python3 "$(dirname "$0")/holder.py" $B/f $k > /tmp/holder.out & hp=$!; until grep -q held /tmp/holder.out 2>/dev/null; do sleep 0.05; done; fi
    line="$line $k $(fio_ $B/f)"
    [ $k != none ] && { kill $hp; wait $hp 2>/dev/null; rm -f /tmp/holder.out; }
  done
  echo "$line"
done
rm -f $B/f $B/raw
