#!/usr/bin/env bash
# What one durable 4 KiB write through `dhrd nbd` costs, counted, not timed: for a fixed
# number of fio nbd-engine writes at QD 1, 8 and 32, the server's system calls by kind
# and its context switches (perf tracepoints, per write), and the most device writes
# (pwritev2/pwrite64) in flight at once with their mean while any is (from the syscall
# enter/exit timestamps). Counts do not depend on the machine's load the way timings do;
# the in-flight figures do a little (they are what the server let the device see).
#
# Usage: sudo bench/nbd/write-costs.sh [--ios 20000] [--size 256M] [--disk-dir /var/tmp]
#                                      [--dhrd PATH]
# Prints one table (markdown) to stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IOS=20000
SIZE=256M
DISK_DIR=/var/tmp
DHRD=
while [ $# -gt 0 ]; do
  case "$1" in
    --ios) IOS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    --dhrd) DHRD=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for t in fio perf python3; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "fio lacks its nbd engine" >&2; exit 1; }
if [ -z "$DHRD" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  cargo build --release -q -p dhrd --manifest-path "$ROOT/Cargo.toml"
  DHRD=$CARGO_TARGET_DIR/release/dhrd
fi
WORK=$(mktemp -d "$DISK_DIR/dhrd-nbd-costs.XXXXXX")
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fio --name=fill --filename="$WORK/nbd.img" --rw=write --bs=1M --size="$SIZE" --output=/dev/null
sync
"$DHRD" nbd --backing "$WORK/nbd.img" --socket "$WORK/nbd.sock" > "$WORK/log" 2>&1 &
PID=$!
for _ in $(seq 1 6000); do grep -q "loaded .* bytes into RAM" "$WORK/log" && break; sleep 0.1; done
grep -q "loaded .* bytes into RAM" "$WORK/log" || { cat "$WORK/log"; exit 1; }

CALLS="futex sched_yield recvfrom sendmsg pwritev2 pwrite64"
EVENTS=context-switches
for c in $CALLS; do EVENTS="$EVENTS,syscalls:sys_enter_$c"; done
for qd in 1 8 32; do
  perf stat -x, -e "$EVENTS" -p "$PID" -o "$WORK/stat-$qd.csv" &
  STAT=$!
  perf record -q -e syscalls:sys_enter_pwritev2,syscalls:sys_exit_pwritev2 \
    -e syscalls:sys_enter_pwrite64,syscalls:sys_exit_pwrite64 -p "$PID" \
    -o "$WORK/rec-$qd.data" 2>/dev/null &
  REC=$!
  sleep 1
  fio --name=w --bs=4k --rw=randwrite --randrepeat=0 --norandommap --ioengine=nbd \
    --iodepth="$qd" --uri="nbd+unix:///?socket=$WORK/nbd.sock" --size="$SIZE" \
    --number_ios="$IOS" --output=/dev/null
  sleep 0.5
  kill -INT "$STAT" "$REC"
  wait "$STAT" "$REC" 2>/dev/null || true
  perf script -i "$WORK/rec-$qd.data" > "$WORK/rec-$qd.txt" 2>/dev/null
done

python3 - "$WORK" "$IOS" $CALLS <<'PY'
import re, sys
work, ios, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print('| QD | ' + ' | '.join(calls) + ' | all syscalls counted | context switches '
      '| device writes in flight: max | mean while any |')
print('|---' * (len(calls) + 5) + '|')
for qd in (1, 8, 32):
    n = {}
    for line in open(f'{work}/stat-{qd}.csv'):
        f = line.strip().split(',')
        if len(f) > 2 and f[0].replace('.', '').isdigit():
            n[f[2].replace('syscalls:sys_enter_', '')] = float(f[0])
    per = [n.get(c, 0) / ios for c in calls]
    ev, start = [], {}
    for line in open(f'{work}/rec-{qd}.txt'):
        m = re.search(r'\s(\d+)\s+\[\d+\]\s+([\d.]+):\s+syscalls:sys_(enter|exit)_pwrite', line)
        if not m:
            continue
        tid, t = m.group(1), float(m.group(2))
        if m.group(3) == 'enter':
            start[tid] = t
        elif tid in start:
            ev += [(start.pop(tid), 1), (t, -1)]
    ev.sort()
    cur = top = 0
    busy = area = 0.0
    last = None
    for t, k in ev:
        if last is not None and cur > 0:
            busy += t - last
            area += cur * (t - last)
        cur += k
        top = max(top, cur)
        last = t
    print(f'| {qd} | ' + ' | '.join(f'{x:.2f}' for x in per) +
          f' | {sum(per):.2f} | {n.get("context-switches", 0) / ios:.2f} | {top} | '
          f'{area / busy if busy else 0:.2f} |')
PY
