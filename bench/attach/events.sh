#!/usr/bin/env bash
# What an attached directory's daemon costs small-file work (docs/attach.md, "What the
# daemon costs small-file work"): a plain directory and `dhrd attach --durability fsync`
# of a subdirectory, each run on a fresh journalled ext4 (loop device with direct I/O over
# an image on the disk under test, as the suite's JournaledDisk), in alternating pairs.
# For each run: the workload's own figure and the daemon's CPU (utime+stime ticks of
# 10 ms, from /proc) over the workload, and the events the watch read.
#
#   sudo bench/attach/events.sh [--rounds N] [--only extract,fileserver,metaops,postmark]
#                               [--files N] [--meta-files N] [--durability fsync|sync]
#                               [--compare BIN] [--out DIR]
#
# extract: `tar -xf` of the suite's archive of 20,000 files of 1-8 KiB (bench/suite/apps.py).
# fileserver: `dhrd-bench fileserver`, 50 threads, 2,000 files (--files) of 16 KiB mean, 10 s.
# metaops: `dhrd-bench metaops`, 100,000 empty files (--meta-files) created, stat'ed,
# unlinked, 1 thread; the rate of the whole run and of each phase.
# postmark: Postmark as the suite's full profile runs it (bench/suite/experiments.py:
# 5,000 files of 500 B-10 KB, 50,000 transactions, read:append 5:5), transactions/s.
# --compare BIN runs a third configuration, `compare`: the same attach with another dhrd
# binary (an older build, say), in the same rounds; the order rotates each round.
# --durability sync compares against what the issue's `sync` target does: the same ext4
# mounted `sync,dirsync` (config `syncdirsync`: remounted `sync`, which implies dirsync,
# since IS_DIRSYNC tests the superblock's SB_SYNCHRONOUS too; a remount cannot set
# `dirsync` itself), and adds `flags`, the subdirectory with
# the sync and dirsync inode flags and no daemon, which splits what the flags cost from
# what the daemon adds. The fileserver then fsyncs after each whole-file write and append,
# as the suite's fileserver does for every configuration durable on return.
# Builds release binaries from this tree first. Needs root (loop devices, fanotify).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=3 only=extract,fileserver,metaops files=2000 meta_files=100000 out="" durability=fsync compare=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --meta-files) meta_files=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --durability) durability=$2; shift 2 ;;
    --compare) compare=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--only extract,fileserver,metaops,postmark] [--files N] [--meta-files N] [--durability fsync|sync] [--compare BIN] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (loop devices, fanotify)" >&2; exit 2; }
(cd "$here" && cargo build --release -q -p dhrd -p dhrd-bench)
dhrd=$here/target/release/dhrd bench=$here/target/release/dhrd-bench
work=$(mktemp -d /var/tmp/dhrd-attach-events.XXXXXX)
loop=""
cleanup() {
  mountpoint -q "$work/fs" 2>/dev/null && { "$dhrd" detach "$work/fs/d" >/dev/null 2>&1 || true; umount "$work/fs" || true; }
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if [[ $only == *extract* ]]; then
  (cd "$here/bench/suite" && python3 -c "import apps; apps.make_archive('$work/a.tar', 20000)")
fi

fresh_fs() {
  # Room as the suite's fileserver gives it: three times the fileset, and 3 GiB at least.
  local img_bytes=$(( files * 16384 * 3 + (256 << 20) ))
  [ "$img_bytes" -ge $((3 << 30)) ] || img_bytes=$((3 << 30))
  rm -f "$work/img"; fallocate -l "$img_bytes" "$work/img"
  loop=$(losetup --find --show --direct-io=on "$work/img")
  mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$loop"
  mkdir -p "$work/fs"; mount "$loop" "$work/fs"; mkdir "$work/fs/d"
}
drop_fs() { umount "$work/fs"; losetup -d "$loop"; loop=""; }
fsync_flag=""; [ "$durability" = sync ] && fsync_flag=--fsync
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# one WORKLOAD CONFIG ROUND: prints one line of figures.
one() {
  local wl=$1 cfg=$2 rnd=$3 pid="" t0 t1 c0=0 c1=0 fig events="" bin=$dhrd
  [ "$cfg" = compare ] && bin=$compare
  fresh_fs
  case $cfg in
    syncdirsync) mount -o remount,sync "$work/fs" ;;
    flags) chattr +S +D "$work/fs/d" ;;
  esac
  if [ "$cfg" = attach ] || [ "$cfg" = compare ]; then
    pid=$("$bin" attach "$work/fs/d" --daemon --quiet --durability "$durability" 2>&1 | grep -o 'daemon [0-9]*' | grep -o '[0-9]*')
    c0=$(ticks "$pid")
  fi
  case $wl in
    extract)
      t0=$(date +%s.%N); tar -xf "$work/a.tar" -C "$work/fs/d"; t1=$(date +%s.%N)
      fig="extract_s=$(echo "$t1 - $t0" | bc)" ;;
    fileserver)
      fig="ops_per_s=$("$bench" fileserver --dir "$work/fs/d" --files "$files" --threads 50 --secs 10 \
        --mean-file-bytes 16384 $fsync_flag 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["ops_per_sec"]))')" ;;
    metaops)
      # The whole run's rate, then each phase's (they differ in what they cost the watch:
      # a creation event per file, then an attribute event per followed file's unlink).
      fig=$("$bench" metaops --dir "$work/fs/d" --threads 1 --files-per-thread "$meta_files" 2>/dev/null \
        | python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):]); print("ops_per_s=%d" % d["ops_per_sec"], " ".join("%s_per_s=%d" % (k, v["ops_per_sec"]) for k, v in d["phases"].items()))') ;;
    postmark)
      fig="tx_per_s=$(cd "$here/bench/suite" && python3 -c "import experiments; print(int(experiments.postmark(
        '$work/fs/d', {'pm_files': 5000, 'pm_transactions': 50000})['tx_per_sec']))")" ;;
  esac
  if [ -n "$pid" ]; then
    c1=$(ticks "$pid")
    events=" watch_events=$("$bin" status "$work/fs/d" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["watch"]["events"])')"
    "$bin" detach "$work/fs/d" >/dev/null
    while [ -e "/proc/$pid" ]; do sleep 0.05; done
  fi
  drop_fs
  echo "$wl round=$rnd config=$cfg$([ "$wl" = fileserver ] && echo " files=$files")$([ "$wl" = metaops ] && echo " files=$meta_files") $fig daemon_cpu_ticks=$((c1 - c0))$events"
}

{
  echo "# bench/attach/events.sh on $(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet HEAD -- crates || echo ' (uncommitted changes)'), $(date -u +%FT%TZ), kernel $(uname -r), durability $durability${compare:+, compare $compare}"
  cfgs=(plain attach); [ "$durability" = sync ] && cfgs=(syncdirsync flags attach)
  [ -n "$compare" ] && cfgs+=(compare)
  for wl in ${only//,/ }; do
    for r in $(seq "$rounds"); do
      # Rotate the order each round, so no configuration always runs first.
      for i in "${!cfgs[@]}"; do one "$wl" "${cfgs[$(( (i + r - 1) % ${#cfgs[@]} ))]}" "$r"; done
    done
  done
} | if [ -n "$out" ]; then mkdir -p "$out"; tee "$out/events.txt"; else cat; fi
