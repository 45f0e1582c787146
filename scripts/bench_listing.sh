#!/usr/bin/env bash
# Stat walks of shardfs builds side by side (issue 62: which listings carry attributes):
# `du -s` and `ls -l` of one directory of FLAT chunk files, cold and warm, against the same files
# plain; and `find -type f | wc -l` over a store of CHUNKS chunk files in directories of 4,096,
# with the daemon's peak RSS and the kernel's fuse_inode slab objects once it is done (the inodes
# the kernel built for the walk: find stats nothing, so ideally none per file).
#
#   scripts/bench_listing.sh [--flat N] [--chunks N] [--find-only] [--stores DIR] [--out FILE] BIN...
#
# --find-only: the find alone (over 10^8 chunk files, say: --chunks 99999744), without the flat
# directory and its plain files.
#
# BIN... are shardfs binaries, each measured in turn on the same stores, which are written once
# (examples/huge_store.rs, from beside the first BIN) into DIR (default target/bench-huge, shared
# with scripts/bench_huge.sh). Read-only mounts, each fresh, the kernel's caches dropped before
# each cold walk; one run. Needs root (drop_caches, slabinfo). A markdown table to FILE (default
# target/bench-listing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
flat=1048576 chunks=8388608 stores=$PWD/target/bench-huge out=target/bench-listing.md bins=() walks=("du -s" "ls -l")
while [ $# -gt 0 ]; do
  case $1 in
    --flat) flat=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --find-only) walks=(); shift ;;
    --stores) stores=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -*) echo "usage: $0 [--flat N] [--chunks N] [--find-only] [--stores DIR] [--out FILE] BIN..." >&2; exit 2 ;;
    *) bins+=("$(realpath "$1")"); shift ;;
  esac
done
[ ${#bins[@]} -gt 0 ] || { echo "bench listing: name at least one shardfs binary" >&2; exit 2; }
gen=$(dirname "${bins[0]}")/examples/huge_store
[ -x "$gen" ] || { echo "bench listing: no $gen (cargo build --release --examples)" >&2; exit 1; }
source scripts/lib.sh

big=$stores/big-$chunks flat_store=$stores/flat-$flat plain=$stores/plain-$flat
mkdir -p "$stores"
[ -f "$big/a/zarr.json" ] || { rm -rf "$big"; "$gen" write "$big" --chunks "$chunks" --per-dir 4096; }
if [ ${#walks[@]} -gt 0 ]; then
  [ -f "$flat_store/a/zarr.json" ] || { rm -rf "$flat_store"; "$gen" write "$flat_store" --chunks "$flat" --per-dir "$flat"; }
  [ -d "$plain/c" ] || { rm -rf "$plain"; "$gen" plain "$plain" --files "$flat"; }
fi

scratch bench-listing
peak_mib() { awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
fuse_inodes() { awk '$1 == "fuse_inode" {print $2}' /proc/slabinfo; }
mount_store() {
  mkmnt "m$RANDOM"
  "$1" mount -f --read-only "$2" "$m" 2>>"$work/daemon.log" & pid=$!
  until mountpoint -q "$m"; do kill -0 "$pid"; sleep 0.05; done
}
unmount_store() { "$1" unmount "$m"; wait "$pid" || true; }
timed() {
  local start end; start=$(date +%s%N); "$@"; end=$(date +%s%N)
  took=$(python3 -c "print(f'{($end - $start) / 1e9:.2f}')")
}
rows=()
for walk in "${walks[@]}"; do
  drop_caches; timed bash -c "$walk '$plain/c' >/dev/null"; plain_cold=$took
  timed bash -c "$walk '$plain/c' >/dev/null"; plain_warm=$took
  rows+=("| $walk, $(printf "%'d" "$flat") files in one directory | plain files | $plain_cold s | $plain_warm s | - | - |")
  for b in "${bins[@]}"; do
    drop_caches; mount_store "$b" "$flat_store"
    timed bash -c "$walk '$m/a/c/0' >/dev/null"; cold=$took
    timed bash -c "$walk '$m/a/c/0' >/dev/null"; warm=$took
    peak=$(peak_mib "$pid")
    unmount_store "$b"
    ratio=$(python3 -c "print(f'{$cold / $plain_cold:.2f}x cold, {$warm / $plain_warm:.2f}x warm')")
    rows+=("| $walk, $(printf "%'d" "$flat") files in one directory | $b | $cold s | $warm s | $peak MiB | $ratio |")
    echo "bench listing: ${rows[-1]}" >&2
  done
done
for b in "${bins[@]}"; do
  drop_caches; before=$(fuse_inodes); mount_store "$b" "$big"
  timed bash -c "find '$m/a/c' -type f | wc -l > '$work/count'"
  after=$(fuse_inodes) peak=$(peak_mib "$pid")
  unmount_store "$b"
  [ "$(cat "$work/count")" = "$chunks" ] || { echo "bench listing: find found $(cat "$work/count") of $chunks" >&2; exit 1; }
  rate=$(python3 -c "print(f'{$chunks / $took:,.0f} files/s')")
  rows+=("| find -type f, $(printf "%'d" "$chunks") files in $((chunks / 4096)) directories | $b | $took s ($rate) | - | $peak MiB | $((after - before)) fuse_inode objects after |")
  echo "bench listing: ${rows[-1]}" >&2
done
{
  echo "| walk | build | cold | warm | daemon peak RSS | |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
