#!/usr/bin/env bash
# Creates a new run folder under bench/results/ and prints its path. The name follows the
# scheme of docs/benchmarks.md ("Run folders"): YYYY-MM-DD-SUBJECT, the UTC date the run
# starts, then -2, -3, ... when a run of that name exists already that day. mkdir (without
# -p) claims a name atomically, so two runs started at once never share a folder.
#   usage: bench/new-run-dir.sh SUBJECT    (e.g. fuse, fuse-startup, nbd, tier-quick)
set -euo pipefail
if [ $# -ne 1 ] || ! [[ $1 =~ ^[a-z0-9][a-z0-9+-]*$ ]]; then
  echo "usage: $0 SUBJECT (lowercase letters, digits, '-' and '+')" >&2
  exit 2
fi
results=$(cd "$(dirname "$0")" && pwd)/results
mkdir -p "$results"
base=$results/$(date -u +%Y-%m-%d)-$1
dir=$base
n=1
until mkdir "$dir" 2>/dev/null; do
  # Taken: try the next number. Anything else (no permission, read-only): say so.
  [ -e "$dir" ] || mkdir "$dir"
  n=$((n + 1))
  dir=$base-$n
done
echo "$dir"
