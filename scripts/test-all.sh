#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, and every test (unit, property,
# simulation, crash, and integration tests with real FUSE mounts and NBD clients).
# Long soak runs are opt-in: DHRD_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
# The packages the tests use (installed when missing; needs root then).
bash scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

# One throw-away one-node Ceph cluster for the RBD tests and the bench smoke run, started
# once (about 15 s) and stopped on exit; a random monitor port (below the ephemeral range) lets two runs coexist.
CEPH_DIR=$(mktemp -d /tmp/dhrd-ceph.XXXXXX)
trap 'bash scripts/ceph-single-node.sh stop "$CEPH_DIR" >/dev/null 2>&1 || true; rm -rf "$CEPH_DIR"' EXIT
CEPH_MON_PORT=$((20000 + RANDOM % 12000)) bash scripts/ceph-single-node.sh start "$CEPH_DIR"
export DHRD_CEPH_CONF="$CEPH_DIR/ceph.conf"

# Every test binary runs even when an earlier one fails, so one run shows every failure.
cargo test --workspace --no-fail-fast

# The benchmark suite's tiny profile, so the harness cannot rot: every experiment and
# configuration runs with small sizes on the binaries the tests just built, and the report
# and plots must come out. Speeds are not checked. Needs root (mounts, loop devices).
if [ "$(id -u)" = 0 ]; then
  TARGET=${CARGO_TARGET_DIR:-target}
  cargo build --workspace --bins
  SMOKE=$(mktemp -d /tmp/dhrd-suite-smoke.XXXXXX)
  /usr/bin/python3 bench/suite/run.py tiny --out "$SMOKE" \
    --dhrd "$TARGET/debug/dhrd" --dhrd-bench "$TARGET/debug/dhrd-bench"
  for f in report.md results.json block.png file.png fileserver.png video.png warmup.png memory.png rbd.png cache.png nvm.png seed002.png tier.png; do
    [ -s "$SMOKE/$f" ] || { echo "bench suite smoke: $f missing in $SMOKE" >&2; exit 1; }
  done
  rm -rf "$SMOKE"
else
  echo "skipping the bench suite smoke run: needs root" >&2
fi
