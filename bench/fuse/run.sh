#!/usr/bin/env bash
# FUSE benchmark of dhrd (issue 3): fio 4 KiB random I/O at QD1 against every read path of
# `dhrd mount`, tmpfs, an ext4 file warm in the page cache and the disk with O_DIRECT;
# sync random writes against O_DIRECT+O_DSYNC on the disk; mixed 66:34.
# One run of each; writes fio JSON, a table (results.md) and summary.json to
# bench/results/fuse-<date>/. Needs root, fio, fuse3. Speeds are reported, never asserted.
#
# Usage: bench/fuse/run.sh [--size 1G] [--runtime 10] [--disk-dir /var/tmp]
set -euo pipefail

SIZE=1G
RUNTIME=10
DISK_DIR=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p dhrd --manifest-path "$ROOT/Cargo.toml" >&2
DHRD=$CARGO_TARGET_DIR/release/dhrd
OUT=$ROOT/bench/results/fuse-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
WORK=$DISK_DIR/dhrd-fuse-bench.$$
TMPFS=/tmp/dhrd-fuse-bench-tmpfs.$$
mkdir -p "$WORK/backing" "$WORK/mnt" "$WORK/plain" "$TMPFS"
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && { "$DHRD" umount "$WORK/mnt" 2>/dev/null || kill "$DAEMON" 2>/dev/null || true; }
  fusermount3 -uz "$WORK/mnt" 2>/dev/null || true
  umount "$TMPFS" 2>/dev/null || true
  rm -rf "$WORK" "$TMPFS"
}
trap cleanup EXIT

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "memory: $(free -h | awk '/Mem:/{print $2}')"
  echo "disk: $(df -T "$DISK_DIR" | awk 'NR==2{print $1" "$2}') $(lsblk -dno NAME,MODEL,ROTA 2>/dev/null | head -3 | tr '\n' ';')"
  echo "fio: $(fio --version)"
  echo "dhrd: $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "size: $SIZE, runtime: ${RUNTIME}s per job"
} > "$OUT/machine.txt"

COMMON="--ioengine=psync --iodepth=1 --bs=4k --size=$SIZE --runtime=$RUNTIME --time_based --group_reporting --randrepeat=0 --norandommap --output-format=json"

run() { # name, fio args...
  local name=$1; shift
  echo "== $name" >&2
  fio --name="$name" $COMMON "$@" > "$OUT/$name.json"
}

# Data files: the same random content everywhere.
head -c "$SIZE" /dev/urandom > "$WORK/backing/data" 2>/dev/null || fio --name=fill --filename="$WORK/backing/data" --rw=write --bs=1M --size=$SIZE --output=/dev/null
# auto passthroughs read-only opens of files without write permission bits.
chmod 0444 "$WORK/backing/data"
cp "$WORK/backing/data" "$WORK/plain/data"
mount -t tmpfs -o size=$(( $(numfmt --from=iec "$SIZE") * 2 )) tmpfs "$TMPFS"
cp "$WORK/backing/data" "$TMPFS/data"
sync

mount_dhrd() { # read path, durability
  "$DHRD" mount "$WORK/backing" "$WORK/mnt" --read-path "$1" --durability "$2" --quiet > "$OUT/daemon-$1-$2.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 1 200); do mountpoint -q "$WORK/mnt" && break; sleep 0.05; done
  # Wait for the load to complete.
  for _ in $(seq 1 1200); do "$DHRD" status "$WORK/mnt" 2>/dev/null | grep -q complete && break; sleep 0.1; done
}
umount_dhrd() {
  "$DHRD" status "$WORK/mnt" > "$OUT/status-$1.txt" 2>&1 || true
  "$DHRD" umount "$WORK/mnt"; wait "$DAEMON" || true; DAEMON=
}

for j in 1 2; do
  run "randread-tmpfs-j$j" --filename="$TMPFS/data" --rw=randread --numjobs=$j
  cat "$WORK/plain/data" > /dev/null
  run "randread-ext4warm-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --invalidate=0
  run "randread-diskdirect-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --direct=1
done
for rp in passthrough auto direct cached; do
  mount_dhrd "$rp" sync
  for j in 1 2; do
    run "randread-dhrd-$rp-j$j" --filename="$WORK/mnt/data" --rw=randread --numjobs=$j --invalidate=0
  done
  umount_dhrd "$rp"
done

# Writes: a writable copy (the read file is 0444).
cp "$WORK/plain/data" "$WORK/backing/wdata"
sync
# The disk is shared and noisy: each dhrd write run is bracketed by two raw runs and
# compared with their mean.
mount_dhrd auto sync
for j in 1 8; do
  run "randwrite-diskdirect-dsync-j$j-a" --filename="$WORK/plain/data" --rw=randwrite --numjobs=$j --direct=1 --sync=dsync
  run "randwrite-dhrd-sync-j$j" --filename="$WORK/mnt/wdata" --rw=randwrite --numjobs=$j
  run "randwrite-diskdirect-dsync-j$j-b" --filename="$WORK/plain/data" --rw=randwrite --numjobs=$j --direct=1 --sync=dsync
done
run "randwrite-diskdirect-dsync-j1-c" --filename="$WORK/plain/data" --rw=randwrite --numjobs=1 --direct=1 --sync=dsync
run "randrw6634-dhrd-sync-j1" --filename="$WORK/mnt/wdata" --rw=randrw --rwmixread=66 --numjobs=1
run "randwrite-diskdirect-dsync-j1-d" --filename="$WORK/plain/data" --rw=randwrite --numjobs=1 --direct=1 --sync=dsync
umount_dhrd write

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(os.listdir(out)):
    if not f.endswith('.json') or f == 'summary.json':
        continue
    d = json.load(open(os.path.join(out, f)))
    j = d['jobs'][0]
    r = {}
    for k in ('read', 'write'):
        if j[k]['io_bytes'] > 0:
            r[k + '_iops'] = round(j[k]['iops'])
            r[k + '_lat_mean_us'] = round(j[k]['clat_ns']['mean'] / 1000, 2)
            r[k + '_lat_p99_us'] = round(j[k]['clat_ns']['percentile'].get('99.000000', 0) / 1000, 2)
    rows[f[:-5]] = r
def g(n, k):
    return rows.get(n, {}).get(k)
tgt = {}
for j in (1, 2):
    t, p, d, dd = g(f'randread-tmpfs-j{j}', 'read_iops'), g(f'randread-dhrd-passthrough-j{j}', 'read_iops'), g(f'randread-dhrd-direct-j{j}', 'read_iops'), g(f'randread-diskdirect-j{j}', 'read_iops')
    if t and p: tgt[f'passthrough/tmpfs j{j} (target >= 0.9)'] = round(p / t, 3)
    if d and dd: tgt[f'direct/disk O_DIRECT j{j} (target >= 2)'] = round(d / dd, 3)
def mean(*xs):
    xs = [x for x in xs if x]
    return sum(xs) / len(xs) if xs else None
for j in (1, 8):
    w = g(f'randwrite-dhrd-sync-j{j}', 'write_iops')
    r = mean(g(f'randwrite-diskdirect-dsync-j{j}-a', 'write_iops'), g(f'randwrite-diskdirect-dsync-j{j}-b', 'write_iops'))
    if w and r: tgt[f'sync write/disk O_DIRECT+O_DSYNC j{j}, mean of the bracketing raw runs (target >= {0.7 if j == 1 else 1.0})'] = round(w / r, 3)
tr = g('randread-tmpfs-j1', 'read_lat_mean_us')
tw = mean(g('randwrite-diskdirect-dsync-j1-c', 'write_lat_mean_us'), g('randwrite-diskdirect-dsync-j1-d', 'write_lat_mean_us'))
m = rows.get('randrw6634-dhrd-sync-j1', {})
if tr and tw and m:
    ideal = 1e6 / (0.66 * tr + 0.34 * tw)
    got = m.get('read_iops', 0) + m.get('write_iops', 0)
    tgt['mixed 66:34 / ideal (target >= 0.8)'] = round(got / ideal, 3)
json.dump({'runs': rows, 'ratios': tgt}, open(os.path.join(out, 'summary.json'), 'w'), indent=1)
with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write('| run | read IOPS | read mean us | read p99 us | write IOPS | write mean us | write p99 us |\n|---|---|---|---|---|---|---|\n')
    for n, r in rows.items():
        f.write(f"| {n} | {r.get('read_iops','')} | {r.get('read_lat_mean_us','')} | {r.get('read_lat_p99_us','')} | {r.get('write_iops','')} | {r.get('write_lat_mean_us','')} | {r.get('write_lat_p99_us','')} |\n")
    f.write('\n| ratio | value |\n|---|---|\n')
    for k, v in tgt.items():
        f.write(f'| {k} | {v} |\n')
print(open(os.path.join(out, 'results.md')).read())
PY
echo "results in $OUT" >&2
