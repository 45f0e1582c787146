#!/usr/bin/env bash
# Builds mount-s3 (AWS's Mountpoint for S3: the published mountpoint-s3-fs 0.11 library under
# scripts/mount-s3, a small main of ours, as mount-s3's own command line is not published) into
# target/tools/bin, with the versions mountpoint-s3-fs's published Cargo.lock pins. The AWS
# Common Runtime it links is C, built with cmake and bound with bindgen (libclang); its FUSE layer
# links libfuse3. A benchmark tool, not a test dependency: scripts/bench.sh runs this on demand
# (about 10 minutes on two cores the first time).
#
#   scripts/mountpoint_s3.sh     prints the binary's path; builds it only when missing or changed
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
root=$PWD/target/tools
bin=$root/bin/mount-s3
stamp=$root/mount-s3.stamp
want=$(cat scripts/mount-s3/Cargo.toml scripts/mount-s3/src/main.rs | sha256sum | cut -c1-16)
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then echo "$bin"; exit 0; fi
echo "mountpoint_s3: building mount-s3 over mountpoint-s3-fs 0.11 into $root" >&2
need_tools cmake:cmake pkg-config:pkg-config
for package in libclang-dev libfuse3-dev; do dpkg -s "$package" >/dev/null 2>&1 || apt_install "$package"; done
src=$root/mount-s3-src
rm -rf "$src" && mkdir -p "$src" && cp -r scripts/mount-s3/. "$src"
# The library's own lock file, so that its dependencies are the versions it was released with.
cargo fetch -q --manifest-path "$src/Cargo.toml"
lock=$(cargo metadata -q --format-version 1 --manifest-path "$src/Cargo.toml" |
  python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "mountpoint-s3-fs"))')
cp "$(dirname "$lock")/Cargo.lock" "$src/Cargo.lock"
CARGO_TARGET_DIR=$root/build cargo install -q --force --path "$src" --root "$root"
echo "$want" > "$stamp"
echo "$bin"
