#!/usr/bin/env bash
# The benchmark suite in one command: builds the release binaries, then runs every
# experiment with dhrd and its baselines (docs/benchmarks.md).
#   sudo bench/suite.sh quick     # minutes
#   sudo bench/suite.sh full      # about an hour and a half; the committed figures
#   sudo bench/suite.sh tiny      # seconds; what the test suite runs
# Extra options go to bench/suite/run.py (--only, --configs, --disk-dir, --out, --traces).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p dhrd -p dhrd-bench --manifest-path "$ROOT/Cargo.toml" >&2
# matplotlib is importable only by the distribution's interpreter.
exec /usr/bin/python3 "$ROOT/bench/suite/run.py" "$@"
