#!/usr/bin/env bash
# dhrd mount: mount-to-first-read and full-load time at several data sizes, compared with
# `cp -a` into tmpfs (log2ram's way) and, if installed, `vmtouch -t`; memory after the full
# load (daemon RSS incl. memfds, page cache left on the backing files). Also a tree of many
# small files: mount, walk, read everything; daemon RSS and descriptors. And a tree of
# mid-sized files, more than the object cache holds (--mid "N SIZE", "" to skip): full-load
# time against `cp -a` of the tree into tmpfs and `vmtouch -t`, bytes in RAM, daemon RSS.
# Writes startup.md / startup.json to bench/results/<date>-fuse-startup/. Needs root.
#
# Usage: bench/fuse/startup.sh [--sizes "1G 8G"] [--files 500000] [--mid "2500 2M"]
#                              [--disk-dir /var/tmp]
set -euo pipefail
SIZES="1G 8G"
FILES=500000
MID="2500 2M"
DISK_DIR=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --mid) MID=$2; shift 2 ;;
    --disk-dir) DISK_DIR=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p dhrd --manifest-path "$ROOT/Cargo.toml" >&2
DHRD=$CARGO_TARGET_DIR/release/dhrd
OUT=$("$ROOT/bench/new-run-dir.sh" fuse-startup)
WORK=$DISK_DIR/dhrd-fuse-startup.$$
TMPFS=/tmp/dhrd-fuse-startup-tmpfs.$$
mkdir -p "$WORK/mnt" "$TMPFS"
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && { "$DHRD" umount "$WORK/mnt" 2>/dev/null || kill "$DAEMON" 2>/dev/null || true; }
  fusermount3 -uz "$WORK/mnt" 2>/dev/null || true
  umount "$TMPFS" 2>/dev/null || true
  rm -rf "$WORK" "$TMPFS"
}
trap cleanup EXIT
now() { date +%s.%N; }
dropcaches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
{
  echo "date: $(date -u +%FT%TZ)"; echo "kernel: $(uname -r)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc)"
  echo "memory: $(free -h | awk '/Mem:/{print $2}')"; echo "dhrd: $(git -C "$ROOT" rev-parse --short HEAD)"
} > "$OUT/machine.txt"
echo "| data | mount to first read (ms) | full load (s) | cp -a to tmpfs (s) | vmtouch -t (s) | daemon RSS after load (MiB) | backing page cache (MiB) | limit 1.05 x data + 64 MiB |" > "$OUT/startup.md"
echo "|---|---|---|---|---|---|---|---|" >> "$OUT/startup.md"
for S in $SIZES; do
  B=$WORK/b-$S; mkdir -p "$B"
  fio --name=fill --filename="$B/data" --rw=write --bs=1M --size="$S" --refill_buffers --output=/dev/null
  chmod 0444 "$B/data"
  dropcaches
  t0=$(now)
  "$DHRD" mount "$B" "$WORK/mnt" --quiet > "$OUT/daemon-$S.log" 2>&1 &
  DAEMON=$!
  until dd if="$WORK/mnt/data" of=/dev/null bs=4k count=1 skip=12345 status=none 2>/dev/null; do sleep 0.001; done
  t1=$(now)
  until "$DHRD" status "$WORK/mnt" | grep -q complete; do sleep 0.05; done
  t2=$(now)
  pid=$DAEMON
  rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status)
  shm=$(awk '/RssShmem/{print int($2/1024)}' /proc/$pid/status)
  # memfds are not mapped whole; count their resident pages via fincore on /proc/PID/fd.
  memfd=0
  for fd in /proc/$pid/fd/*; do
    if readlink "$fd" | grep -q '^/memfd:'; then
      r=$(fincore -bno RES "$fd" 2>/dev/null || echo 0); memfd=$((memfd + r))
    fi
  done
  memfd=$((memfd / 1048576))
  pc=$(( $(fincore -bno RES "$B/data" 2>/dev/null || echo 0) / 1048576 ))
  "$DHRD" umount "$WORK/mnt"; wait "$DAEMON" || true; DAEMON=
  mount -t tmpfs -o size=$(( $(numfmt --from=iec "$S") * 2 )) tmpfs "$TMPFS" 2>/dev/null || true
  dropcaches
  t3=$(now); cp -a "$B/data" "$TMPFS/data"; t4=$(now); rm -f "$TMPFS/data"; umount "$TMPFS" || true
  vm="n/a"
  if command -v vmtouch >/dev/null; then dropcaches; t5=$(now); vmtouch -tq "$B/data"; t6=$(now); vm=$(echo "$t6 - $t5" | bc); fi
  bytes=$(numfmt --from=iec "$S")
  limit=$(( bytes * 105 / 100 / 1048576 + 64 ))
  printf "| %s | %.1f | %.2f | %.2f | %s | %s (memfd resident %s, RssShmem %s) | %s | %s |\n" "$S" \
    "$(echo "($t1 - $t0) * 1000" | bc)" "$(echo "$t2 - $t0" | bc)" "$(echo "$t4 - $t3" | bc)" "$vm" \
    "$((rss + memfd - shm))" "$memfd" "$shm" "$pc" "$limit" >> "$OUT/startup.md"
  rm -rf "$B"
done

# A tree of mid-sized files: more than the object cache holds, each over the size the walk
# parks right away.
if [ -n "$MID" ]; then
  read -r MID_N MID_SIZE <<< "$MID"
  B=$WORK/mid; mkdir -p "$B"
  python3 - "$B" "$MID_N" "$(numfmt --from=iec "$MID_SIZE")" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = os.urandom(1 << 20)
for i in range(n):
    d = os.path.join(root, f"d{i // 100:04d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
PY
  bytes=$(du -sb "$B" | cut -f1)
  dropcaches
  t0=$(now)
  "$DHRD" mount "$B" "$WORK/mnt" --quiet > "$OUT/daemon-mid.log" 2>&1 &
  DAEMON=$!
  until "$DHRD" status "$WORK/mnt" 2>/dev/null | grep -q complete; do sleep 0.05; done
  t1=$(now)
  rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$DAEMON/status)
  "$DHRD" status "$WORK/mnt" > "$OUT/status-mid.txt"
  inram=$(grep '^load:' "$OUT/status-mid.txt" | sed 's/.*(\(.* of [^,]*\), .*/\1/')
  "$DHRD" umount "$WORK/mnt"; wait "$DAEMON" || true; DAEMON=
  mount -t tmpfs -o size=$(( bytes * 2 )) tmpfs "$TMPFS"
  dropcaches
  t2=$(now); cp -a "$B" "$TMPFS/tree"; t3=$(now); umount "$TMPFS"
  vm="n/a"
  if command -v vmtouch >/dev/null; then dropcaches; t4=$(now); vmtouch -tq "$B"; t5=$(now); vm=$(echo "$t5 - $t4" | bc); fi
  {
    echo
    echo "| mid-sized files | full load (s) | in RAM after the load | cp -a to tmpfs (s) | vmtouch -t (s) | daemon RSS (MiB) | limit 1.05 x data + 64 MiB |"
    echo "|---|---|---|---|---|---|---|"
    printf "| %s x %s | %.2f | %s | %.2f | %s | %s | %s |\n" "$MID_N" "$MID_SIZE" "$(echo "$t1 - $t0" | bc)" "$inram" \
      "$(echo "$t3 - $t2" | bc)" "$vm" "$rss" "$(( bytes * 105 / 100 / 1048576 + 64 ))"
  } >> "$OUT/startup.md"
  rm -rf "$B"
fi

# Many small files.
B=$WORK/tree; mkdir -p "$B"
python3 - "$B" "$FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 1000
data = b"x" * 1024
for i in range(n):
    d = os.path.join(root, f"d{i // per:05d}")
    if i % per == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
        f.write(data)
PY
dropcaches
t0=$(now)
"$DHRD" mount "$B" "$WORK/mnt" --quiet > "$OUT/daemon-tree.log" 2>&1 &
DAEMON=$!
until [ -e "$WORK/mnt/d00000/f0000000" ]; do sleep 0.001; done
t1=$(now)
count=$(find "$WORK/mnt" -type f | wc -l)
t2=$(now)
find "$WORK/mnt" -type f -print0 | xargs -0 cat > /dev/null
t3=$(now)
rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$DAEMON/status)
fds=$(ls /proc/$DAEMON/fd | wc -l)
"$DHRD" status "$WORK/mnt" > "$OUT/status-tree.txt"
"$DHRD" umount "$WORK/mnt"; wait "$DAEMON" || true; DAEMON=
{
  echo
  echo "| files | first lookup (ms) | find (s) | read all through the mount (s) | daemon RSS (MiB) | daemon fds |"
  echo "|---|---|---|---|---|---|"
  printf "| %s (found %s) | %.1f | %.2f | %.2f | %s | %s |\n" "$FILES" "$count" "$(echo "($t1 - $t0) * 1000" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "$t3 - $t2" | bc)" "$rss" "$fds"
} >> "$OUT/startup.md"
cat "$OUT/startup.md"
echo "results in $OUT" >&2
