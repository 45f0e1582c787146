#!/usr/bin/env bash
# Benchmark: shardfs against the same chunks as plain files (the speed limit) and packed into
# archives served by established FUSE tools (squashfuse, fuse-zip, ratarmount), side by side in
# one run, with hyperfine (warm-up, several runs, median). Prints a markdown table of medians and
# ratios against plain files and writes it, with the machine and the versions, to target/bench-PROFILE.md (or --out FILE).
#
#   scripts/bench.sh [--profile tiny|small|large|dirs|s3|azure|gcs|blz|zip|wan|wan-write|icechunk|db|huge] [--runs N] [--out FILE] [--quick]
#   scripts/bench.sh --profile tiny|small|large --vs OTHER/shardfs [--runs N]
#
# --vs: this build against another build's binary (an older commit's release build), both beside
# plain files in every hyperfine run, without the peers: an A/B of two builds in one run.
#
# Profiles: db = scripts/bench_db.py (zarr-python 2.18 reading 256 MiB through a mount of each
# database: SQLite, LMDB, LevelDB, GNU dbm, Berkeley DB, Redis, PostgreSQL, Kyoto Cabinet, against
# its own store where it has one, and each mount paired with a mount of the same chunks as plain
# files; its table goes to target/bench-db.md unless --out names a file; --quick: 64 MiB, one
# run); dirs = scripts/bench_dirs.sh (a warm find over 256 chunk directories of 256 files against
# plain files; its table goes to target/bench-dirs.md unless --out names a file); icechunk = scripts/bench_icechunk.py (an Icechunk repository read through a mount, and new
# arrays written through a mount of its branch, commits included, against Icechunk's own Python
# reader and writer, on the local disk and in s3s-fs behind the latency
# proxy at 0 and 20 ms; its table goes to target/bench-icechunk.md unless --out names a file;
# --quick: one run); huge = scripts/bench_huge.sh (stat walks over 10^8 chunk files and a directory of 2^20,
# against plain files and squashfuse, the daemon's RSS beside; stores written once into
# target/bench-huge/; its table goes to target/bench-huge.md unless --out names a file; --quick:
# the test command's small version, 98,304 and 131,072 files, on the dev build); wan-write = scripts/bench_wan_write.py (zarr-python 3.4 writing sharded arrays to s3s-fs
# behind the latency proxy at 0 and 20 ms: through shardfs against the bucket directly, rclone mount,
# s3fs-fuse and mountpoint-s3 (new files only: bulk and tiles); bulk, tiles, append, region and eight mounts at once; requests, bytes sent and peak
# RSS; every run verified; its table goes to target/bench-wan-write.md unless --out names a file;
# --quick: bulk a quarter, one run, no append for the direct writer); wan = scripts/bench_wan.py (object stores at cloud latency: s3s-fs behind
# scripts/latency_proxy.py at 0, 20 and 50 ms, each connection paced to 20 MB/s, shardfs against zarr-python reading the bucket
# directly, s3fs-fuse, rclone mount, mountpoint-s3 (scripts/mountpoint_s3.sh) and boto3; its table goes to target/bench-wan.md unless --out
# names a file; --quick: a quarter of the big array, one run, 0 and 20 ms); zip = scripts/bench_zip.sh (the small profile's store zipped as an .ozx: cat of every
# chunk through the view against plain files, and fuse-zip and ratarmount reading its shards; its
# table goes to target/bench-zip.md unless --out names a file); blz = scripts/bench_blz.sh (a
# zipline-like bcolz ctable of 10 million rows and a
# Bloscpack file through the view against cat of the source files; its table goes to
# target/bench-blz.md unless --out names a file); s3 = scripts/bench_s3.py (shardfs over S3 against s3fs-fuse; its table goes to
# target/bench-s3.md unless --out names a file); azure, gcs = the same script, shardfs alone on Azurite or
# fake-gcs-server (target/bench-azure.md, target/bench-gcs.md); small = 262,144 chunks of 1 KiB in 64 shards; large = 4,096 chunks of 256 KiB in 64
# shards; tiny = 1,024 chunks of 1 KiB in 4 shards, on the dev build (the test suite runs it so the
# script keeps working, and has that build already). Not a test: nothing here asserts a speed.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=small runs=5 out= quick=() vs=
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --vs) vs=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--profile tiny|small|large|dirs|s3|azure|gcs|blz|zip|wan|wan-write|icechunk|db|huge] [--runs N] [--out FILE] [--quick] [--vs OTHER/shardfs]" >&2; exit 2 ;;
  esac
done
source scripts/lib.sh
# install_peers: hyperfine and the FUSE peers (apt-get), ratarmount in target/venv-bench.
install_peers() {
  need_tools hyperfine:hyperfine squashfs-tools:mksquashfs squashfuse:squashfuse fuse-zip:fuse-zip zip:zip
  if [ ! -x "$venv/bin/ratarmount" ]; then
    echo "bench: installing ratarmount in $venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check ratarmount
  fi
}
venv=target/venv-bench
if [ "$profile" = zip ]; then
  install_peers
  exec scripts/bench_zip.sh --runs "$runs" --out "${out:-target/bench-zip.md}"
fi
if [ "$profile" = wan ]; then
  # The peers are Debian packages, installed here on demand (a benchmark's tools, not the tests').
  need_tools s3fs:s3fs rclone:rclone
  scripts/setup.sh
  scripts/mountpoint_s3.sh >/dev/null
  exec target/venv/bin/python scripts/bench_wan.py --runs "$runs" "${quick[@]}" --out "${out:-target/bench-wan.md}"
fi
if [ "$profile" = db ]; then
  scripts/setup.sh
  exec target/venv-v2/bin/python scripts/bench_db.py --runs "$runs" "${quick[@]}" --out "${out:-target/bench-db.md}"
fi
if [ "$profile" = icechunk ]; then
  scripts/setup.sh
  exec target/venv-newest/bin/python scripts/bench_icechunk.py --runs "$runs" "${quick[@]}" --out "${out:-target/bench-icechunk.md}"
fi
if [ "$profile" = huge ]; then
  sizes=(); [ ${#quick[@]} -gt 0 ] && sizes=(--chunks 98304 --flat 131072 --no-peers --dev)
  exec scripts/bench_huge.sh "${sizes[@]}" --out "${out:-target/bench-huge.md}"
fi
if [ "$profile" = wan-write ]; then
  need_tools s3fs:s3fs rclone:rclone
  scripts/setup.sh
  scripts/mountpoint_s3.sh >/dev/null
  # zarr-python 3.4 (its LocalStore writes a temporary file and renames it, as users' will).
  exec target/venv-newest/bin/python scripts/bench_wan_write.py --runs "$runs" "${quick[@]}" \
    --out "${out:-target/bench-wan-write.md}"
fi
if [ "$profile" = dirs ]; then
  need_tools hyperfine:hyperfine
  exec scripts/bench_dirs.sh --runs "$runs" --out "${out:-target/bench-dirs.md}"
fi
if [ "$profile" = blz ]; then
  exec scripts/bench_blz.sh --runs "$runs" --out "${out:-target/bench-blz.md}"
fi
if [ "$profile" = s3 ]; then
  # Object stores: shardfs against s3fs-fuse on a local S3 server (its own script; see there).
  scripts/setup.sh
  exec target/venv/bin/python scripts/bench_s3.py --runs "$runs" --out "${out:-target/bench-s3.md}"
fi
if [ "$profile" = azure ] || [ "$profile" = gcs ]; then
  scripts/setup.sh
  exec target/venv/bin/python scripts/bench_s3.py --service "$profile" --runs "$runs" \
    --out "${out:-target/bench-$profile.md}"
fi
build=release
case $profile in
  tiny) shards=4 per=256 bytes=1024 copies=1024 rss_shards=64 build=dev ;;
  small) shards=64 per=4096 bytes=1024 copies=65536 rss_shards=2442 ;;
  large) shards=64 per=64 bytes=262144 copies=4096 rss_shards=2442 ;;
  *) echo "unknown profile $profile" >&2; exit 2 ;;
esac
total=$((shards * per))
if [ -n "$vs" ]; then
  [ -x "$vs" ] || { echo "bench: --vs $vs: no such binary" >&2; exit 2; }
  need_tools hyperfine:hyperfine
else
  install_peers
fi

cargo build --profile "$build" --locked -q --bins --examples
out_dir=$PWD/target/$([ "$build" = dev ] && echo debug || echo release)
bin=$out_dir/shardfs
reads=$out_dir/examples/random_reads

scratch bench

echo "bench: profile $profile: $total chunks of $bytes bytes in $shards shards"
python3 scripts/bench_store.py "$work/gen" --shards "$shards" --chunks-per-shard "$per" --chunk-bytes "$bytes"
if [ -z "$vs" ]; then
  mksquashfs "$work/gen/plain" "$work/store.sqfs" -noappend -quiet -no-progress -no-duplicates >/dev/null
  (cd "$work/gen/plain" && zip -qr0 "$work/store.zip" .)
  tar -C "$work/gen/plain" -cf "$work/store.tar" .
fi

declare -A dir chunks
dir[plain]=$work/gen/plain
# serve SYSTEM: mounts SYSTEM's copy of the chunks at its mount point.
serve() {
  case $1 in
    shardfs) "$bin" mount --read-only "$work/gen/sharded" "${dir[$1]}" ;;
    shardfs-v2) "$bin" mount --read-only --zarr-format 2 "$work/gen/sharded" "${dir[$1]}" ;;
    shardfs-vs) "$vs" mount --read-only "$work/gen/sharded" "${dir[$1]}" ;;
    squashfuse) squashfuse "$work/store.sqfs" "${dir[$1]}" ;;
    fuse-zip) fuse-zip -r "$work/store.zip" "${dir[$1]}" ;;
    ratarmount) "$venv/bin/ratarmount" "$work/store.tar" "${dir[$1]}" >/dev/null ;;
  esac
}
systems=(plain shardfs shardfs-v2 squashfuse fuse-zip ratarmount)
[ -n "$vs" ] && systems=(plain shardfs shardfs-vs)
for s in "${systems[@]:1}"; do mkmnt "m-$s"; dir[$s]=$m; serve "$s"; done
# Where each system shows chunk n (the v2 view names it without the v3 "c/" prefix).
for s in "${systems[@]}"; do chunks[$s]=${dir[$s]}/a/c; done
[ -n "$vs" ] || chunks[shardfs-v2]=${dir[shardfs-v2]}/a

results=$work/results.md
: > "$results"
measure() { # measure TITLE COMMAND  ({} the system's mount, {c} its chunk directory)
  local title=$1 template=$2 args=() command
  for s in "${systems[@]}"; do
    command=${template//\{c\}/${chunks[$s]}}
    args+=(-n "$s" "${command//\{\}/${dir[$s]}}")
  done
  hyperfine_json "$work/h.json" "${args[@]}"
  python3 - "$title" "$work/h.json" >>"$results" <<'PY'
import json, sys
title, data = sys.argv[1], json.load(open(sys.argv[2]))["results"]
med = {r["command"]: r["median"] for r in data}
base = med["plain"]
cells = " | ".join(f"{med[s]*1000:.1f} ms ({med[s]/base:.2f}x)" for s in med)
print(f"| {title} | {cells} |")
PY
}

measure "find -type f \\| wc -l" "bash -c 'find {} -type f | wc -l'"
measure "ls -lR (stat of every chunk)" "bash -c 'ls -lR {} >/dev/null'"
measure "cat of every chunk, warm" "bash -c 'find {} -type f -print0 | xargs -0 cat >/dev/null'"
measure "10,000 random reads, 1 thread" "$reads {c} 10000 1 $total"
measure "10,000 random reads, 8 threads" "$reads {c} 10000 8 $total"

cold_cat_row "cat of every chunk, cold (fresh mount, caches dropped)" "" >>"$results"

# Writes: cp -r of new chunk files into a writable view (committed by shardfs unmount) and into
# plain files (then sync), three fresh runs each; then the index and unused bytes cp -r left.
python3 scripts/bench_store.py "$work/src" --shards 1 --chunks-per-shard "$copies" --chunk-bytes "$bytes"
# builds: each shardfs binary of the run, by the name of its column.
declare -A builds=([shardfs]=$bin)
[ -n "$vs" ] && builds[shardfs-vs]=$vs
writers=(plain shardfs)
[ -n "$vs" ] && writers+=(shardfs-vs)
cp_times=()
for target in "${writers[@]}"; do
  times=()
  for run in 1 2 3; do
    rm -rf "$work/w"; mkdir -p "$work/w/store/b"
    cp "$work/gen/sharded/zarr.json" "$work/w/store/"
    python3 - "$work/gen/sharded/a/zarr.json" "$work/w/store/b/zarr.json" "$copies" "$bytes" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["shape"] = [int(sys.argv[3]) * int(sys.argv[4])]
json.dump(doc, open(sys.argv[2], "w"))
PY
    # Nothing else left to write back first: plain files' `sync` writes back whatever is dirty
    # (what the profile wrote before it), and would be timed for it.
    sync
    if [ "$target" = plain ]; then
      start=$(date +%s.%N); cp -r "$work/src/plain/a/c" "$work/w/store/b/"; sync; end=$(date +%s.%N)
    else
      mkmnt m-write; "${builds[$target]}" mount "$work/w/store" "$m"
      start=$(date +%s.%N); cp -r "$work/src/plain/a/c" "$m/b/"; "$bin" unmount "$m"; end=$(date +%s.%N)
    fi
    times+=("$(python3 -c "print($end - $start)")")
  done
  cp_times+=("$(printf '%s\n' "${times[@]}" | sort -g | sed -n 2p)")
done
overhead=$("$bin" info "$work/w/store" | awk '$1 == "b" { printf "%.2f%% (index %d + unused %d bytes for %d data bytes)", 100 * ($5 + $6) / $4, $6, $5, $4 }')
python3 - "$copies" "$((${#systems[@]} - ${#writers[@]}))" "${cp_times[@]}" >>"$results" <<'PY'
import sys
n, blanks, times = int(sys.argv[1]), int(sys.argv[2]), [float(t) for t in sys.argv[3:]]
cells = [f"{t*1000:.1f} ms ({t/times[0]:.2f}x)" for t in times] + ["-"] * blanks
print(f"| cp -r of {n:,} new chunks (+ commit) | " + " | ".join(cells) + " |")
PY

# Memory: each build's peak RSS after a full find on an index-only store.
python3 scripts/bench_store.py "$work/rss" --shards "$rss_shards" --chunks-per-shard 4096 --chunk-bytes 1 --index-only
declare -A rss
for build in "${!builds[@]}"; do
  mkmnt "m-rss-$build"; "${builds[$build]}" mount -f --read-only "$work/rss/sharded" "$m" & pid=$!
  until mountpoint -q "$m"; do kill -0 "$pid"; sleep 0.05; done
  found=$(find "$m" -type f | wc -l)
  rss[$build]=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  "$bin" unmount "$m"
done

# Mount time for 100 and 100,000 shards.
mount_ms() { # mount_ms BUILD SHARDS
  [ -d "$work/mt$2" ] || python3 scripts/bench_store.py "$work/mt$2" --shards "$2" --chunks-per-shard 1 --chunk-bytes 1 --index-only
  mkmnt "m-mt$2-$1"
  local start end; start=$(date +%s%N); "${builds[$1]}" mount --read-only "$work/mt$2/sharded" "$m"; end=$(date +%s%N)
  "$bin" unmount "$m"
  mount_time=$(((end - start) / 1000000))
}
big=100000; [ "$profile" = tiny ] && big=1000
memory_lines=()
for build in "${!builds[@]}"; do
  mount_ms "$build" 100; mt100=$mount_time
  mount_ms "$build" "$big"; mt100k=$mount_time
  memory_lines+=("- $build: daemon peak RSS after \`find\` over $found files (index-only shards): $((rss[$build] / 1024)) MiB; mount time $mt100 ms for 100 shards, $mt100k ms for $big shards.")
done
header="| operation | plain files | shardfs | shardfs (v2 view) | squashfuse | fuse-zip | ratarmount |"
# (head ends ratarmount's output early: its SIGPIPE is no failure here.)
ratarmount_version=$("$venv/bin/ratarmount" --version 2>/dev/null | head -1 || true)
versions="$("$bin" --version), squashfuse $(dpkg-query -W -f='${Version}' squashfuse 2>/dev/null || true), fuse-zip $(dpkg-query -W -f='${Version}' fuse-zip 2>/dev/null || true), $ratarmount_version"
reproduce="scripts/bench.sh --profile $profile --runs $runs"
if [ -n "$vs" ]; then
  header="| operation | plain files | shardfs (this tree, $(git rev-parse --short HEAD)) | shardfs-vs ($vs) |"
  versions="shardfs-vs = $vs"
  reproduce+=" --vs $vs"
fi

{
  echo "# Benchmarks"
  echo
  echo "Profile \`$profile\`: $total chunks of $bytes bytes in $shards shards; medians of $runs runs"
  echo "after one warm-up (hyperfine); ratios against plain files on the same disk, all in one run."
  echo
  echo "Reproduce: \`$reproduce\`"
  echo
  echo "$header"
  echo "|---|$(printf -- '---|%.0s' "${systems[@]}")"
  cat "$results"
  echo
  echo "- cp -r into the view leaves index + unused space of $overhead."
  printf '%s\n' "${memory_lines[@]}"
  echo
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), Linux $(uname -r)."
  echo "Versions: $versions, $(hyperfine --version)."
} > "$work/report.md"
cat "$work/report.md"
cp "$work/report.md" "${out:-target/bench-$profile.md}"
