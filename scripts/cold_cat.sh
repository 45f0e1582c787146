#!/usr/bin/env bash
# Cold `cat` of every chunk file of the small profile's store (262,144 chunks of 1 KiB in 64
# shards, one chunk directory), through each build given in turn, round after round: a fresh
# read-only mount each time, the kernel's caches dropped before each pass (root). Prints one
# line per pass; compare builds pass by pass, as the machine drifts between rounds.
#
#   scripts/cold_cat.sh [--rounds N] BIN...    (BIN: a shardfs binary; `plain`: the plain files)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=4
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [--rounds N] BIN|plain..." >&2; exit 2; }
store=target/bench-cold-cat
[ -d "$store/sharded" ] || python3 scripts/bench_store.py "$store" --shards 64 --chunks-per-shard 4096 --chunk-bytes 1024 >/dev/null
mnt=$(mktemp -d /tmp/shardfs-cold-cat.XXXXXX)
trap 'mountpoint -q "$mnt" && fusermount3 -u "$mnt"; rmdir "$mnt"' EXIT
for round in $(seq "$rounds"); do
  for bin in "$@"; do
    dir=$store/plain
    if [ "$bin" != plain ]; then "$bin" mount --read-only "$store/sharded" "$mnt"; dir=$mnt; fi
    sync; echo 3 >/proc/sys/vm/drop_caches
    start=$(date +%s%N)
    find "$dir/a/c" -type f -print0 | xargs -0 cat >/dev/null
    end=$(date +%s%N)
    echo "round $round $bin $(((end - start) / 1000000)) ms"
    if [ "$bin" != plain ]; then "$bin" unmount "$mnt"; fi
  done
done
