#!/bin/bash
# Read-ahead policies on strided reads and on a real trace (WebSearch), HDD profile,
# RAM a quarter of a 1 GiB export, no prefill. Same invocation for all three policies.
set -u
D=${DHRD_RA_DIR:-/var/tmp/dhrd-ra}; BIN=${DHRD_BIN:-target/release}
mkdir -p $D; [ -f $D/data ] || head -c 1G /dev/urandom > $D/data
T=${DHRD_TRACE:-../shared/traces/websearch/WebSearch1.first24783.spc}
for round in 1; do
for p in none sequential history; do
  rm -f $D/ra.sock
  $BIN/dhrd nbd --backing $D/data --socket $D/ra.sock --mem 256M --no-prefill --backing-timing hdd --read-ahead $p -v > $D/ra-$p.log 2>&1 &
  pid=$!
  for i in $(seq 200); do [ -S $D/ra.sock ] && break; sleep 0.05; done
  s=$(fio --name=s --ioengine=nbd --uri="nbd+unix:///?socket=$D/ra.sock" --rw=read:60k --bs=4k --iodepth=1 --size=1G --runtime=15 --time_based --output-format=json 2>/dev/null | python3 -c "import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index('{'):]); print('%.1f' % d['jobs'][0]['read']['iops'])")
  kill -INT $pid; wait $pid
  rm -f $D/ra.sock
  $BIN/dhrd nbd --backing $D/data --socket $D/ra.sock --mem 256M --no-prefill --backing-timing hdd --read-ahead $p -v > $D/ra2-$p.log 2>&1 &
  pid=$!
  for i in $(seq 200); do [ -S $D/ra.sock ] && break; sleep 0.05; done
  mkdir -p $D/ramnt; : > $D/ramnt.file
  nbdfuse -P $D/nbdfuse.pid $D/ramnt.file --unix $D/ra.sock &
  for i in $(seq 200); do [ -s $D/nbdfuse.pid ] && break; sleep 0.05; done
  $BIN/dhrd-bench replay --trace $T --target $D/ramnt.file --direct --queue-depth 1 --max-requests 4000 --json $D/ra-replay-$p.json > $D/ra-replay-$p.out 2>&1
  fusermount3 -u $D/ramnt.file 2>/dev/null || umount -l $D/ramnt.file
  fp=$(cat $D/nbdfuse.pid 2>/dev/null); [ -n "$fp" ] && kill $fp 2>/dev/null; sleep 0.3; rm -f $D/nbdfuse.pid
  kill -INT $pid; wait $pid
  r=$(python3 -c "import json; d=json.load(open('$D/ra-replay-$p.json')); print(d.get('iops', d))" 2>/dev/null)
  echo "round $round read-ahead $p: strided 4K every 64K QD1 IOPS $s; WebSearch replay (4000 requests, QD1) IOPS $r; $(grep -h 'hit ratio' $D/ra2-$p.log | sed 's/  */ /g')"
done
done
