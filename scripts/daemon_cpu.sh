#!/usr/bin/env bash
# Daemon CPU per request, two or more shardfs binaries side by side: the CPU time (user + system)
# a read-only daemon spends serving one first pass of `cat` over every chunk of a sharded store
# (16 shards x 4,096 chunks of 1 KiB: 65,536 lookups and reads), with the store's pages warm so
# that the disk does not count. Each binary runs RUNS times, interleaved; medians are printed.
# For comparing a change with the commit before it, which wall-clock benchmarks on a shared
# machine cannot resolve:
#
#   git worktree add /tmp/before HEAD~1 && (cd /tmp/before && cargo build --release)
#   cargo build --release && scripts/daemon_cpu.sh /tmp/before/target/release/shardfs target/release/shardfs
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN...]" >&2; exit 2; }

work=$(mktemp -d -t shardfs-cpu.XXXXXX)
mnt=$work/mnt
cleanup() {
  if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" || true; fi
  if grep -q " $work/" /proc/mounts; then echo "daemon_cpu: mounts left under $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir "$mnt"
python3 scripts/bench_store.py "$work/gen" --shards 16 --chunks-per-shard 4096 --chunk-bytes 1024 >/dev/null
cat "$work"/gen/sharded/a/c/* >/dev/null

# one BIN: prints the daemon's CPU milliseconds for one pass
one() {
  "$1" mount -f --read-only "$work/gen/sharded" "$mnt" &
  local pid=$!
  while ! mountpoint -q "$mnt"; do sleep 0.05; done
  find "$mnt/a/c" -type f -print0 | xargs -0 cat >/dev/null
  local st
  read -r -a st <"/proc/$pid/stat"
  echo $(((st[13] + st[14]) * 1000 / $(getconf CLK_TCK)))
  "$1" unmount "$mnt"
  wait "$pid"
}

declare -A samples
for _ in $(seq "$runs"); do
  for bin in "$@"; do samples[$bin]+="$(one "$bin") "; done
done
for bin in "$@"; do
  median=$(printf '%s\n' ${samples[$bin]} | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$bin: median ${median} ms daemon CPU for 65,536 lookups + reads (runs: ${samples[$bin]})"
done
