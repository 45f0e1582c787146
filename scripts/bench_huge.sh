#!/usr/bin/env bash
# The huge profile of scripts/bench.sh: stat walks and reads over stores of as many chunk files as
# sharded datasets hold, with the daemon's resident memory sampled throughout, side by side with
# plain files and squashfuse.
#
#   scripts/bench_huge.sh [--chunks N] [--flat M] [--no-peers] [--dev] [--out FILE]
#
# Stores, written once by examples/huge_store.rs (straight as shard files) and kept in
# target/bench-huge/ for later runs:
# - `big`: N inner chunks of 4 bytes (default 99,999,744: 24,414 directories of 4,096 chunk
#   files, one shard each, crc32c indexes);
# - `flat`: M chunk files in one directory (default 1,048,576), and the same as M plain files
#   (and as a squashfs image of them, for squashfuse).
# Measured, each on a fresh mount with the kernel's caches dropped first (cold), the daemon's peak
# RSS (VmHWM) beside: `find -type f | wc -l` over `big`; `ls -l` and `du -s` of the flat
# directory (shardfs, plain files, squashfuse), and `ls -l` again warm; `du -s` over 2 x 10^6
# chunk files of `big` (488 directories); 10,000 chunk files of `big` read at random and compared
# with what the writer put there (huge_store check); and a walk, the kernel's caches dropped, the
# same walk again: the daemon's RSS after each (memory given back is not taken again).
# `--chunks 98304 --flat 131072 --no-peers` (no squashfuse) is the small version the test command
# runs with `--dev` (the unoptimized build the tests made, sparing CI a release build of about six
# minutes), so that the profile keeps working (its figures are not checked; its reads and counts are).
# Not a test of speed.
set -euo pipefail
cd "$(dirname "$0")/.."

chunks=99999744 flat=1048576 out=target/bench-huge.md peers=1 build=release
while [ $# -gt 0 ]; do
  case $1 in
    --chunks) chunks=$2; shift 2 ;;
    --flat) flat=$2; shift 2 ;;
    --no-peers) peers=0; shift ;;
    --dev) build=dev; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--chunks N] [--flat M] [--no-peers] [--dev] [--out FILE]" >&2; exit 2 ;;
  esac
done
per_dir=4096
if [ $((chunks % per_dir)) -ne 0 ] || [ $((flat % 4096)) -ne 0 ]; then
  echo "bench huge: --chunks and --flat must be multiples of 4096" >&2; exit 2
fi
source scripts/lib.sh
need_tools squashfs-tools:mksquashfs squashfuse:squashfuse
cargo build --profile "$build" --locked -q --bins --examples
out_dir=$PWD/target/$([ "$build" = dev ] && echo debug || echo release)
bin=$out_dir/shardfs
gen=$out_dir/examples/huge_store

stores=$PWD/target/bench-huge
big=$stores/big-$chunks flat_store=$stores/flat-$flat plain=$stores/plain-$flat sqfs=$stores/plain-$flat.sqfs
mkdir -p "$stores"
[ -f "$big/a/zarr.json" ] || { rm -rf "$big"; "$gen" write "$big" --chunks "$chunks" --per-dir "$per_dir"; }
[ -f "$flat_store/a/zarr.json" ] || { rm -rf "$flat_store"; "$gen" write "$flat_store" --chunks "$flat" --per-dir "$flat"; }
[ -d "$plain/c" ] || { rm -rf "$plain"; "$gen" plain "$plain" --files "$flat"; }
[ "$peers" = 0 ] || [ -f "$sqfs" ] || mksquashfs "$plain" "$sqfs" -noappend -quiet -no-progress -no-duplicates >/dev/null

scratch bench-huge
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
peak_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
# mount_store STORE NAME [writable]: a shardfs mount of STORE in the foreground (its pid in $pid),
# its mount point in $m; read-only unless `writable` is given.
mount_store() {
  local flags=(--read-only)
  if [ "${3:-}" = writable ]; then flags=(); fi
  mkmnt "$2"
  "$bin" mount -f "${flags[@]}" "$1" "$m" 2>>"$work/daemon.log" & pid=$!
  until mountpoint -q "$m"; do kill -0 "$pid"; sleep 0.05; done
}
unmount_store() { "$bin" unmount "$m"; wait "$pid" || true; }
# timed COMMAND...: runs it, its wall time in seconds in $took.
timed() {
  local start end; start=$(date +%s%N); "$@"; end=$(date +%s%N)
  took=$(python3 -c "print(f'{($end - $start) / 1e9:.2f}')")
}
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); echo "bench huge: $1: shardfs $2, plain $3, squashfuse $4" >&2; }
mib() { python3 -c "print(f'{$1 / 1024:.0f} MiB')"; }

# find over every chunk file of `big`.
drop_caches; mount_store "$big" m-find
timed bash -c "find '$m/a/c' -type f | wc -l > '$work/count'"
found=$(cat "$work/count") find_peak=$(peak_kib "$pid")
unmount_store
[ "$found" = "$chunks" ] || { echo "bench huge: find found $found of $chunks chunk files" >&2; exit 1; }
rate=$(python3 -c "print(f'{$chunks / $took:,.0f}')")
row "find -type f over $(printf "%'d" "$chunks") chunk files ($rate files/s)" "$took s, $(mib "$find_peak") peak RSS" - -

# ls -l and du -s of the flat directory, cold, against plain files and squashfuse.
mkmnt sq; sq=$m
for walk in "ls -l" "du -s"; do
  drop_caches; mount_store "$flat_store" m-flat
  timed bash -c "$walk '$m/a/c/0' >/dev/null"; cold=$took cold_peak=$(peak_kib "$pid")
  timed bash -c "$walk '$m/a/c/0' >/dev/null"; warm=$took
  unmount_store
  drop_caches; timed bash -c "$walk '$plain/c' >/dev/null"; plain_cold=$took
  timed bash -c "$walk '$plain/c' >/dev/null"; plain_warm=$took
  sq_cold=- sq_warm=-
  if [ "$peers" = 1 ]; then
    drop_caches; squashfuse "$sqfs" "$sq"; timed bash -c "$walk '$sq/c' >/dev/null"; sq_cold="$took s"
    timed bash -c "$walk '$sq/c' >/dev/null"; sq_warm="$took s"; fusermount3 -u "$sq"
  fi
  ratio=$(python3 -c "print(f'{$cold / $plain_cold:.2f}')")
  row "$walk of one directory of $(printf "%'d" "$flat") files, cold (${ratio}x plain)" \
    "$cold s, $(mib "$cold_peak") peak RSS" "$plain_cold s" "$sq_cold"
  row "$walk of it again, warm" "$warm s" "$plain_warm s" "$sq_warm"
done

# ls -l on a writable mount: its chunk inodes are kept by group too.
drop_caches; mount_store "$flat_store" m-writable writable
timed bash -c "ls -l '$m/a/c/0' >/dev/null"; writable_peak=$(peak_kib "$pid")
unmount_store
row "ls -l of it on a writable mount, cold" "$took s, $(mib "$writable_peak") peak RSS" - -

# du -s over 2 x 10^6 chunk files of `big` (fewer when it holds fewer).
dirs=$((chunks / per_dir < 488 ? chunks / per_dir : 488))
drop_caches; mount_store "$big" m-du
timed bash -c "cd '$m/a/c' && du -s \$(seq 0 $((dirs - 1))) >/dev/null"
du_peak=$(peak_kib "$pid")
unmount_store
row "du -s over $(printf "%'d" $((dirs * per_dir))) chunk files in $dirs directories" "$took s, $(mib "$du_peak") peak RSS" - -

# 10,000 chunk files read at random, each compared with what the writer put there.
drop_caches; mount_store "$big" m-read
timed "$gen" check "$m/a" --chunks "$chunks" --per-dir "$per_dir" --samples 10000
read_peak=$(peak_kib "$pid")
unmount_store
row "10,000 random chunk files of it read, exact" "$took s, $(mib "$read_peak") peak RSS" - -

# Memory given back: ls -l, the kernel's caches dropped (it forgets every inode), ls -l again.
mount_store "$flat_store" m-again
ls -l "$m/a/c/0" >/dev/null; first=$(rss_kib "$pid")
drop_caches; sleep 1; dropped=$(rss_kib "$pid")
ls -l "$m/a/c/0" >/dev/null; second=$(rss_kib "$pid")
unmount_store
row "RSS after ls -l, after the kernel dropped its caches, after ls -l again" \
  "$(mib "$first"), $(mib "$dropped"), $(mib "$second")" - -

{
  echo "Huge profile: \`big\` is $(printf "%'d" "$chunks") chunk files of 4 bytes ($((chunks / per_dir)) directories of 4,096, one"
  echo "shard each); the flat directory $(printf "%'d" "$flat") chunk files, beside as many plain files (ext4) and a"
  echo "squashfs image of them. Read-only mounts but one, each fresh, the kernel's caches dropped before each cold"
  echo "walk; peak RSS is the daemon's VmHWM. Reproduce: \`scripts/bench.sh --profile huge\`."
  echo
  echo "| walk | shardfs | plain files | squashfuse |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
