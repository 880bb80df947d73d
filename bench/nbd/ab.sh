#!/usr/bin/env bash
# 4 KiB random reads (or writes) through `dhrd nbd`, plaintext and TLS, at the given queue
# depths, for one or more dhrd binaries in alternating rounds (so two builds are compared
# in the same run, on the same export file, with the same client: fio's nbd engine,
# libnbd over GnuTLS). Each round starts every binary in turn (rotated order), waits for
# its load to finish, runs every way and depth and stops it. Medians over rounds, and
# per-round ratios to the first binary, go to the table; the TLS/plaintext ratio of each
# binary too (issue 36's figure). Writes use the default `sync` durability: each is
# durable before its reply.
#
# Usage: bench/nbd/ab.sh [--rw randread|randwrite] [--qd "1 8"] [--ways "plain tls"]
#                        [--rounds 5] [--secs 4] [--size 1G] [--disk-dir /var/tmp]
#                        [--out DIR] NAME=DHRD_BINARY...
# Output: DIR/results.jsonl (one line per run), DIR/table.md, DIR/machine.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RW=randread
QDS="1 8"
WAYS="plain tls"
ROUNDS=5
SECS=4
SIZE=1G
DISK_DIR=/var/tmp
OUT=
BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rw) RW=$2; shift 2 ;;
    --qd) QDS=$2; shift 2 ;;
    --ways) WAYS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *=*) BINS+=("$1"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ ${#BINS[@]} -gt 0 ] || { echo "give at least one NAME=DHRD_BINARY" >&2; exit 2; }
case "$RW" in randread|randwrite) ;; *) echo "--rw is randread or randwrite" >&2; exit 2 ;; esac
for t in fio certtool python3; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "fio lacks its nbd engine" >&2; exit 1; }
OUT=${OUT:-$("$ROOT/bench/new-run-dir.sh" nbd-ab)}
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
WORK=$(mktemp -d "$DISK_DIR/dhrd-nbd-reads.XXXXXX")
# shellcheck source=bench/nbd/serve.sh
source "$(dirname "$0")/serve.sh"
cleanup() {
  serve_stop
  rm -rf "$WORK"
}
trap cleanup EXIT
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "kernel: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "export: $SIZE file on $(df -h "$WORK" | awk 'NR==2{print $1}'), $RW, QD $QDS, $WAYS, $SECS s per run, $ROUNDS rounds"
  for b in "${BINS[@]}"; do echo "binary ${b%%=*}: ${b#*=} ($(sha256sum "${b#*=}" | cut -c1-12))"; done
} | tee "$OUT/machine.txt"
# shellcheck source=bench/nbd/pki.sh
source "$(dirname "$0")/pki.sh"
make_pki "$WORK/pki" "$WORK/home" "bench CA"
DISK=$WORK/disk.img
fio --name=fill --filename="$DISK" --rw=write --bs=1M --size="$SIZE" --output=/dev/null
sync
SOCK=$WORK/nbd.sock
LOG=$WORK/server.log

run_iops() { # uri qd
  # fio's nbd engine prints "connected" before the JSON.
  HOME=$WORK/home fio --name=r --ioengine=nbd --uri="$1" --rw="$RW" --bs=4k \
    --iodepth="$2" --runtime="$SECS" --time_based --size="$SIZE" --randrepeat=0 \
    --norandommap --output-format=json |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; j = json.load(sys.stdin)["jobs"][0]; print(j["read"]["iops"] + j["write"]["iops"])'
}

n=${#BINS[@]}
for r in $(seq 1 "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    b=${BINS[$(( (i + r - 1) % n ))]}
    name=${b%%=*}
    serve_start "${b#*=}" "$DISK" "$SOCK" "$LOG" --tls on --tls-certificates "$WORK/pki" || exit 1
    for qd in $QDS; do
      for way in $WAYS; do
        scheme=nbd+unix; [ "$way" = tls ] && scheme=nbds+unix
        iops=$(run_iops "$scheme:///?socket=$SOCK" "$qd")
        echo "round $r $name $way QD $qd: $iops IOPS" >&2
        printf '{"round": %d, "binary": "%s", "way": "%s", "qd": %d, "iops": %s}\n' \
          "$r" "$name" "$way" "$qd" "$iops" >> "$OUT/results.jsonl"
      done
    done
    serve_stop
  done
done

python3 - "$OUT" "${BINS[0]%%=*}" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
out, first = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
bins = list(dict.fromkeys(r["binary"] for r in rows))
at = {(r["round"], r["binary"], r["way"], r["qd"]): r["iops"] for r in rows}
rounds = sorted({r["round"] for r in rows})
qds = sorted({r["qd"] for r in rows})
ways = [w for w in ("plain", "tls") if any(r["way"] == w for r in rows)]
print("| binary | way | QD | IOPS median | per round | vs " + first + " per round (median) |")
print("|---|---|---|---|---|---|")
for b in bins:
    for qd in qds:
        for way in ways:
            v = [at[(r, b, way, qd)] for r in rounds]
            vs = [at[(r, b, way, qd)] / at[(r, first, way, qd)] for r in rounds]
            print(f"| {b} | {way} | {qd} | {statistics.median(v):.0f} | "
                  + " ".join(f"{x:.0f}" for x in v)
                  + f" | {' '.join(f'{x:.2f}' for x in vs)} ({statistics.median(vs):.2f}x) |")
if len(ways) < 2:
    sys.exit(0)
print()
print("| binary | QD | TLS / plaintext per round | median |")
print("|---|---|---|---|")
for b in bins:
    for qd in qds:
        t = [at[(r, b, "tls", qd)] / at[(r, b, "plain", qd)] for r in rounds]
        print(f"| {b} | {qd} | {' '.join(f'{x:.2f}' for x in t)} | {statistics.median(t):.3f}x |")
EOF
