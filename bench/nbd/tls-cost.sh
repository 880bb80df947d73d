#!/usr/bin/env bash
# What one 4 KiB read request costs the server, over TLS and in plaintext: CPU time and
# system calls per request, counted rather than timed, so the figures hold on a busy
# machine (wall-clock ratios do not).
#
# One dhrd export (--tls on: plaintext and TLS clients read the same bytes) is read by
# fio's nbd engine (libnbd over GnuTLS) with a fixed number of 4 KiB random reads at QD 1
# and QD 8, each way. For each run:
#   - cpu_us_per_req (user_us_per_req + sys_us_per_req): the server's CPU time over the
#     run (/proc/PID/stat, which includes threads that have exited) divided by the
#     requests it served (its status file, nbd.bytes_read / 4096). The system part
#     includes the scheduler's work for threads that wait for each other, which varies
#     with the machine's other load; the user part (parsing, copies, OpenSSL) varies less;
#   - syscalls_per_req: every system call the server made (perf stat -e
#     raw_syscalls:sys_enter on the process), divided by the requests; a second, shorter
#     run under strace -c -f gives the breakdown by call (strace slows the server, so its
#     run counts calls only).
# The handshake and negotiation are included; with IOS requests they are a small share.
#
# Usage: bench/nbd/tls-cost.sh --out DIR. Knobs: IOS (requests per run, default 100000),
# STRACE_IOS (requests of the strace run, default 20000), POLL_US (the server's
# --poll-us, default 0: polling spends CPU while the server waits, which would be
# counted here as CPU per request), DHRD (binary; default target/release/dhrd).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: $0 --out DIR" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "usage: $0 --out DIR" >&2; exit 2; }
IOS=${IOS:-100000}
STRACE_IOS=${STRACE_IOS:-20000}
POLL_US=${POLL_US:-0}
for t in fio certtool python3 perf strace; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done
if [ -z "${DHRD:-}" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  cargo build --release -q -p dhrd --manifest-path "$ROOT/Cargo.toml"
  DHRD=$CARGO_TARGET_DIR/release/dhrd
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${WORKDIR:-/var/tmp}/dhrd-tls-cost.XXXXXX")
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

PKI=$WORK/pki
# shellcheck source=bench/nbd/pki.sh
source "$(dirname "$0")/pki.sh"
make_pki "$PKI" "$WORK/home" "cost CA"

head -c $((256 << 20)) /dev/urandom > "$WORK/data.img"
"$DHRD" nbd --backing "$WORK/data.img" --socket "$WORK/s.sock" --status-file "$WORK/status" \
  --poll-us "$POLL_US" --verbose --tls on --tls-certificates "$PKI" >"$WORK/dhrd.log" 2>&1 &
PID=$!
for _ in $(seq 1 400); do [ -S "$WORK/s.sock" ] && break; sleep 0.05; done
for _ in $(seq 1 600); do
  python3 -c "import json,sys; sys.exit(0 if json.load(open('$WORK/status'))['load']['complete'] else 1)" \
    2>/dev/null && break
  sleep 0.1
done

cpu_ticks() { awk '{print $14 " " $15}' "/proc/$PID/stat"; }
bytes_read() {
  sleep 1.2 # the status file is rewritten every second
  python3 -c "import json; print(json.load(open('$WORK/status'))['nbd']['bytes_read'])"
}
fio_ios() { # URI QD N
  HOME=$WORK/home fio --name=cost --ioengine=nbd --uri="$1" --rw=randread --bs=4k \
    --iodepth="$2" --size=256M --number_ios="$3" --norandommap --output-format=terse \
    >/dev/null
}

HZ=$(getconf CLK_TCK)
RESULTS=$OUT/results.jsonl
: > "$RESULTS"
for way in plain tls; do
  uri="nbd+unix:///?socket=$WORK/s.sock"
  [ "$way" = tls ] && uri="nbds+unix:///?socket=$WORK/s.sock"
  for qd in 1 8; do
    b0=$(bytes_read); read -r u0 s0 < <(cpu_ticks)
    perf stat -e raw_syscalls:sys_enter -x, -o "$WORK/perf.txt" -p "$PID" &
    PERF=$!
    sleep 0.5
    fio_ios "$uri" "$qd" "$IOS"
    kill -INT "$PERF"; wait "$PERF" || true
    read -r u1 s1 < <(cpu_ticks); b1=$(bytes_read)
    sys=$(awk -F, '/raw_syscalls/ {print $1}' "$WORK/perf.txt")
    strace -c -f -q -o "$WORK/strace-$way-$qd.txt" -p "$PID" &
    ST=$!
    sleep 0.5
    fio_ios "$uri" "$qd" "$STRACE_IOS"
    kill -INT "$ST"; wait "$ST" || true
    cp "$WORK/strace-$way-$qd.txt" "$OUT/"
    python3 - "$way" "$qd" "$b0" "$b1" "$u0" "$u1" "$s0" "$s1" "$HZ" "$sys" "$STRACE_IOS" \
      "$WORK/strace-$way-$qd.txt" >> "$RESULTS" <<'PY'
import json, sys
way, qd, b0, b1, u0, u1, s0, s1, hz, sys_calls, strace_ios, path = sys.argv[1:]
reqs = (int(b1) - int(b0)) / 4096
us = lambda ticks: round(ticks / int(hz) * 1e6 / reqs, 1)
calls = {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        calls[f[-1]] = round(int(f[3]) / int(strace_ios), 2)
print(json.dumps({"way": way, "qd": int(qd), "requests": int(reqs),
                  "cpu_us_per_req": us(int(u1) + int(s1) - int(u0) - int(s0)),
                  "user_us_per_req": us(int(u1) - int(u0)),
                  "sys_us_per_req": us(int(s1) - int(s0)),
                  "syscalls_per_req": round(int(sys_calls) / reqs, 2),
                  "strace_calls_per_req": dict(sorted(calls.items(), key=lambda kv: -kv[1]))}))
PY
    tail -1 "$RESULTS"
  done
done
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "load average: $(cut -d" " -f1-3 /proc/loadavg)"
  echo "requests per run: $IOS (strace run: $STRACE_IOS), --poll-us $POLL_US"
  grep "TLS session" "$WORK/dhrd.log" | head -1 || true
} > "$OUT/machine.txt"
