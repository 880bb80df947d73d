#!/usr/bin/env bash
# FUSE benchmark of dhrd: fio at QD1 through `dhrd mount` on its default data path (the
# backing files' page cache, passed through) and on the engine's passthrough path,
# against tmpfs, an ext4 file warm in the page cache and the disk with O_DIRECT:
# - 4 KiB random reads of a 0644 file opened read-only and read-write, 1 and 2 jobs;
# - 1 MiB sequential reads;
# - 4 KiB sync random writes against O_DIRECT+O_DSYNC on the disk: 1 writer, 8 writers on
#   one file, 8 writers on 8 files; on dhrd also 8 O_DIRECT writers on one file (those
#   opens are served by the daemon);
# - mixed 66:34 on one read-write open against 1/(0.66 t_read(tmpfs) + 0.34 t_write(dsync)).
#
# The machine is shared and noisy, so every configuration runs once per round, rounds
# repeat (--rounds), the order inside a round rotates, and every ratio is computed per
# round from runs of that round before its median over the rounds is taken. All mounts
# stay up for the whole run. Writes fio JSON per run, results.md, summary.json and
# machine.txt under bench/results/<date>-fuse/ (bench/new-run-dir.sh). Needs root, fio,
# fuse3. Speeds are reported, never asserted.
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
OUT=$("$ROOT/bench/new-run-dir.sh" fuse)
WORK=$DISK_DIR/dhrd-fuse-bench.$$
TMPFS=/tmp/dhrd-fuse-bench-tmpfs.$$
# The default data path and the engine's best read path, for comparison.
READ_PATHS="pagecache engine-passthrough"
mkdir -p "$WORK/plain" "$WORK/plain8" "$TMPFS"
for rp in $READ_PATHS; do mkdir -p "$WORK/backing-$rp/w8" "$WORK/mnt-$rp"; done
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
BYTES=$(numfmt --from=iec "$SIZE")
EIGHTH=$(( BYTES / 8 ))

run() { # file name, fio args...
  local name=$1; shift
  echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) $name" >> "$OUT/runs.log"
  fio --name="$name" $COMMON "$@" > "$OUT/$name.json"
}

# Data files: the same random content everywhere, mode 0644 (ordinary files). Reads use
# `data`; writes use `wdata` (one file) and w8/w8.N.0 (one per job), separate files so
# that raw O_DIRECT writes never evict the warm ext4 copy of `data`.
head -c "$SIZE" /dev/urandom > "$WORK/plain/data"
cp "$WORK/plain/data" "$WORK/plain/wdata"
for j in 0 1 2 3 4 5 6 7; do head -c "$EIGHTH" "$WORK/plain/data" > "$WORK/plain8/w8.$j.0"; done
for rp in $READ_PATHS; do
  cp "$WORK/plain/data" "$WORK/plain/wdata" "$WORK/backing-$rp/"
  cp "$WORK/plain8/"* "$WORK/backing-$rp/w8/"
done
mount -t tmpfs -o size=$(( BYTES * 2 )) tmpfs "$TMPFS"
cp "$WORK/plain/data" "$TMPFS/data"
# As after a boot: nothing of the backing files cached, so the mounts' warm-up reads them
# in (with large folios, as reads make them; the copies above made small ones).
sync
echo 3 > /proc/sys/vm/drop_caches

# One mount per data path, sync durability.
for rp in $READ_PATHS; do
  "$DHRD" mount "$WORK/backing-$rp" "$WORK/mnt-$rp" --read-path "$rp" --durability sync --quiet > "$OUT/daemon-$rp.log" 2>&1 &
  DAEMON[$rp]=$!
  for _ in $(seq 1 200); do mountpoint -q "$WORK/mnt-$rp" && break; sleep 0.05; done
  for _ in $(seq 1 1200); do "$DHRD" status "$WORK/mnt-$rp" 2>/dev/null | grep -q complete && break; sleep 0.1; done
done
cat "$WORK/plain/data" > /dev/null

read_run() { # config, jobs, round
  local c=$1 j=$2 r=$3
  case "$c" in
    tmpfs) run "r$r-randread-tmpfs-j$j" --filename="$TMPFS/data" --rw=randread --numjobs=$j ;;
    ext4warm)
      cat "$WORK/plain/data" > /dev/null
      run "r$r-randread-ext4warm-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --invalidate=0 ;;
    diskdirect) run "r$r-randread-diskdirect-j$j" --filename="$WORK/plain/data" --rw=randread --numjobs=$j --direct=1 ;;
    # A read-only open, and a read-write open (fio's randrw with 100% reads opens O_RDWR).
    pagecache-ro) run "r$r-randread-dhrd-pagecache-ro-j$j" --filename="$WORK/mnt-pagecache/data" --rw=randread --numjobs=$j --invalidate=0 --readonly ;;
    pagecache-rw) run "r$r-randread-dhrd-pagecache-rw-j$j" --filename="$WORK/mnt-pagecache/data" --rw=randrw --rwmixread=100 --numjobs=$j --invalidate=0 ;;
    engine-rw) run "r$r-randread-dhrd-engine-rw-j$j" --filename="$WORK/mnt-engine-passthrough/data" --rw=randrw --rwmixread=100 --numjobs=$j --invalidate=0 ;;
  esac
}
seq_run() { # config, round
  local c=$1 r=$2
  case "$c" in
    tmpfs) run "r$r-seqread-tmpfs-j1" --filename="$TMPFS/data" --rw=read --bs=1M ;;
    pagecache) run "r$r-seqread-dhrd-pagecache-j1" --filename="$WORK/mnt-pagecache/data" --rw=read --bs=1M --invalidate=0 ;;
  esac
}
write_run() { # config, round
  local c=$1 r=$2
  case "$c" in
    raw1) run "r$r-randwrite-diskdirect-dsync-j1" --filename="$WORK/plain/wdata" --rw=randwrite --direct=1 --sync=dsync ;;
    raw8) run "r$r-randwrite-diskdirect-dsync-j8" --filename="$WORK/plain/wdata" --rw=randwrite --numjobs=8 --direct=1 --sync=dsync ;;
    raw8f) run "r$r-randwrite-diskdirect-dsync-f8" --directory="$WORK/plain8" --filename_format='w8.$jobnum.0' --size="$EIGHTH" --rw=randwrite --numjobs=8 --direct=1 --sync=dsync ;;
    pc1) run "r$r-randwrite-dhrd-pagecache-j1" --filename="$WORK/mnt-pagecache/wdata" --rw=randwrite ;;
    pc8) run "r$r-randwrite-dhrd-pagecache-j8" --filename="$WORK/mnt-pagecache/wdata" --rw=randwrite --numjobs=8 ;;
    pc8f) run "r$r-randwrite-dhrd-pagecache-f8" --directory="$WORK/mnt-pagecache/w8" --filename_format='w8.$jobnum.0' --size="$EIGHTH" --rw=randwrite --numjobs=8 ;;
    pc8d) run "r$r-randwrite-dhrd-pagecache-odirect-j8" --filename="$WORK/mnt-pagecache/wdata" --rw=randwrite --numjobs=8 --direct=1 ;;
    eng1) run "r$r-randwrite-dhrd-engine-j1" --filename="$WORK/mnt-engine-passthrough/wdata" --rw=randwrite ;;
    mixed) run "r$r-randrw6634-dhrd-pagecache-j1" --filename="$WORK/mnt-pagecache/wdata" --rw=randrw --rwmixread=66 --invalidate=0 ;;
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
    for c in $(rotate "$r" tmpfs ext4warm diskdirect pagecache-ro pagecache-rw engine-rw); do read_run "$c" "$j" "$r"; done
  done
  for c in $(rotate "$r" tmpfs pagecache); do seq_run "$c" "$r"; done
  for c in $(rotate "$r" raw1 pc1 eng1 mixed); do write_run "$c" "$r"; done
  for c in $(rotate "$r" raw8 pc8 pc8d raw8f pc8f); do write_run "$c" "$r"; done
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
            v[k + '_bw_bytes'] = j[k]['bw_bytes']
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
    for o in ('ro', 'rw'):
        ratio(f'4 KiB random read, 0644 file, {o} open / tmpfs, j{j}', '>= 0.95',
              lambda r: g(r, f'randread-dhrd-pagecache-{o}-j{j}', 'read_iops') / g(r, f'randread-tmpfs-j{j}', 'read_iops'))
    ratio(f'engine-passthrough, rw open (direct path) / tmpfs, j{j}', '',
          lambda r: g(r, f'randread-dhrd-engine-rw-j{j}', 'read_iops') / g(r, f'randread-tmpfs-j{j}', 'read_iops'))
    ratio(f'ext4 warm / tmpfs, j{j}', '',
          lambda r: g(r, f'randread-ext4warm-j{j}', 'read_iops') / g(r, f'randread-tmpfs-j{j}', 'read_iops'))
ratio('1 MiB sequential read / tmpfs', '>= 0.9',
      lambda r: g(r, 'seqread-dhrd-pagecache-j1', 'read_bw_bytes') / g(r, 'seqread-tmpfs-j1', 'read_bw_bytes'))
for lab, num, den in (('1 writer', 'pagecache-j1', 'j1'), ('8 writers, one file', 'pagecache-j8', 'j8'),
                      ('8 writers, 8 files', 'pagecache-f8', 'f8'),
                      ('8 O_DIRECT writers, one file (daemon)', 'pagecache-odirect-j8', 'j8'),
                      ('engine, 1 writer', 'engine-j1', 'j1')):
    ratio(f'4 KiB sync write, {lab} / disk O_DIRECT+O_DSYNC', '>= 1.0' if 'engine' not in lab and 'O_DIRECT' not in lab else '',
          lambda r: g(r, f'randwrite-dhrd-{num}', 'write_iops') / g(r, f'randwrite-diskdirect-dsync-{den}', 'write_iops'))

def mixed(name):
    def f(r):
        tr = g(r, 'randread-tmpfs-j1', 'read_lat_mean_us')
        tw = g(r, 'randwrite-diskdirect-dsync-j1', 'write_lat_mean_us')
        m = runs[name][r - 1]
        ideal = 1e6 / (0.66 * tr + 0.34 * tw)
        return (m.get('read_iops', 0) + m.get('write_iops', 0)) / ideal
    return f
ratio('mixed 66:34 / 1/(0.66 t_read_tmpfs + 0.34 t_write_dsync), j1', '>= 0.9',
      mixed('randrw6634-dhrd-pagecache-j1'))

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
