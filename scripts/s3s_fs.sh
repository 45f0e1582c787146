#!/usr/bin/env bash
# Installs s3s-fs (a fast S3 server in Rust over a directory; the wan benchmark's server) into
# target/tools/bin, patched by scripts/s3s-fs.patch so that it answers as S3 does where shardfs
# depends on it: listings carry each object's ETag, and a key naming a directory is NoSuchKey
# (404), not a 500; writes to one key take turns from the check of their If-Match or
# If-None-Match to the ETag stored (as on S3: unpatched, eight writers holding one ETag all
# "succeed" and all but one of their commits are lost), and a GET takes a turn to open the object
# and read the checksum stored beside it (unpatched, a GET racing a PUT could pair the old body
# with the new checksum, which Icechunk's reader rejects); a part copy (UploadPartCopy) honours
# x-amz-copy-source-if-match, reading the source under its key's turn, a completion refuses parts
# below 5 MiB but the last before it changes anything, and an object a completion replaces keeps
# none of the old one's checksums (unpatched: copies of any version, and the old checksum served
# with the new body); a GET's If-Match is decided before its Range, under the key's turn (unpatched,
# ignored: another version's bytes served as the one named); a HEAD and a listing give each object's size and ETag (and user metadata)
# of one version, read under the key's turn (unpatched, a HEAD racing a write paired one version's
# size with another's ETag: 2 of 10 runs of eight mounts committing by copy read an index from
# the wrong bytes and failed their commit); and so that it reads files (for a GET or a part copy) 256 KiB at a
# time rather than 4 KiB (each read a trip to tokio's blocking pool: 2.7 s of CPU to serve 512 MiB,
# on the two cores its clients share). A benchmark tool, not a test dependency: scripts/bench.sh
# runs this on demand.
#
#   scripts/s3s_fs.sh     prints the binary's path; builds it only when missing or the patch changed
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.14.1 # the newest that builds with this toolchain (0.17 wants rustc 1.96)
root=$PWD/target/tools
bin=$root/bin/s3s-fs
stamp=$root/s3s-fs.stamp
want="$version $(sha256sum scripts/s3s-fs.patch | cut -c1-16)"
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then echo "$bin"; exit 0; fi
echo "s3s_fs: building s3s-fs $version (patched) into $root" >&2
# Cargo fetches the published crate through its usual registry; a throwaway manifest names it.
fetch=$root/fetch
mkdir -p "$fetch/src"
printf '[package]\nname = "fetch-s3s-fs"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\ns3s-fs = "=%s"\n' \
  "$version" > "$fetch/Cargo.toml"
: > "$fetch/src/lib.rs"
cargo fetch -q --manifest-path "$fetch/Cargo.toml"
manifest=$(cargo metadata -q --format-version 1 --manifest-path "$fetch/Cargo.toml" |
  python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "s3s-fs"))')
src=$root/s3s-fs-$version
rm -rf "$src" && cp -r "$(dirname "$manifest")" "$src" && chmod -R u+w "$src"
patch -s -p1 -d "$src" < scripts/s3s-fs.patch
CARGO_TARGET_DIR=$root/build cargo install -q --locked --force --features binary --path "$src" --root "$root"
echo "$want" > "$stamp"
echo "$bin"
