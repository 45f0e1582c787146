#!/usr/bin/env bash
# mount(8) with shardfs as its helper, for real: `mount -t fuse.shardfs STORE MOUNTPOINT -o ...`
# and `mount -T FSTAB MOUNTPOINT` with an fstab line, through util-linux mount and fuse3's
# mount.fuse3, which runs `shardfs STORE MOUNTPOINT -o OPTIONS` with /bin/sh's default PATH
# (mount(8) drops the caller's PATH). So the test runs in a mount namespace of its own, where
# /usr/local/sbin is a directory holding only a link to the binary under test: nothing outside the
# namespace sees it, and nothing is installed.
#     scripts/mount-helper-test.sh [path/to/shardfs]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/debug/shardfs}")

if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  if [ "${SHARDFS_REQUIRE_FUSE:-}" = 1 ]; then
    echo "FAIL: mount(8) tests need root and unshare -m" >&2
    exit 1
  fi
  echo "*** SKIPPING the mount(8) tests: they need root and unshare -m ***" >&2
  exit 0
fi
if [ "${SHARDFS_IN_NAMESPACE:-}" != 1 ]; then
  exec env SHARDFS_IN_NAMESPACE=1 unshare -m --propagation private "$0" "$bin"
fi

store=$(realpath tests/data/golden/sharded)
twin=$(realpath tests/data/golden/unsharded)
work=$(mktemp -d -t shardfs-mount-helper.XXXXXX)
mnt=$work/mnt
mkdir "$mnt" "$work/sbin"
ln -s "$bin" "$work/sbin/shardfs"
mount --bind "$work/sbin" /usr/local/sbin
cleanup() {
  if mountpoint -q "$mnt"; then "$bin" unmount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
  umount /usr/local/sbin
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/checks.sh"
same() { diff <(eval "$1") <(eval "$2") | head -20; test "${PIPESTATUS[0]}" = 0; }
chunk_sums() { (cd "$1" && find . -type f ! -name zarr.json -print0 | sort -z | xargs -0 md5sum); }
# mount.fuse3 runs the daemon as `shardfs STORE MOUNTPOINT -o ...`, and $mnt is this run's own.
daemon_gone() {
  for _ in $(seq 100); do
    pgrep -f "^shardfs [^ ]* $mnt " >/dev/null || return 0
    sleep 0.1
  done
  return 1
}

check "the helper finds the binary under test on mount(8)'s PATH" \
  same "env -u PATH /bin/sh -c 'command -v shardfs'" "echo /usr/local/sbin/shardfs"
check "mount -t fuse.shardfs with shardfs options and fstab's" \
  mount -t fuse.shardfs "$store" "$mnt" \
  -o ro,noauto,nofail,_netdev,users,x-systemd.automount,cache_size=1M,threads=2,log_file="$work/log",verbose
# fuser mounts as root with the type fuse (through fusermount3, for other users: fuse.shardfs).
check "the mount's source is the store, read-only" same "findmnt -n -o SOURCE,OPTIONS $mnt | cut -d, -f1" "echo '$store ro'"
check "every chunk read through it equals the twin's" same "chunk_sums $mnt" "chunk_sums $twin"
check "-o log_file and -o verbose reached the daemon" grep -q "serving $store" "$work/log"
check "writes are refused" bash -c "! touch $mnt/zp/new 2>/dev/null"
check "umount" umount "$mnt"
check "the daemon exits after umount" daemon_gone
check "nothing left mounted" bash -c "! mountpoint -q $mnt"

cat >"$work/fstab" <<EOF
# A line as docs/cli.md shows it: the Zarr v2 view, mounted by hand.
$store $mnt fuse.shardfs ro,noauto,zarr_format=2,max_index_size=1M 0 0
EOF
check "mount -T FSTAB MOUNTPOINT" mount -T "$work/fstab" "$mnt"
check "-o zarr_format=2 from fstab: a Zarr v2 view" test -f "$mnt/zp/gzip_crc_end/.zarray"
check "no zarr.json in the v2 view" bash -c "! test -e $mnt/zp/gzip_crc_end/zarr.json"
check "shardfs unmount of a mount(8) mount" "$bin" unmount "$mnt"
check "mount --fstab FSTAB STORE (by source)" mount --fstab "$work/fstab" "$store"
check "a v2 chunk is readable" bash -c "cat $mnt/zp/gzip_crc_end/.zarray | grep -q zarr_format"
check "umount of the fstab mount" umount "$mnt"
check "its daemon exits" daemon_gone

echo "$store $mnt fuse.shardfs ro,nofail 0 0" >"$work/fstab-auto"
check "mount -a mounts an auto line" mount -a -T "$work/fstab-auto"
check "mount -a again: already mounted (the source is the store)" \
  bash -c "mount -a -v -T $work/fstab-auto >$work/again && grep -q 'already mounted' $work/again"
check "one mount, not two" same "findmnt -n -o TARGET $mnt | wc -l" "echo 1"
check "umount of the mount -a mount" umount "$mnt"
check "and its daemon exits" daemon_gone

check "a missing store: mount fails" bash -c "! mount -t fuse.shardfs $work/missing $mnt -o ro 2>$work/err"
check "with one line naming it" bash -c "grep -c . $work/err | grep -qx 1 && grep -q '$work/missing' $work/err"
check "an unknown -o option: mount fails" bash -c "! mount -t fuse.shardfs $store $mnt -o ro,bogus 2>$work/err"
check "naming it" grep -q 'bogus: unknown mount option' "$work/err"
check "nothing mounted after the failures" bash -c "! mountpoint -q $mnt"

# The systemd unit of docs/cli.md, as systemd reads it (Where= must match the file name, and so on).
if command -v systemd-analyze >/dev/null; then
  mkdir "$work/units"
  awk '/^# \/etc\/systemd\/system\/mnt-zarr.mount$/ {on=1; next} on && /^```/ {exit} on' docs/cli.md \
    >"$work/units/mnt-zarr.mount"
  check "docs/cli.md's systemd unit is there" grep -q '^Type=fuse.shardfs$' "$work/units/mnt-zarr.mount"
  check "and passes systemd-analyze verify" bash -c "cd $work/units && systemd-analyze verify ./mnt-zarr.mount"
fi

summary mount-helper
