#!/usr/bin/env bash
# Alternating cold attaches of two binaries: sudo bash run.sh OLD_BIN NEW_BIN DIR [ROUNDS]
# DIR needs a file w/f0 (here: one 1 MiB file, or four 1.5 GiB files for the 6 GiB case).
set -euo pipefail
here=$(dirname "$0")
for i in $(seq "${4:-8}"); do
  for b in old:"$1" new:"$2"; do
    echo -n "${b%%:*}: "
    "$here/first_read.py" "${b#*:}" "$3"
  done
done
