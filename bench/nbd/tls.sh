#!/usr/bin/env bash
# NBD over TLS: what encryption costs, and what block status saves.
#
#   1. 4 KiB random read through TLS against the same export in plaintext, at QD 1 and 8
#      (one dhrd export with --tls on, so both kinds of client read the same bytes);
#   2. 1 MiB sequential read through TLS: dhrd against nbdkit's memory plugin, both with
#      --tls require and the same certificates;
#   3. nbdcopy (to null:) and qemu-img convert (to a sparse file) of a sparse export (90%
#      holes by default) through TLS: the bytes the server read out for each (dhrd's
#      status file, nbd.bytes_read) as a share of the export.
#
# Client for 1 and 2: fio's nbd engine (libnbd over GnuTLS, the ecosystem's client). fio
# cannot name a certificate directory in its URI, so it finds the CA in libnbd's default
# place, $HOME/.pki/libnbd, under a HOME made for the run; the servers therefore verify no
# client certificate (server authentication and encryption, which is what costs).
#
# Usage: bench/nbd/tls.sh --out DIR. Writes DIR/results.json, DIR/table.md,
# DIR/polls.txt (for the 4 KiB runs: how many waits for a request the server's polling
# missed, from its status file) and DIR/machine.txt. Knobs (environment): SIZE (export of
# 1 and 2, default 1G), SPARSE_SIZE (export of 3, default 4G), DATA_PERCENT (its data,
# default 10), SECS (seconds per fio run, default 10), WORKDIR (backing files; a real
# disk, default /var/tmp).
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
SIZE=${SIZE:-1G}
SPARSE_SIZE=${SPARSE_SIZE:-4G}
DATA_PERCENT=${DATA_PERCENT:-10}
SECS=${SECS:-10}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for t in nbdkit nbdcopy fio certtool python3 qemu-img; do
  command -v "$t" >/dev/null || { echo "missing tool: $t (bash scripts/install-deps.sh)" >&2; exit 1; }
done

cargo build --release -q -p dhrd --manifest-path "$ROOT/Cargo.toml"
DHRD=$CARGO_TARGET_DIR/release/dhrd

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${WORKDIR:-/var/tmp}/dhrd-tls-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "kernel: $(uname -srm)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg) (other work on the machine adds noise)"
  echo "nbdkit: $(nbdkit --version | head -1); fio: $(fio --version)"
  echo "export $SIZE, sparse export $SPARSE_SIZE with $DATA_PERCENT% data, ${SECS}s per fio run"
} | tee "$OUT/machine.txt"

# Certificates: a CA and a server certificate (certtool, as docs/nbd.md shows); the
# client's HOME holds the CA where libnbd looks for it.
PKI=$WORK/pki
# shellcheck source=bench/nbd/pki.sh
source "$(dirname "$0")/pki.sh"
make_pki "$PKI" "$WORK/home" "bench CA"

wait_sock() {
  for _ in $(seq 1 400); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "server socket $1 did not appear" >&2; return 1
}

# dhrd NAME BACKING EXTRA...: starts dhrd nbd on $WORK/NAME.sock, waits for its socket.
dhrd() {
  local name=$1 backing=$2; shift 2
  "$DHRD" nbd --backing "$backing" --socket "$WORK/$name.sock" \
    --status-file "$WORK/$name.status" "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  wait_sock "$WORK/$name.sock"
}

wait_loaded() { # NAME: until the status file says the RAM tier is loaded
  for _ in $(seq 1 6000); do
    python3 -c "import json,sys; sys.exit(0 if json.load(open('$WORK/$1.status'))['load']['complete'] else 1)" \
      2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1 did not finish loading" >&2; return 1
}

RESULTS=$WORK/results.jsonl
: > "$RESULTS"
: > "$OUT/polls.txt"
# polls NAME: "requests caught missed" from dhrd's status file (rewritten every second).
polls() {
  sleep 1.2
  python3 -c "import json; n=json.load(open('$WORK/$1.status'))['nbd']; print(n['requests'], n.get('polls_caught', -1), n.get('polls_missed', -1))"
}
# poll_share BEFORE AFTER: the waits for a request polling missed (each a kernel wake-up),
# per request, between two polls outputs.
poll_share() {
  python3 -c "a=list(map(int,'$1'.split())); b=list(map(int,'$2'.split())); r=max(b[0]-a[0],1); print('n/a (no poll counters)' if a[2] < 0 else round((b[2]-a[2])/r, 3))"
}
# fio_run LABEL URI RW BS QD: one fio run; appends {label, rw, bs, qd, iops, mib_s, p99} to the results.
fio_run() {
  local label=$1 uri=$2 rw=$3 bs=$4 qd=$5
  HOME=$WORK/home fio --name="$label" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" \
    --iodepth="$qd" --size="$SIZE" --time_based --runtime="$SECS" --ramp_time=1 \
    --output-format=json > "$WORK/fio.json"
  python3 - "$label" "$rw" "$bs" "$qd" "$WORK/fio.json" >> "$RESULTS" <<'PY'
import json, sys
label, rw, bs, qd, path = sys.argv[1:]
text = open(path).read()
j = json.loads(text[text.index("{"):])["jobs"][0]["read"]
p99 = j["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000
print(json.dumps({"test": label, "rw": rw, "bs": bs, "qd": int(qd),
                  "iops": round(j["iops"], 1), "mib_s": round(j["bw"] / 1024, 2),
                  "lat_us_p99": round(p99, 1)}))
PY
  tail -1 "$RESULTS"
}

# 1 and 2: one random image, in dhrd (loaded into RAM) and in nbdkit's memory plugin.
head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom > "$WORK/data.img"
dhrd dhrd "$WORK/data.img" --tls on --tls-certificates "$PKI"
wait_loaded dhrd
PLAIN="nbd+unix:///?socket=$WORK/dhrd.sock"
TLS="nbds+unix:///?socket=$WORK/dhrd.sock"
for qd in 1 8; do
  for way in plain tls; do
    uri=$PLAIN; [ "$way" = tls ] && uri=$TLS
    p0=$(polls dhrd)
    fio_run "dhrd $way" "$uri" randread 4k "$qd"
    echo "dhrd $way QD$qd: waits polling missed per request (a wake-up each): $(poll_share "$p0" "$(polls dhrd)")" \
      | tee -a "$OUT/polls.txt"
  done
done
fio_run "dhrd tls" "$TLS" read 1m 4

nbdkit --foreground --unix "$WORK/nbdkit.sock" --tls=require --tls-certificates "$PKI" \
  memory "$SIZE" >"$WORK/nbdkit.log" 2>&1 &
PIDS+=($!)
wait_sock "$WORK/nbdkit.sock"
NBDKIT="nbds+unix:///?socket=$WORK/nbdkit.sock"
HOME=$WORK/home nbdcopy "$WORK/data.img" "$NBDKIT"
fio_run "nbdkit memory tls" "$NBDKIT" read 1m 4

# The same 4 KiB comparison on nbdkit (--tls=on serves both kinds of client): what TLS
# costs a C server with the same client on the same cores, the reference for 1.
nbdkit --foreground --unix "$WORK/nbdkit-on.sock" --tls=on --tls-certificates "$PKI" \
  memory "$SIZE" >"$WORK/nbdkit-on.log" 2>&1 &
PIDS+=($!)
wait_sock "$WORK/nbdkit-on.sock"
HOME=$WORK/home nbdcopy "$WORK/data.img" "nbd+unix:///?socket=$WORK/nbdkit-on.sock"
for qd in 1 8; do
  fio_run "nbdkit memory plain" "nbd+unix:///?socket=$WORK/nbdkit-on.sock" randread 4k "$qd"
  fio_run "nbdkit memory tls" "nbds+unix:///?socket=$WORK/nbdkit-on.sock" randread 4k "$qd"
done

# 3: a sparse export, DATA_PERCENT% data in 1 MiB pieces spread evenly, the rest holes.
python3 - "$WORK/sparse.img" "$(numfmt --from=iec "$SPARSE_SIZE")" "$DATA_PERCENT" <<'PY'
import os, sys
path, size, pct = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mib = 1 << 20
with open(path, "wb") as f:
    f.truncate(size)
    step = max(mib, mib * 100 // max(pct, 1))
    for off in range(0, size - mib + 1, step):
        f.seek(off)
        f.write(os.urandom(mib))
PY
DATA_BYTES=$(python3 -c "import os; s=os.stat('$WORK/sparse.img'); print(s.st_blocks * 512)")
dhrd sparse "$WORK/sparse.img" --tls on --tls-certificates "$PKI"
wait_loaded sparse
# sparse_row LABEL: appends what the server read since the last row (status file).
LAST_READ=0
LAST_BS=0
sparse_row() {
  sleep 1.2 # the status file is rewritten every second
  python3 - "$1" "$WORK/sparse.status" "$(numfmt --from=iec "$SPARSE_SIZE")" "$DATA_BYTES" \
    "$LAST_READ" "$LAST_BS" >> "$RESULTS" <<'PY'
import json, sys
label, path = sys.argv[1], sys.argv[2]
size, data, last_read, last_bs = map(int, sys.argv[3:])
st = json.load(open(path))["nbd"]
read = st["bytes_read"] - last_read
print(json.dumps({"test": label, "export_bytes": size, "data_bytes": data,
                  "bytes_read": read, "read_share": round(read / size, 4),
                  "block_status_requests": st["block_status"] - last_bs,
                  "total_read": st["bytes_read"], "total_bs": st["block_status"]}))
PY
  tail -1 "$RESULTS"
  LAST_READ=$(tail -1 "$RESULTS" | python3 -c "import json,sys; print(json.load(sys.stdin)['total_read'])")
  LAST_BS=$(tail -1 "$RESULTS" | python3 -c "import json,sys; print(json.load(sys.stdin)['total_bs'])")
}
HOME=$WORK/home nbdcopy "nbds+unix:///?socket=$WORK/sparse.sock" null:
sparse_row "nbdcopy sparse tls"
qemu-img convert -O raw --object "tls-creds-x509,id=tls0,endpoint=client,dir=$WORK/home/.pki/libnbd" \
  --image-opts "driver=nbd,server.type=unix,server.path=$WORK/sparse.sock,tls-creds=tls0,tls-hostname=localhost" \
  "$WORK/sparse-copy.img"
rm -f "$WORK/sparse-copy.img"
sparse_row "qemu-img convert sparse tls"


python3 - "$RESULTS" "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = sys.argv[2]
def find(test, rw, qd):
    return next((r for r in rows if r["test"] == test and r.get("rw") == rw and r.get("qd") == qd), None)
ratios = {}
for qd in (1, 8):
    t, p = find("dhrd tls", "randread", qd), find("dhrd plain", "randread", qd)
    if t and p and p["iops"]:
        ratios[f"randread_4k_qd{qd}_tls_vs_plain"] = round(t["iops"] / p["iops"], 3)
    t, p = find("nbdkit memory tls", "randread", qd), find("nbdkit memory plain", "randread", qd)
    if t and p and p["iops"]:
        ratios[f"nbdkit_randread_4k_qd{qd}_tls_vs_plain"] = round(t["iops"] / p["iops"], 3)
t, n = find("dhrd tls", "read", 4), find("nbdkit memory tls", "read", 4)
if t and n and n["mib_s"]:
    ratios["seqread_1m_tls_vs_nbdkit_memory_tls"] = round(t["mib_s"] / n["mib_s"], 3)
sparse = [r for r in rows if "read_share" in r]
json.dump({"rows": rows, "ratios": ratios}, open(f"{out}/results.json", "w"), indent=1)
lines = ["| test | workload | IOPS | MiB/s | p99 us |", "|---|---|---|---|---|"]
for r in rows:
    if "iops" in r:
        lines.append(f"| {r['test']} | {r['rw']} {r['bs']} QD{r['qd']} | {r['iops']} | {r['mib_s']} | {r['lat_us_p99']} |")
lines.append("")
targets = {"randread_4k_qd1_tls_vs_plain": ">= 0.8", "randread_4k_qd8_tls_vs_plain": ">= 0.9",
           "nbdkit_randread_4k_qd1_tls_vs_plain": "reference", "nbdkit_randread_4k_qd8_tls_vs_plain": "reference",
           "seqread_1m_tls_vs_nbdkit_memory_tls": ">= 1.0"}
lines += ["| ratio | value | target |", "|---|---|---|"]
lines += [f"| {k} | {v} | {targets.get(k, '')} |" for k, v in ratios.items()]
for s in sparse:
    lines += ["", f"{s['test']}: a {s['export_bytes']}-byte export with {s['data_bytes']} bytes of data: "
              f"{s['bytes_read']} bytes read ({s['read_share']:.1%} of the export; target <= 15%), "
              f"{s['block_status_requests']} block status requests."]
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
