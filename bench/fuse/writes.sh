#!/usr/bin/env bash
# Focused, interleaved comparison of `dhrd mount --durability sync` writes with the raw
# disk, for iterating on the write path. Each round runs, in a rotated order: raw
# O_DIRECT+O_DSYNC 4 KiB random writes, and the same through a mount of each dhrd binary
# given (so two builds can be compared in the same run), at 1 and 8 jobs, then the mixed
# 66:34 job through that mount; and a tmpfs 4 KiB random read (for the mixed target's
# formula). Ratios are computed per round against that round's raw run; medians over
# rounds are printed. Every configuration writes the same file, one at a time (a mount is
# made for its turn and unmounted after it): two files filled alike on the same file
# system differ by up to 30% in O_DSYNC write rate on these VMs (docs/benchmarks.md).
#
# Usage: bench/fuse/writes.sh [--rounds 5] [--runtime 4] [--size 512M] [--disk-dir /var/tmp]
#                             [--out DIR] [--extra-raw] NAME=DHRD_BINARY[:MOUNT_ARGS]...
# --extra-raw adds raw O_DIRECT + fdatasync per write runs (fio --fdatasync=1). MOUNT_ARGS
# are extra `dhrd mount` arguments, e.g. nice0=target/release/dhrd:--worker-nice=0.
set -euo pipefail

ROUNDS=5
RUNTIME=4
SIZE=512M
DISK_DIR=/var/tmp
OUT=
EXTRA_RAW=0
BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --extra-raw) EXTRA_RAW=1; shift ;;
    *=*) BINS+=("$1"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ ${#BINS[@]} -gt 0 ] || { echo "give at least one NAME=DHRD_BINARY" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/dhrd-writes.XXXXXX)}
mkdir -p "$OUT"
WORK=$DISK_DIR/dhrd-writes.$$
TMPFS=$WORK/tmpfs
DATA_DIR=$WORK/backing
mkdir -p "$DATA_DIR" "$WORK/mnt" "$TMPFS"
NAMES=()
declare -A BIN ARGS
for b in "${BINS[@]}"; do
  n=${b%%=*}; NAMES+=("$n"); v=${b#*=}; BIN[$n]=${v%%:*}
  ARGS[$n]=; [ "$v" != "${v#*:}" ] && ARGS[$n]=${v#*:}
done
MNT=$WORK/mnt
MOUNTED=
cleanup() {
  if [ -n "$MOUNTED" ]; then
    "${BIN[$MOUNTED]}" umount "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  umount "$TMPFS" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fio --name=fill --filename="$DATA_DIR/data" --rw=write --bs=1M --size=$SIZE --output=/dev/null
mount -t tmpfs -o size=$(( $(numfmt --from=iec "$SIZE") * 2 )) tmpfs "$TMPFS"
cp "$DATA_DIR/data" "$TMPFS/data"
sync
mount_dhrd() { # name: mounts the one backing with that binary, returns once loaded
  local n=$1
  # shellcheck disable=SC2086 # ARGS is a list of words
  "${BIN[$n]}" mount "$DATA_DIR" "$MNT" --durability sync --quiet ${ARGS[$n]} >> "$OUT/daemon-$n.log" 2>&1 &
  MOUNTED=$n
  for _ in $(seq 1 200); do mountpoint -q "$MNT" && break; sleep 0.05; done
  for _ in $(seq 1 600); do "${BIN[$n]}" status "$MNT" 2>/dev/null | grep -q complete && break; sleep 0.1; done
}
umount_dhrd() { # name: keeps its status, then unmounts
  local n=$1
  "${BIN[$n]}" status "$MNT" > "$OUT/status-$n.txt" 2>&1 || true
  "${BIN[$n]}" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT"
  for _ in $(seq 1 200); do mountpoint -q "$MNT" || break; sleep 0.05; done
  MOUNTED=
}

COMMON="--ioengine=psync --iodepth=1 --bs=4k --size=$SIZE --runtime=$RUNTIME --time_based --group_reporting --randrepeat=0 --norandommap --output-format=json"
run() { # file name, fio args...
  local f=$1; shift
  fio --name=x $COMMON "$@" > "$OUT/$f.json"
}
# The configurations, in base order; rotated each round.
configs() {
  echo "raw"
  [ "$EXTRA_RAW" = 1 ] && echo "rawfds"
  for n in "${NAMES[@]}"; do echo "dhrd-$n"; done
}
run_config() { # config, round
  local c=$1 r=$2 j
  case "$c" in
    raw) for j in 1 8; do
           run "r$r-w-j$j-raw" --filename="$DATA_DIR/data" --rw=randwrite --numjobs=$j --direct=1 --sync=dsync
         done ;;
    rawfds) for j in 1 8; do
           run "r$r-w-j$j-rawfds" --filename="$DATA_DIR/data" --rw=randwrite --numjobs=$j --direct=1 --fdatasync=1
         done ;;
    dhrd-*) local n=${c#dhrd-}
         mount_dhrd "$n"
         for j in 1 8; do
           run "r$r-w-j$j-$c" --filename="$MNT/data" --rw=randwrite --numjobs=$j
         done
         run "r$r-mixed-$c" --filename="$MNT/data" --rw=randrw --rwmixread=66 --numjobs=1
         umount_dhrd "$n" ;;
  esac
}
for r in $(seq 1 "$ROUNDS"); do
  mapfile -t cs < <(configs)
  k=$(( (r - 1) % ${#cs[@]} ))
  for i in $(seq 0 $(( ${#cs[@]} - 1 ))); do
    c=${cs[$(( (i + k) % ${#cs[@]} ))]}
    echo "round $r $c" >&2
    run_config "$c" "$r"
  done
  run "r$r-tmpfsread" --filename="$TMPFS/data" --rw=randread --numjobs=1 --runtime=2
done

python3 - "$OUT" "$ROUNDS" "${NAMES[@]}" <<'PY'
import json, os, statistics as st, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(f):
    p = os.path.join(out, f + '.json')
    if not os.path.exists(p):
        return None
    return json.load(open(p))['jobs'][0]
def w(f):
    j = load(f)
    return (j['write']['iops'], j['write']['clat_ns']['mean'] / 1e3) if j else None
med = lambda xs: st.median(xs) if xs else float('nan')
lines = []
for jobs in (1, 8):
    raw = [w(f'r{r}-w-j{jobs}-raw') for r in range(1, rounds + 1)]
    lines.append(f'j{jobs} raw O_DIRECT+O_DSYNC: median {med([x[0] for x in raw]):.0f} IOPS, {med([x[1] for x in raw]):.1f} us mean lat')
    fds = [w(f'r{r}-w-j{jobs}-rawfds') for r in range(1, rounds + 1)]
    if all(fds):
        rat = [f[0] / x[0] for f, x in zip(fds, raw)]
        lines.append(f'j{jobs} raw O_DIRECT+fdatasync: median {med([x[0] for x in fds]):.0f} IOPS, {med([x[1] for x in fds]):.1f} us; per-round ratio to dsync {["%.2f" % x for x in rat]} median {med(rat):.3f}')
    for n in names:
        d = [w(f'r{r}-w-j{jobs}-dhrd-{n}') for r in range(1, rounds + 1)]
        rat = [a[0] / b[0] for a, b in zip(d, raw)]
        lines.append(f'j{jobs} dhrd {n}: median {med([x[0] for x in d]):.0f} IOPS, {med([x[1] for x in d]):.1f} us; per-round ratio {["%.2f" % x for x in rat]} median {med(rat):.3f}')
for n in names:
    rat, wl, rl = [], [], []
    for r in range(1, rounds + 1):
        m, t, raw = load(f'r{r}-mixed-dhrd-{n}'), load(f'r{r}-tmpfsread'), w(f'r{r}-w-j1-raw')
        ideal = 1e6 / (0.66 * t['read']['clat_ns']['mean'] / 1e3 + 0.34 * raw[1])
        rat.append((m['read']['iops'] + m['write']['iops']) / ideal)
        wl.append(m['write']['clat_ns']['mean'] / 1e3); rl.append(m['read']['clat_ns']['mean'] / 1e3)
    lines.append(f'mixed dhrd {n}: read {med(rl):.1f} us, write {med(wl):.1f} us; per-round ratio to ideal {["%.2f" % x for x in rat]} median {med(rat):.3f}')
open(os.path.join(out, 'summary.txt'), 'w').write('\n'.join(lines) + '\n')
print('\n'.join(lines))
PY
echo "results in $OUT" >&2
