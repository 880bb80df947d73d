#!/usr/bin/env bash
# How much CPU the whole machine spends per durable 4 KiB write, raw and through
# `dhrd nbd`, and what that allows: with every CPU busy, a path costing C us of CPU per
# write cannot pass ncpu / C writes a second, whatever its threads and wake-ups do.
# Each round runs, on one file, raw O_DIRECT|O_DSYNC writes (fio io_uring) and the same
# through `dhrd nbd` (fio's nbd engine; default `sync` durability, load finished) at each
# queue depth; CPU is the machine's busy time over the run (/proc/stat: user, nice,
# system, irq, softirq), so the client, the server and the kernel's block work all count.
#
# Usage: bench/nbd/cpu-bound.sh [--rounds 3] [--secs 5] [--qd "8 32"] [--size 1G]
#                               [--disk-dir /var/tmp] [--dhrd PATH] [--out DIR]
# Output: DIR/results.jsonl, DIR/table.md, DIR/machine.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=3
SECS=5
QDS="8 32"
SIZE=1G
DISK_DIR=/var/tmp
DHRD=
OUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --qd) QDS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    --dhrd) DHRD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for t in fio python3; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "fio lacks its nbd engine" >&2; exit 1; }
if [ -z "$DHRD" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  cargo build --release -q -p dhrd --manifest-path "$ROOT/Cargo.toml"
  DHRD=$CARGO_TARGET_DIR/release/dhrd
fi
OUT=${OUT:-$("$ROOT/bench/new-run-dir.sh" nbd-cpu-bound)}
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
WORK=$(mktemp -d "$DISK_DIR/dhrd-nbd-cpu.XXXXXX")
# shellcheck source=bench/nbd/serve.sh
source "$(dirname "$0")/serve.sh"
cleanup() {
  serve_stop
  rm -rf "$WORK"
}
trap cleanup EXIT
NCPU=$(nproc)
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "kernel: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $NCPU"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "one $SIZE file on $(df -h "$WORK" | awk 'NR==2{print $1}'), QD $QDS, $SECS s per run, $ROUNDS rounds"
} | tee "$OUT/machine.txt"
DISK=$WORK/disk.img
fio --name=fill --filename="$DISK" --rw=write --bs=1M --size="$SIZE" --output=/dev/null
sync
SOCK=$WORK/nbd.sock
LOG=$WORK/server.log

busy_idle() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }
FIO="--bs=4k --rw=randwrite --time_based --runtime=$SECS --randrepeat=0 --norandommap \
  --group_reporting --output-format=json"
measure() { # path qd: one run, one JSON line
  local path=$1 qd=$2 a b j
  a=$(busy_idle)
  # shellcheck disable=SC2086 # FIO is a list of words
  if [ "$path" = raw ]; then
    j=$(fio --name=w $FIO --filename="$DISK" --direct=1 --sync=dsync --ioengine=io_uring \
      --iodepth="$qd")
  else
    # fio's nbd engine prints "connected" before the JSON.
    j=$(fio --name=w $FIO --ioengine=nbd --iodepth="$qd" --uri="nbd+unix:///?socket=$SOCK" \
      --size="$SIZE" | sed -n '/^{/,$p')
  fi
  b=$(busy_idle)
  echo "$j" | python3 -c '
import json, sys
path, qd, rnd, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
hz = int(sys.argv[6])
w = json.load(sys.stdin)["jobs"][0]["write"]
(ab, ai), (bb, bi) = [tuple(map(int, x.split())) for x in (a, b)]
busy_s = (bb - ab) / hz
idle_s = (bi - ai) / hz
# Over the whole fio run (its start and the NBD handshake included, a small share).
print(json.dumps({"round": rnd, "path": path, "qd": qd, "iops": w["iops"],
                  "writes": w["total_ios"], "busy_cpu_s": busy_s, "idle_cpu_s": idle_s,
                  "cpu_us_per_write": busy_s * 1e6 / w["total_ios"]}))
' "$path" "$qd" "$r" "$a" "$b" "$(getconf CLK_TCK)" >> "$OUT/results.jsonl"
  tail -1 "$OUT/results.jsonl" >&2
}

for r in $(seq 1 "$ROUNDS"); do
  # The two halves swap order every round.
  if [ $((r % 2)) -eq 1 ]; then order="raw nbd"; else order="nbd raw"; fi
  for path in $order; do
    if [ "$path" = nbd ]; then serve_start "$DHRD" "$DISK" "$SOCK" "$LOG" || exit 1; fi
    for qd in $QDS; do measure "$path" "$qd"; done
    if [ "$path" = nbd ]; then serve_stop; fi
  done
done

python3 - "$OUT" "$NCPU" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
out, ncpu = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
med = lambda xs: statistics.median(xs)
print(f"| QD | raw IOPS | raw CPU us/write | nbd IOPS | nbd CPU us/write | nbd / raw | "
      f"nbd at all {ncpu} CPUs busy | that / raw |")
print("|---|---|---|---|---|---|---|---|")
for qd in sorted({r["qd"] for r in rows}):
    raw = [r for r in rows if r["qd"] == qd and r["path"] == "raw"]
    nbd = [r for r in rows if r["qd"] == qd and r["path"] == "nbd"]
    ri, rc = med([r["iops"] for r in raw]), med([r["cpu_us_per_write"] for r in raw])
    ni, nc = med([r["iops"] for r in nbd]), med([r["cpu_us_per_write"] for r in nbd])
    cap = ncpu * 1e6 / nc
    print(f"| {qd} | {ri:.0f} | {rc:.1f} | {ni:.0f} | {nc:.1f} | {ni / ri:.2f}x | "
          f"{cap:.0f} | {cap / ri:.2f}x |")
EOF
