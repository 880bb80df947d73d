#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, and every test (unit, property,
# simulation, crash, and integration tests with real FUSE mounts and NBD clients).
# Long soak runs are opt-in: DHRD_SOAK=1 (more seeds, and the tests marked #[ignore]).
# The public traces are required (below); DHRD_NO_TRACES=1 runs without them.
# At the end it prints how many checks did not run here, and which (DHRD-SKIP lines).
set -euo pipefail
cd "$(dirname "$0")/.."

# The public block traces the replay tests and the bench suite's smoke run read:
# $DHRD_TRACES_DIR, else ../shared/traces beside the checkout (where CI has them). Without
# them those checks would only be skipped, so the run stops here instead, before anything
# is built. DHRD_NO_TRACES=1 runs without them on purpose; the checks that need them then
# say DHRD-SKIP and are counted at the end.
TRACE_FILES=(websearch/WebSearch1.first24783.spc msr_cambridge/hm_0.first1000.csv
  oltp_tpcc/tpcc-small.trace)
traces_dir=${DHRD_TRACES_DIR:-../shared/traces}
missing_traces=()
for t in "${TRACE_FILES[@]}"; do
  [ -f "$traces_dir/$t" ] || missing_traces+=("$t")
done
if [ ${#missing_traces[@]} -eq 0 ]; then
  # Absolute, so that every test and the suite read the same directory.
  DHRD_TRACES_DIR=$(cd "$traces_dir" && pwd)
  export DHRD_TRACES_DIR
elif [ "${DHRD_NO_TRACES:-}" = 1 ]; then
  echo "test-all: running without the public traces (DHRD_NO_TRACES=1)" >&2
else
  echo "test-all: the public traces are missing from $traces_dir (${missing_traces[*]})." >&2
  echo "test-all: put them there, point DHRD_TRACES_DIR at them, or set DHRD_NO_TRACES=1" \
    "to run without the checks that need them." >&2
  exit 1
fi

# The packages the tests use (installed when missing; needs root then).
bash scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

# Every check that could not run here says so (dhrd-testkit's `skip`, or a line below)
# and is appended to this file; the run ends with their count and list, whether it passed
# or failed, so nothing passes in silence.
DHRD_SKIP_LOG=$(mktemp /tmp/dhrd-skips.XXXXXX)
export DHRD_SKIP_LOG
if [ ${#missing_traces[@]} -gt 0 ]; then
  echo "DHRD-SKIP: public-traces: DHRD_NO_TRACES=1, missing ${missing_traces[*]}" \
    | tee -a "$DHRD_SKIP_LOG" >&2
fi
report_skips() {
  local n
  n=$(grep -c '^DHRD-SKIP: ' "$DHRD_SKIP_LOG" || true)
  echo "checks that did not run: $n" >&2
  [ "$n" -eq 0 ] || sort "$DHRD_SKIP_LOG" >&2
}

# One throw-away one-node Ceph cluster for the RBD tests and the bench smoke run, started
# once (about 15 s) and stopped on exit; a random monitor port (below the ephemeral range) lets two runs coexist.
CEPH_DIR=$(mktemp -d /tmp/dhrd-ceph.XXXXXX)
trap 'report_skips; bash scripts/ceph-single-node.sh stop "$CEPH_DIR" >/dev/null 2>&1 || true; rm -rf "$CEPH_DIR" "$DHRD_SKIP_LOG"' EXIT
CEPH_MON_PORT=$((20000 + RANDOM % 12000)) bash scripts/ceph-single-node.sh start "$CEPH_DIR"
export DHRD_CEPH_CONF="$CEPH_DIR/ceph.conf"

# Every test binary runs even when an earlier one fails, so one run shows every failure.
cargo test --workspace --no-fail-fast
# Soak runs: more seeds in the tests that read DHRD_SOAK (above), and the tests marked
# #[ignore] for their length.
if [ -n "${DHRD_SOAK:-}" ]; then
  cargo test --workspace --no-fail-fast -- --ignored
fi

# The benchmark suite's tiny profile, so the harness cannot rot: every experiment and
# configuration runs with small sizes on the binaries the tests just built, and the report
# and plots must come out. Speeds are not checked. Needs root (mounts, loop devices).
if [ "$(id -u)" = 0 ]; then
  TARGET=${CARGO_TARGET_DIR:-target}
  cargo build --workspace --bins
  SMOKE=$(mktemp -d /tmp/dhrd-suite-smoke.XXXXXX)
  /usr/bin/python3 bench/suite/run.py tiny --out "$SMOKE" --set attach_writer_rounds=2 \
    --dhrd "$TARGET/debug/dhrd" --dhrd-bench "$TARGET/debug/dhrd-bench"
  # A parameter changed with --set must be named in the report, or its figures would pass
  # for the profile's.
  grep -q 'attach_writer_rounds=2' "$SMOKE/report.md" \
    || { echo "bench suite smoke: the report does not name --set attach_writer_rounds=2" >&2; exit 1; }
  for f in report.md results.json block.png file.png fileserver.png blockfs.png video.png warmup.png memory.png rbd.png cache.png nvm.png seed002.png tier.png rehypar.png apps.png; do
    [ -s "$SMOKE/$f" ] || { echo "bench suite smoke: $f missing in $SMOKE" >&2; exit 1; }
  done
  rm -rf "$SMOKE"
else
  echo "DHRD-SKIP: bench-suite-smoke: needs root" | tee -a "$DHRD_SKIP_LOG" >&2
fi
