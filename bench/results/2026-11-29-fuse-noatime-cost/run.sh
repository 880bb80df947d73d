#!/usr/bin/env bash
# Daemon CPU per file of bench/fuse/cpu_per_request.py's phases, the build before the
# access-time change (2e37a75) and after it (57045f5), three alternating rounds of 5,000
# files; then one run of each with the per-thread split of the `read` and `reopen` phases.
# BEFORE and AFTER are the two dhrd binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
for r in 1 2 3; do for b in "$BEFORE" "$AFTER"; do
  echo "== $b round $r"
  /usr/bin/python3 "$here/bench/fuse/cpu_per_request.py" --dhrd "$b" --files 5000 2>&1 \
    | grep -E "^(create|read|reopen|reread|unlink|lookup) " | awk '{printf "%s %s ", $1, $9} END {print ""}'
done; done
for b in "$BEFORE" "$AFTER"; do
  echo "== $b"
  /usr/bin/python3 "$here/bench/fuse/cpu_per_request.py" --dhrd "$b" --files 5000 2>&1 | grep -A1 -E "^(read|reopen) "
done
