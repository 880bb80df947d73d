#!/usr/bin/env bash
# Installs the Debian packages the test suite and the benchmark suite need (FUSE, the NBD
# and block clients, the applications the tests run, systemd for its unit checker, fstab
# generator and test mode, which work where systemd is not running, man-db and binutils
# for the package test), skipping those already present; cargo-deb, the tool that
# builds dhrd's Debian package (scripts/build-deb.sh), and pjdfstest, at the versions
# pinned in scripts/*.version.
# Idempotent; needs root for apt-get. Rust's toolchain is expected to be present.
set -euo pipefail
cd "$(dirname "$0")/.."

# cargo-deb from crates.io, built once per machine (a few minutes) into ~/.cargo/bin.
CARGO_DEB_VERSION=$(cat scripts/cargo-deb.version)
if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
    cargo install --locked --force cargo-deb --version "$CARGO_DEB_VERSION"
fi
# pjdfstest (the POSIX file system conformance suite, in its Rust form on crates.io; the C
# original has no Debian package), into ~/.cargo/bin: the tests compare its results in a
# dhrd mount and an attached directory with plain ext4's.
PJDFSTEST_VERSION=$(cat scripts/pjdfstest.version)
if ! pjdfstest --version 2>/dev/null | grep -qx "pjdfstest $PJDFSTEST_VERSION"; then
    cargo install --locked --force pjdfstest --version "$PJDFSTEST_VERSION"
fi

# libssl-dev: the NBD server's TLS (OpenSSL); gnutls-bin (certtool, psktool) and openssl:
# the TLS tests' certificates and keys.
packages=(fuse3 libfuse3-dev fio nbdkit libnbd-bin python3-libnbd nbdfuse qemu-utils sqlite3
          libssl-dev gnutls-bin openssl
          e2fsprogs xfsprogs util-linux pkg-config python3-matplotlib vmtouch postmark postgresql git
          ceph-mon ceph-osd ceph-mgr ceph-common librbd1 systemd man-db binutils dpkg-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run as root (sudo bash scripts/test-all.sh) or install them first" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
