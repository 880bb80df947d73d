#!/usr/bin/env bash
# NBD benchmark: dhrd against nbdkit (memory and file plugins) and qemu-nbd, all over a
# Unix socket, driven by the same client (crates/dhrd-nbd/examples/nbd_bench.rs) in one run.
#
# Output: bench/results/<UTC date>-nbd/{results.json,table.md,machine.txt}; the table is
# also printed. Environment knobs: SIZE (export size, default 512M), SECS (seconds per
# measurement, default 5), QD (queue depth of the 4 KiB tests, default 16), WORKDIR (where
# backing files go; must be a real disk, not tmpfs; default /var/tmp).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIZE=${SIZE:-512M}
SECS=${SECS:-5}
QD=${QD:-16}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for t in nbdkit qemu-nbd nbdcopy python3 fio; do
  command -v "$t" >/dev/null || { echo "missing tool: $t" >&2; exit 1; }
done

cargo build --release -q -p dhrd --manifest-path "$ROOT/Cargo.toml"
cargo build --release -q -p dhrd-nbd --example nbd_bench --manifest-path "$ROOT/Cargo.toml"
DHRD=$CARGO_TARGET_DIR/release/dhrd
BENCH=$CARGO_TARGET_DIR/release/examples/nbd_bench

OUT=$("$ROOT/bench/new-run-dir.sh" nbd)
WORK=$(mktemp -d "${WORKDIR:-/var/tmp}/dhrd-nbd-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "kernel: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "memory: $(free -h | awk '/^Mem:/{print $2}')"
  echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg) (other work on the machine adds noise)"
  echo "workdir: $WORK on $(df -h "$WORK" | awk 'NR==2{print $1" ("$2")"}') fs $(stat -f -c %T "$WORK")"
  echo "nbdkit: $(nbdkit --version | head -1)"
  echo "qemu-nbd: $(qemu-nbd --version | head -1)"
  echo "export size: $SIZE, ${SECS}s per measurement, 4 KiB tests at QD $QD, 1 MiB tests at QD 4, 1 connection"
} | tee "$OUT/machine.txt"

# Same random image for every server's prefill, so reads hit real data everywhere.
head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom > "$WORK/seed.img"

wait_sock() {
  for _ in $(seq 1 200); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "server socket $1 did not appear" >&2; return 1
}

start_server() { # name sock: starts it in the background
  local name=$1 sock=$2
  rm -f "$sock"
  case $name in
    dhrd-sync)  "$DHRD" nbd --backing "$WORK/$name.img" --size "$SIZE" --socket "$sock" --durability sync  >/dev/null 2>"$WORK/$name.log" & ;;
    dhrd-dsync) "$DHRD" nbd --backing "$WORK/$name.img" --size "$SIZE" --socket "$sock" --durability sync --backing-sync dsync >/dev/null 2>"$WORK/$name.log" & ;;
    dhrd-fsync) "$DHRD" nbd --backing "$WORK/$name.img" --size "$SIZE" --socket "$sock" --durability fsync >/dev/null 2>"$WORK/$name.log" & ;;
    nbdkit-memory) nbdkit -f -U "$sock" memory "$SIZE" 2>"$WORK/$name.log" & ;;
    nbdkit-file) truncate -s "$SIZE" "$WORK/$name.img"; nbdkit -f -U "$sock" file "$WORK/$name.img" 2>"$WORK/$name.log" & ;;
    qemu-nbd) truncate -s "$SIZE" "$WORK/$name.img"; qemu-nbd -f raw -t -e 16 -k "$sock" "$WORK/$name.img" 2>"$WORK/$name.log" & ;;
  esac
  PIDS+=("$!")
  wait_sock "$sock"
}

# workload bs qd fua
TESTS=(
  "randread 4096 $QD 0"
  "randwrite 4096 $QD 1"
  "randwrite 4096 1 1"
  "randwrite 4096 $QD 0"
  "seqread 1048576 4 0"
  "seqwrite 1048576 4 1"
)
SERVERS=(dhrd-sync dhrd-dsync dhrd-fsync nbdkit-memory nbdkit-file qemu-nbd)

# All servers run at once and every test visits them in turn, so a change of load on a
# shared machine during the run hits every server alike instead of the last ones.
for server in "${SERVERS[@]}"; do
  start_server "$server" "$WORK/$server.sock"
  nbdcopy --flush "$WORK/seed.img" "nbd+unix:///?socket=$WORK/$server.sock"
done

echo "[" > "$WORK/results.json.tmp"
first=1
add() { # server client json
  [ $first = 1 ] || echo "," >> "$WORK/results.json.tmp"
  first=0
  echo "{\"server\":\"$1\",\"client\":\"$2\",\"result\":$3}" >> "$WORK/results.json.tmp"
}
for t in "${TESTS[@]}"; do
  read -r wl bs qd fua <<<"$t"
  for server in "${SERVERS[@]}"; do
    args=(--socket "$WORK/$server.sock" --workload "$wl" --bs "$bs" --qd "$qd" --seconds "$SECS")
    [ "$fua" = 1 ] && args+=(--fua)
    line=$("$BENCH" "${args[@]}")
    echo "$server $line"
    add "$server" nbd_bench "$line"
  done
done
# Cross-check with a second client: fio's nbd engine (libnbd). It cannot send FUA, so
# only reads and plain writes (ended by an fsync) are measured with it.
for t in randread randwrite; do
  for server in "${SERVERS[@]}"; do
    line=$(fio --name="$t" --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/$server.sock" \
      --rw="$t" --bs=4k --iodepth="$QD" --time_based --runtime="$SECS" --size="$SIZE" \
      --end_fsync=1 --output-format=json 2>/dev/null |
      python3 "$ROOT/bench/nbd/fio2json.py" "$t" "$QD")
    echo "$server fio $line"
    add "$server" fio "$line"
  done
done
echo "]" >> "$WORK/results.json.tmp"
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
PIDS=()

python3 - "$WORK/results.json.tmp" "$OUT" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
out = sys.argv[2]
meta = open(out + "/machine.txt").read()
json.dump({"machine": meta.strip().splitlines(), "results": rows}, open(out + "/results.json", "w"), indent=1)
def key(r):
    x = r["result"]
    return (r.get("client", "nbd_bench"), x["workload"], x["bs"], x["qd"], x["fua"])
tests = []
for r in rows:
    if key(r) not in tests:
        tests.append(key(r))
servers = []
for r in rows:
    if r["server"] not in servers:
        servers.append(r["server"])
val = {(r["server"], key(r)): r["result"] for r in rows}
lines = ["# NBD benchmark", "", "```", meta.strip(), "```", "",
         "Same client (nbd_bench, one connection, pipelined) for every server; rows starting with fio are the fio nbd engine (libnbd) as a cross-check. IOPS (MiB/s) and p99 latency in us.",
         "Ratios: reads: dhrd-sync against nbdkit-memory; FUA writes: dhrd-sync against nbdkit-file; plain writes (durable only at flush): dhrd-fsync against nbdkit-file; same queue depth.", ""]
hdr = "| test | " + " | ".join(servers) + " | ratio |"
lines += [hdr, "|" + "---|" * (len(servers) + 2)]
for k in tests:
    client, wl, bs, qd, fua = k
    name = ("fio " if client == "fio" else "") + f"{wl} {bs // 1024 if bs < 1 << 20 else bs >> 20}{'K' if bs < 1 << 20 else 'M'} qd{qd}{' FUA' if fua else ''}"
    cells = []
    for s in servers:
        x = val.get((s, k))
        cells.append(f"{x['iops']:.0f} ({x['mib_s']:.1f}) p99 {x['lat_us_p99']}" if x else "-")
    # Like for like: reads against nbdkit's RAM; FUA writes (durable per request) with
    # dhrd-sync; plain writes (durable only at flush) with dhrd-fsync.
    base = "nbdkit-memory" if "read" in wl else "nbdkit-file"
    mine = "dhrd-fsync" if ("write" in wl and not fua) else "dhrd-sync"
    d, b = val.get((mine, k)), val.get((base, k))
    ratio = f"{mine} {d['iops'] / b['iops']:.2f}x {base}" if d and b and b["iops"] else "-"
    if "write" in wl and fua:
        dd = val.get(("dhrd-dsync", k))
        if dd and b and b["iops"]:
            ratio += f"; dhrd-dsync {dd['iops'] / b['iops']:.2f}x"
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
lines.append("")
lines.append("dhrd-sync: every write durable before its reply (FUA is free). dhrd-dsync: the same with an O_DSYNC backing (each write durable on return, no shared sync). dhrd-fsync: durable at FLUSH/FUA (FUA = write + flush).")
open(out + "/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results in $OUT"
