#!/usr/bin/env bash
# Daemon CPU per request and wall time per file of bench/fuse/cpu_per_request.py's phases,
# the build of docs/fuse.md's "Daemon CPU per request" table (751c55e, BEFORE) against main
# (cd85691, AFTER), alternating rounds, eight FUSE workers for both; FILES 5000 (past the
# kept descriptors' bound, about 2,400 on a machine with a hard limit of 20,000 open
# files) and 2000 (below it). With RECORD=create, one more run of each records that phase
# (perf-create.data under the current directory) to look for where the time went.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
for files in ${FILES:-5000 2000}; do
  echo "== $files files: phase cpu-us-per-request/wall-us-per-file"
  for r in 1 2; do for b in "$BEFORE" "$AFTER"; do
    echo "$(basename "$b") $(/usr/bin/python3 "$here/bench/fuse/cpu_per_request.py" --dhrd "$b" \
      --threads 8 --files "$files" 2>&1 | grep -E '^[a-z]+ +requests' \
      | sed -E 's/^([a-z]+) .*daemon CPU +([0-9.]+) us\/request.*wall +([0-9.]+) us\/file.*/\1 \2\/\3/' \
      | tr '\n' ' ')"
  done; done
done
if [ -n "${RECORD:-}" ]; then
  for b in "$BEFORE" "$AFTER"; do
    /usr/bin/python3 "$here/bench/fuse/cpu_per_request.py" --dhrd "$b" --threads 8 --files 5000 \
      --record "$RECORD" 2>&1 | grep -A1 -E "^$RECORD "
  done
fi
