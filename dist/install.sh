#!/usr/bin/env bash
# Installs dhrd for boot-time mounts: the binary, the mount(8) and umount(8) helper links, the systemd
# template unit and the defaults file (kept if present). Run as root from the repository
# after `cargo build --release -p dhrd`.
set -euo pipefail
cd "$(dirname "$0")/.."
install -m 0755 target/release/dhrd /usr/local/bin/dhrd
ln -sf /usr/local/bin/dhrd /sbin/mount.fuse.dhrd
# umount(8) runs this for fuse.dhrd mounts: it returns once the daemon has flushed and exited.
ln -sf /usr/local/bin/dhrd /sbin/umount.fuse.dhrd
install -d /etc/dhrd
[ -e /etc/dhrd/dhrd.conf ] || install -m 0644 dist/dhrd.conf /etc/dhrd/dhrd.conf
if [ -d /etc/systemd/system ]; then
    install -m 0644 dist/dhrd@.service /etc/systemd/system/dhrd@.service
    command -v systemctl >/dev/null && systemctl daemon-reload || true
fi
echo "dhrd installed: mount -t fuse.dhrd BACKING MOUNTPOINT -o durability=sync, an fstab line, or dhrd@NAME.service"
