#!/usr/bin/env bash
# Builds dhrd's Debian packages with cargo-deb (the version in scripts/cargo-deb.version;
# scripts/install-deps.sh installs it) and prints their paths:
# - dhrd_VERSION-1_ARCH.deb: the stripped `dhrd` binary, the mount(8) and umount(8) helper
#   links, the systemd template unit, the defaults file /etc/dhrd/dhrd.conf (a conffile),
#   man pages and bash, zsh and fish completions generated from the command line;
# - dhrd-dbgsym_VERSION-1_ARCH.ddeb: the binary's debug information, as Debian splits it
#   (/usr/lib/debug/.build-id/XX/REST.debug, found through the binary's build id).
# The release build reuses the target directory ($CARGO_TARGET_DIR, else target/), so a
# second run only packages.   usage: scripts/build-deb.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${CARGO_TARGET_DIR:-target}/debian}
want=$(cat scripts/cargo-deb.version)
if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $want"; then
    echo "build-deb: cargo-deb $want is needed (bash scripts/install-deps.sh installs it)" >&2
    exit 1
fi
target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -p dhrd
# The man pages and completions, where the package's assets expect them.
rm -rf "$target/release/dist"
"$target/release/dhrd" --generate-dist "$target/release/dist"
# Compressed as Debian policy asks (cargo-deb leaves files under the target dir as built).
gzip -9n "$target/release/dist/man/"*.1
mkdir -p "$out"
cargo deb --package dhrd --no-build --locked --dbgsym --output "$out"
