#!/usr/bin/env bash
# FUSE benchmark of dhrd (issue 3): fio 4 KiB random I/O at QD1 against every read path of
# `dhrd mount`, tmpfs, an ext4 file warm in the page cache and the disk with O_DIRECT;
# sync random writes against O_DIRECT+O_DSYNC on the disk; mixed 66:34.
#
# The machine this runs on is shared and its disk and CPUs are noisy, so every
# configuration runs once per round, rounds repeat (--rounds), the order inside a round
# rotates, and every ratio is computed per round from runs of that round (seconds apart)
# before its median over the rounds is taken. All mounts stay up for the whole run.
# Writes fio JSON per run, results.md and summary.json (medians, per-round ratios, targets)
# and machine.txt under bench/results/fuse-<date>/. Needs root, fio, fuse3. Speeds are
# reported, never asserted.
#
# Usage: bench/fuse/run.sh [--size 1G] [--runtime 5] [--rounds 5] [--disk-dir /var/tmp]
set -euo pipefail

SIZE=1G
RUNTIME=5
ROUNDS=5
DISK_DIR=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
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
READ_PATHS="passthrough auto direct cached"
mkdir -p "$WORK/plain" "$TMPFS"
for rp in $READ_PATHS; do mkdir -p "$WORK/backing-$rp" "$WORK/mnt-$rp"; done
declare -A DAEMON
cleanup() {
  for rp in $READ_PATHS; do
    if [ -n "${DAEMON[$rp]:-}" ]; then
      "$DHRD" umount "$WORK/mnt-$rp" 2>/dev/null || kill "${DAEMON[$rp]}" 2>/dev/null || true
    fi
    fusermount3 -uz "$WORK/mnt-$rp" 2>/dev/null || true
  done
  wait 2>/dev/null || true
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
  dev=$(basename "$(df "$DISK_DIR" | awk 'NR==2{print $1}')")
  [ -r "/sys/block/$dev/queue/fua" ] && echo "disk queue: fua $(cat /sys/block/$dev/queue/fua), write cache $(cat /sys/block/$dev/queue/write_cache)"
  echo "fio: $(fio --version)"
  echo "dhrd: $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "size: $SIZE, runtime: ${RUNTIME}s per run, rounds: $ROUNDS"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

COMMON="--ioengine=psync --iodepth=1 --bs=4k --size=$SIZE --runtime=$RUNTIME --time_based --group_reporting --randrepeat=0 --norandommap --output-format=json"

run() { # file name, fio args...
  local name=$1; shift
  echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) $name" >> "$OUT/runs.log"
  fio --name="$name" $COMMON "$@" > "$OUT/$name.json"
}

# Data files: the same random content everywhere. Reads use `data` (mode 0444: `auto`
# passthroughs read-only opens of files without write permission bits); writes use
# `wdata`, a separate file, so that raw O_DIRECT writes never evict the warm ext4 copy.
head -c "$SIZE" /dev/urandom > "$WORK/plain/data" 2>/dev/null || fio --name=fill --filename="$WORK/plain/data" --rw=write --bs=1M --size=$SIZE --output=/dev/null
cp "$WORK/plain/data" "$WORK/plain/wdata"
for rp in $READ_PATHS; do
  cp "$WORK/plain/data" "$WORK/backing-$rp/data"
  chmod 0444 "$WORK/backing-$rp/data"
done
cp "$WORK/plain/data" "$WORK/backing-auto/wdata"
cp "$WORK/plain/data" "$WORK/backing-cached/wdata"
mount -t tmpfs -o size=$(( $(numfmt --from=iec "$SIZE") * 2 )) tmpfs "$TMPFS"
cp "$WORK/plain/data" "$TMPFS/data"
sync

# One mount per read path, all sync durability; writes go through the `auto` mount (the
# default), to a writable file, so they and the mixed job's reads take the `direct` path.
for rp in $READ_PATHS; do
  "$DHRD" mount "$WORK/backing-$rp" "$WORK/mnt-$rp" --read-path "$rp" --durability sync --quiet > "$OUT/daemon-$rp.log" 2>&1 &
  DAEMON[$rp]=$!
  for _ in $(seq 1 200); do mountpoint -q "$WORK/mnt-$rp" && break; sleep 0.05; done
  for _ in $(seq 1 1200); do "$DHRD" status "$WORK/mnt-$rp" 2>/dev/null | grep -q complete && break; sleep 0.1; done
done
# The cached path's page cache and the warm ext4 copy start warm.
cat "$WORK/mnt-cached/data" > /dev/null
cat "$WORK/mnt-cached/wdata" > /dev/null
cat "$WORK/plain/data" > /dev/null

read_run() { # config, jobs, round
  local c=$1 j=$2 r=$3
  case "$c" in
    tmpfs) run "r$r-randread-tmpfs-j$j" --filename="$TMPFS/data" --rw=randread --numjobs=$j ;;
    ext4warm)
      cat "$WORK/plain/data" > /dev/null
      run "r$r-randread-ext4warm-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --invalidate=0 ;;
    diskdirect) run "r$r-randread-diskdirect-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --direct=1 ;;
    *) run "r$r-randread-dhrd-$c-j$j" --filename="$WORK/mnt-$c/data" --rw=randread --numjobs=$j --invalidate=0 ;;
  esac
}
write_run() { # config, jobs, round
  local c=$1 j=$2 r=$3
  case "$c" in
    raw) run "r$r-randwrite-diskdirect-dsync-j$j" --filename="$WORK/plain/wdata" --rw=randwrite --numjobs=$j --direct=1 --sync=dsync ;;
    dhrd) run "r$r-randwrite-dhrd-sync-j$j" --filename="$WORK/mnt-auto/wdata" --rw=randwrite --numjobs=$j ;;
    mixed) run "r$r-randrw6634-dhrd-sync-j1" --filename="$WORK/mnt-auto/wdata" --rw=randrw --rwmixread=66 --numjobs=1 ;;
    # The same job with --read-path cached: reads from a warm page cache (fio must not
    # drop it at start), writes still synchronous through the daemon.
    mixedcached)
      cat "$WORK/mnt-cached/wdata" > /dev/null
      run "r$r-randrw6634-dhrd-cached-j1" --filename="$WORK/mnt-cached/wdata" --rw=randrw --rwmixread=66 --numjobs=1 --invalidate=0 ;;
  esac
}
rotate() { # round, items... -> items rotated by round
  local r=$1; shift
  local a=("$@") n=$#
  for i in $(seq 0 $(( n - 1 ))); do echo "${a[$(( (i + r) % n ))]}"; done
}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r of $ROUNDS" >&2
  for j in 1 2; do
    for c in $(rotate "$r" tmpfs ext4warm diskdirect $READ_PATHS); do read_run "$c" "$j" "$r"; done
  done
  for c in $(rotate "$r" raw dhrd); do write_run "$c" 1 "$r"; done
  for c in $(rotate "$r" raw dhrd); do write_run "$c" 8 "$r"; done
  for c in $(rotate "$r" mixed mixedcached); do write_run "$c" 1 "$r"; done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
for rp in $READ_PATHS; do
  "$DHRD" status "$WORK/mnt-$rp" > "$OUT/status-$rp.txt" 2>&1 || true
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def load(r, name):
    p = os.path.join(out, f'r{r}-{name}.json')
    if not os.path.exists(p):
        return None
    j = json.load(open(p))['jobs'][0]
    v = {}
    for k in ('read', 'write'):
        if j[k]['io_bytes'] > 0:
            v[k + '_iops'] = j[k]['iops']
            v[k + '_lat_mean_us'] = j[k]['clat_ns']['mean'] / 1000
            v[k + '_lat_p99_us'] = j[k]['clat_ns']['percentile'].get('99.000000', 0) / 1000
    return v

names = sorted({f.split('-', 1)[1][:-5] for f in os.listdir(out)
                if f.startswith('r') and f.endswith('.json') and '-' in f})
runs = {n: [load(r, n) for r in range(1, rounds + 1)] for n in names}

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def per_round(f):
    out = []
    for r in range(1, rounds + 1):
        try:
            out.append(f(r))
        except (TypeError, KeyError, ZeroDivisionError):
            out.append(None)
    return out

def g(r, n, k):
    v = runs.get(n, [None] * rounds)[r - 1]
    return v[k]

ratios = {}
def ratio(label, target, f):
    xs = per_round(f)
    ok = [x for x in xs if x is not None]
    if ok:
        ratios[label] = {'median': round(med(ok), 3), 'min': round(min(ok), 3),
                         'max': round(max(ok), 3), 'target': target,
                         'per_round': [None if x is None else round(x, 3) for x in xs]}

for j in (1, 2):
    ratio(f'passthrough / tmpfs, j{j}', '>= 0.9',
          lambda r: g(r, f'randread-dhrd-passthrough-j{j}', 'read_iops') / g(r, f'randread-tmpfs-j{j}', 'read_iops'))
    ratio(f'auto (0444 file, passthrough) / tmpfs, j{j}', '',
          lambda r: g(r, f'randread-dhrd-auto-j{j}', 'read_iops') / g(r, f'randread-tmpfs-j{j}', 'read_iops'))
    ratio(f'direct / disk O_DIRECT, j{j}', '>= 2',
          lambda r: g(r, f'randread-dhrd-direct-j{j}', 'read_iops') / g(r, f'randread-diskdirect-j{j}', 'read_iops'))
for j, t in ((1, '>= 0.7'), (8, '>= 1.0')):
    ratio(f'sync write / disk O_DIRECT+O_DSYNC, j{j}', t,
          lambda r: g(r, f'randwrite-dhrd-sync-j{j}', 'write_iops') / g(r, f'randwrite-diskdirect-dsync-j{j}', 'write_iops'))

def mixed(name):
    def f(r):
        tr = g(r, 'randread-tmpfs-j1', 'read_lat_mean_us')
        tw = g(r, 'randwrite-diskdirect-dsync-j1', 'write_lat_mean_us')
        m = runs[name][r - 1]
        ideal = 1e6 / (0.66 * tr + 0.34 * tw)
        return (m.get('read_iops', 0) + m.get('write_iops', 0)) / ideal
    return f
ratio('mixed 66:34 / 1/(0.66 t_read_tmpfs + 0.34 t_write_dsync), j1', '>= 0.8',
      mixed('randrw6634-dhrd-sync-j1'))
ratio('mixed 66:34, --read-path cached (warm page cache) / same formula, j1', '',
      mixed('randrw6634-dhrd-cached-j1'))

medians = {}
for n, vs in runs.items():
    keys = sorted({k for v in vs if v for k in v})
    medians[n] = {k: round(med([v.get(k) for v in vs if v]), 2) for k in keys}
json.dump({'rounds': rounds, 'medians': medians, 'ratios': ratios,
           'runs': {n: vs for n, vs in runs.items()}},
          open(os.path.join(out, 'summary.json'), 'w'), indent=1)
with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write(f'Medians over {rounds} interleaved rounds.\n\n')
    f.write('| run | read IOPS | read mean us | read p99 us | write IOPS | write mean us | write p99 us |\n|---|---|---|---|---|---|---|\n')
    for n, v in medians.items():
        c = lambda k: '' if k not in v else (f'{v[k]:.0f}' if k.endswith('iops') else f'{v[k]:.1f}')
        f.write(f"| {n} | {c('read_iops')} | {c('read_lat_mean_us')} | {c('read_lat_p99_us')} | {c('write_iops')} | {c('write_lat_mean_us')} | {c('write_lat_p99_us')} |\n")
    f.write('\nRatios computed per round (runs of the same round), then the median over rounds.\n\n')
    f.write('| ratio | median | min | max | target | per round |\n|---|---|---|---|---|---|\n')
    for k, v in ratios.items():
        pr = ' '.join('-' if x is None else f'{x:.2f}' for x in v['per_round'])
        f.write(f"| {k} | {v['median']} | {v['min']} | {v['max']} | {v['target']} | {pr} |\n")
print(open(os.path.join(out, 'results.md')).read())
PY
echo "results in $OUT" >&2
