#!/usr/bin/env bash
# Alternating cold attaches of two builds: sudo bash run.sh OLD_BIN NEW_BIN DIR [ROUNDS]
# DIR/w holds f0..f3 (here four 1.5 GiB files of random bytes on the disk's ext4).
set -euo pipefail
here=$(dirname "$0")
for i in $(seq "${4:-5}"); do
  for b in old:"$1" new:"$2"; do
    echo -n "${b%%:*}: "
    "$here/attach_once.py" "${b#*:}" "$3"
  done
done
