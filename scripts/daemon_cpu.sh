#!/usr/bin/env bash
# Daemon CPU per request, two or more shardfs binaries side by side: the CPU time (user + system)
# a read-only daemon spends serving one first pass of `cat` over every chunk of a sharded store
# (16 shards x 4,096 chunks of 1 KiB: 65,536 lookups and reads), with the store's pages warm so
# that the disk does not count. Each binary runs RUNS times, interleaved; medians are printed.
# For comparing a change with the commit before it, which wall-clock benchmarks on a shared
# machine cannot resolve. Each pass's wall time is printed too. A BIN may carry mount flags after
# it, as one argument, to compare ways of mounting one binary:
#
#   git worktree add /tmp/before HEAD~1 && (cd /tmp/before && cargo build --release)
#   cargo build --release && scripts/daemon_cpu.sh /tmp/before/target/release/shardfs target/release/shardfs
#   scripts/daemon_cpu.sh target/release/shardfs "target/release/shardfs --io-uring"
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

# one BIN [FLAGS]: prints the daemon's CPU milliseconds for one pass, and the pass's wall time
one() {
  local bin flags
  read -r bin flags <<<"$1"
  # shellcheck disable=SC2086 # FLAGS are words
  "$bin" mount -f --read-only $flags "$work/gen/sharded" "$mnt" &
  local pid=$!
  while ! mountpoint -q "$mnt"; do sleep 0.05; done
  local start=$EPOCHREALTIME
  find "$mnt/a/c" -type f -print0 | xargs -0 cat >/dev/null
  local wall_ms=$(((${EPOCHREALTIME/./} - ${start/./}) / 1000))
  local st
  read -r -a st <"/proc/$pid/stat"
  echo "$(((st[13] + st[14]) * 1000 / $(getconf CLK_TCK))) $wall_ms"
  "$bin" unmount "$mnt"
  wait "$pid"
}

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A cpu wall
for _ in $(seq "$runs"); do
  for bin in "$@"; do
    read -r c w <<<"$(one "$bin")"
    cpu[$bin]+="$c "
    wall[$bin]+="$w "
  done
done
for bin in "$@"; do
  # shellcheck disable=SC2086 # the samples are words
  echo "$bin: median $(median ${cpu[$bin]}) ms daemon CPU, $(median ${wall[$bin]}) ms wall for 65,536 lookups + reads (CPU: ${cpu[$bin]}; wall: ${wall[$bin]})"
done
