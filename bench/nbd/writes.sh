#!/usr/bin/env bash
# Durable 4 KiB random writes on the block path against the device's own bound, a raw
# O_DIRECT|O_DSYNC write, in interleaved rounds (each round runs every configuration once;
# the raw and the dhrd half swap order every round; ratios are per round, medians
# reported):
# - `dhrd nbd` (sync durability, defaults) through fio's nbd engine at QD 1, 8 and 32,
#   against fio's io_uring engine at the same depth;
# - qemu-nbd with --cache=directsync (each write O_DIRECT|O_DSYNC, what users pick today
#   for a durable block export), the same client and depths, when qemu-nbd is installed;
# - the C API (crates/dhrd-capi/examples/c/write_bench.c) with 1 and 8 threads, against
#   the same program writing with pwrite.
# Every configuration writes the same file, one at a time: two files filled alike on the
# same file system differ by up to 30% in O_DSYNC write rate on these VMs (measured:
# 16.6k against 19.3k IOPS raw at 8 threads on two such files, and dhrd 20.8k against
# 15.7k on the same two), so per-configuration files would measure where they lie.
# Every dhrd configuration writes loaded chunks (the load finishes before timing).
#
# Usage: sudo bench/nbd/writes.sh [--rounds 5] [--secs 4] [--size 1G] [--disk-dir /var/tmp]
#                                 [--out DIR]
# Output: DIR/results.json, DIR/table.md, DIR/machine.txt (default
# bench/results/<UTC date>-nbd-writes/, bench/new-run-dir.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=5
SECS=4
SIZE=1G
DISK_DIR=/var/tmp
OUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$OUT" ]; then
  OUT=$("$ROOT/bench/new-run-dir.sh" nbd-writes)
fi
mkdir -p "$OUT"
for t in fio cc python3; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "fio lacks its nbd engine" >&2; exit 1; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -q -p dhrd -p dhrd-capi --manifest-path "$ROOT/Cargo.toml"
DHRD=$CARGO_TARGET_DIR/release/dhrd
WORK=$(mktemp -d "$DISK_DIR/dhrd-nbd-writes.XXXXXX")
CBENCH=$WORK/write_bench
cc -O2 -I "$ROOT/crates/dhrd-capi/include" "$ROOT/crates/dhrd-capi/examples/c/write_bench.c" \
  "$CARGO_TARGET_DIR/release/libdhrd_capi.a" -lpthread -ldl -lm -o "$CBENCH"
# shellcheck source=bench/nbd/serve.sh
source "$(dirname "$0")/serve.sh"
cleanup() {
  serve_stop
  rm -rf "$WORK"
}
trap cleanup EXIT

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD) dirty: $([ -z "$(git -C "$ROOT" status --porcelain -- crates bench ':!bench/results')" ] && echo no || echo yes)"
  echo "kernel: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "disk: $WORK on $(df -h "$WORK" | awk 'NR==2{print $1}') fs $(stat -f -c %T "$WORK")"
  echo "one file of $SIZE for every configuration, $SECS s per run, $ROUNDS rounds"
} | tee "$OUT/machine.txt"

DISK=$WORK/disk.img
fio --name=fill --filename="$DISK" --rw=write --bs=1M --size="$SIZE" --output=/dev/null
sync

SOCK=$WORK/nbd.sock
# Serves DISK with `dhrd nbd` until stop_server; returns once the load is done.
start_dhrd() { serve_start "$DHRD" "$DISK" "$SOCK" "$OUT/dhrd-nbd.log" || exit 1; }
# --aio=threads: qemu-nbd's faster choice here (10.9k against 7.9k IOPS with io_uring at
# QD 32, 2.5k against 1.9k at QD 1).
start_qemu() {
  rm -f "$SOCK"
  qemu-nbd -f raw -t -e 64 --cache=directsync --aio=threads -k "$SOCK" "$DISK" \
    >> "$OUT/qemu-nbd.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do [ -S "$SOCK" ] && return 0; sleep 0.1; done
  cat "$OUT/qemu-nbd.log"; exit 1
}
stop_server() { serve_stop; }
QEMU=no
command -v qemu-nbd >/dev/null && QEMU=yes

FIO="--bs=4k --rw=randwrite --time_based --runtime=$SECS --randrepeat=0 --norandommap \
  --group_reporting --output-format=json"
run() { # name qd-or-threads
  local name=$1 n=$2
  local f=$OUT/$name.json
  echo "$name" >&2
  case "$name" in
    # shellcheck disable=SC2086 # FIO is a list of words
    raw-fio-*) fio --name=w $FIO --ioengine=io_uring --iodepth="$n" --direct=1 --sync=dsync \
                 --filename="$DISK" > "$f" ;;
    nbd-fio-*|qemu-fio-*) fio --name=w $FIO --ioengine=nbd --iodepth="$n" \
                 --uri="nbd+unix:///?socket=$SOCK" --size="$SIZE" > "$f" ;;
    raw-capi-*) "$CBENCH" raw "$DISK" "$n" "$SECS" > "$f" ;;
    dhrd-capi-*) "$CBENCH" dhrd "$DISK" "$n" "$SECS" > "$f" ;;
  esac
}
raw_half() {
  for qd in 1 8 32; do run "raw-fio-qd$qd-r$1" "$qd"; done
  for t in 1 8; do run "raw-capi-t$t-r$1" "$t"; done
}
dhrd_half() {
  start_dhrd
  for qd in 1 8 32; do run "nbd-fio-qd$qd-r$1" "$qd"; done
  stop_server
  for t in 1 8; do run "dhrd-capi-t$t-r$1" "$t"; done
  if [ "$QEMU" = yes ]; then
    start_qemu
    for qd in 1 8 32; do run "qemu-fio-qd$qd-r$1" "$qd"; done
    stop_server
  fi
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r" >&2
  if [ $((r % 2)) = 1 ]; then raw_half "$r"; dhrd_half "$r"; else dhrd_half "$r"; raw_half "$r"; fi
done

# The protocol's own cost with the same client: nbdkit's memory plugin (no device, no
# sync) at each depth. At QD 1 a request costs the device's latency plus this round trip,
# so raw_lat / (raw_lat + floor_lat) bounds any NBD server's ratio on this machine.
if command -v nbdkit >/dev/null; then
  nbdkit --foreground --unix "$WORK/nbdkit.sock" memory "$SIZE" >/dev/null 2>&1 &
  NBDKIT_PID=$!
  for _ in $(seq 1 100); do [ -S "$WORK/nbdkit.sock" ] && break; sleep 0.1; done
  for qd in 1 8 32; do
    # shellcheck disable=SC2086 # FIO is a list of words
    fio --name=w $FIO --ioengine=nbd --iodepth="$qd" \
      --uri="nbd+unix:///?socket=$WORK/nbdkit.sock" --size="$SIZE" > "$OUT/floor-nbdkit-qd$qd.json"
  done
  kill "$NBDKIT_PID"; wait "$NBDKIT_PID" 2>/dev/null || true
fi

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def fio(name):
    text = open(os.path.join(out, name + '.json')).read()
    # fio's nbd engine prints a line of its own before the JSON.
    j = json.loads(text[text.index('{'):])['jobs'][0]['write']
    return j['iops'], j['clat_ns']['mean'] / 1e3
def capi(name):
    j = json.loads(open(os.path.join(out, name + '.json')).read())
    return j['iops'], j['lat_us_mean']
rows = []
def add(what, n, unit, raw_name, dhrd_name, get, target):
    raw = [get(raw_name.format(r=r)) for r in range(1, rounds + 1)]
    dh = [get(dhrd_name.format(r=r)) for r in range(1, rounds + 1)]
    ratios = [d[0] / b[0] for d, b in zip(dh, raw)]
    rows.append({
        'what': what, unit: n,
        'raw_iops_median': st.median(x[0] for x in raw),
        'raw_lat_us_median': st.median(x[1] for x in raw),
        'dhrd_iops_median': st.median(x[0] for x in dh),
        'dhrd_lat_us_median': st.median(x[1] for x in dh),
        'ratio_per_round': [round(x, 3) for x in ratios],
        'ratio_median': round(st.median(ratios), 3),
        'target': target,
    })
for qd, target in ((1, '>= 0.8x'), (8, '>= 0.95x'), (32, '>= 0.95x')):
    add('dhrd nbd (fio nbd engine) vs raw O_DIRECT|O_DSYNC (fio io_uring)', qd, 'qd',
        f'raw-fio-qd{qd}-r{{r}}', f'nbd-fio-qd{qd}-r{{r}}', fio, target)
if os.path.exists(os.path.join(out, 'qemu-fio-qd1-r1.json')):
    for qd in (1, 8, 32):
        add('qemu-nbd --cache=directsync (fio nbd engine) vs raw O_DIRECT|O_DSYNC (fio io_uring)',
            qd, 'qd', f'raw-fio-qd{qd}-r{{r}}', f'qemu-fio-qd{qd}-r{{r}}', fio, 'comparison')
for t in (1, 8):
    add('C API dhrd_write vs raw O_DIRECT|O_DSYNC pwrite', t, 'threads',
        f'raw-capi-t{t}-r{{r}}', f'dhrd-capi-t{t}-r{{r}}', capi, '>= 0.95x')
json.dump({'rounds': rounds, 'rows': rows}, open(os.path.join(out, 'results.json'), 'w'),
          indent=1)
lines = ['| what | QD / threads | raw IOPS | raw lat us | server IOPS | server lat us | ratio (median) | per round | target |',
         '|---|---|---|---|---|---|---|---|---|']
for x in rows:
    n = x.get('qd', x.get('threads'))
    lines.append(f"| {x['what']} | {n} | {x['raw_iops_median']:.0f} | {x['raw_lat_us_median']:.0f} | "
                 f"{x['dhrd_iops_median']:.0f} | {x['dhrd_lat_us_median']:.0f} | {x['ratio_median']:.2f}x | "
                 f"{' '.join('%.2f' % r for r in x['ratio_per_round'])} | {x['target']} |")
floor = {}
for qd in (1, 8, 32):
    f = os.path.join(out, f'floor-nbdkit-qd{qd}.json')
    if os.path.exists(f):
        floor[qd] = fio(f'floor-nbdkit-qd{qd}')
if floor:
    lines += ['', '| protocol floor: nbdkit memory, same client | QD | IOPS | lat us | bound on an NBD server at this QD |',
              '|---|---|---|---|---|']
    for x in rows:
        qd = x.get('qd')
        if qd in floor and x['what'].startswith('dhrd nbd'):
            iops, lat = floor[qd]
            bound = x['raw_lat_us_median'] / (x['raw_lat_us_median'] + lat) if qd == 1 else None
            x['floor_nbdkit_memory'] = {'iops': iops, 'lat_us': lat, 'qd1_bound': bound}
            lines.append(f"| nbdkit memory | {qd} | {iops:.0f} | {lat:.0f} | "
                         f"{'%.2fx (raw lat / (raw lat + this))' % bound if bound else '-'} |")
    json.dump({'rounds': rounds, 'rows': rows}, open(os.path.join(out, 'results.json'), 'w'),
              indent=1)
open(os.path.join(out, 'table.md'), 'w').write('\n'.join(lines) + '\n')
print('\n'.join(lines))
PY
echo "results in $OUT" >&2
