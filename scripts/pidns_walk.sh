#!/usr/bin/env bash
# Stat walks (`ls -l` of one directory, `ls -lR` and `du -s` of many) through a daemon in this pid
# namespace and through one in a pid namespace of its own, as a container's or the CSI plugin's
# is, where every request comes as thread 0 (`src/fs/listing_attributes.rs`). Each build given,
# round after round: a fresh read-only mount each time, the kernel's caches dropped before each
# walk (root). Prints one line per walk.
#
#   scripts/pidns_walk.sh [--rounds N] BIN...
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [--rounds N] BIN..." >&2; exit 2; }
one=target/bench-pidns/one   # 65,536 chunk files in one directory
rows=target/bench-pidns/rows # 65,536 chunk files in 256 directories
[ -d "$one/sharded" ] || python3 scripts/bench_store.py "$one" --shards 16 --chunks-per-shard 4096 --chunk-bytes 64 >/dev/null
[ -d "$rows/sharded" ] || python3 scripts/bench_store.py "$rows" --shards 256 --chunks-per-shard 256 --chunk-bytes 64 --rows >/dev/null
mnt=$(mktemp -d /tmp/shardfs-pidns.XXXXXX)
daemon=
finish() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  [ -z "$daemon" ] || wait "$daemon" 2>/dev/null || true
  rmdir "$mnt"
}
trap finish EXIT
timed() { # LABEL COMMAND...
  sync; echo 3 >/proc/sys/vm/drop_caches
  local start end
  start=$(date +%s%N); "${@:2}" >/dev/null; end=$(date +%s%N)
  echo "round $round $bin $ns $1 $(((end - start) / 1000000)) ms"
}
for round in $(seq "$rounds"); do
  for bin in "$@"; do
    for ns in shared own; do
      for store in "$one" "$rows"; do
        if [ $ns = shared ]; then
          "$bin" mount --read-only "$store/sharded" "$mnt"
        else
          unshare --pid --fork "$bin" mount -f --read-only "$store/sharded" "$mnt" & daemon=$!
          for _ in $(seq 200); do mountpoint -q "$mnt" && break; sleep 0.05; done
        fi
        if [ "$store" = "$one" ]; then
          timed "ls -l (1 dir)" ls -l "$mnt/a/c"
        else
          timed "ls -lR (256 dirs)" ls -lR "$mnt/a/c"
          timed "du -s (256 dirs)" du -s "$mnt/a/c"
        fi
        # Older builds' `shardfs unmount` waits 60 s for the pid their daemon names inside its
        # namespace; a read-only mount has nothing to commit.
        if [ -n "$daemon" ]; then fusermount3 -u "$mnt"; wait "$daemon"; daemon=; else "$bin" unmount "$mnt"; fi
      done
    done
  done
done
