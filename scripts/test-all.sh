#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, and every test (unit, property,
# simulation, crash, and integration tests with real FUSE mounts and NBD clients).
# Long soak runs are opt-in: DHRD_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
