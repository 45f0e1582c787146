#!/usr/bin/env bash
# Benchmark of a zip store through shardfs (run by `scripts/bench.sh --profile zip`): the sharded
# store of scripts/bench_store.py zipped as RFC-9 asks for an .ozx (stored, zarr.json first; by
# Python's zipfile), mounted, and `cat` of every chunk file of the view against `cat` of the same
# chunks as plain files on disk, warm and cold (fresh mount, caches dropped); beside them, fuse-zip
# and ratarmount serving the same .ozx, where `cat` reads its shard files (they cannot show
# chunks), and shardfs over the same store unzipped (shardfs-dir), which shows what the zip costs.
# Prints a markdown table of hyperfine medians and ratios and writes it to OUT.
#
#   scripts/bench_zip.sh [--shards N] [--chunks-per-shard M] [--chunk-bytes B] [--runs N] [--out FILE]
#
# Default: 64 shards of 4,096 chunks of 1 KiB (262,144 chunks, the small profile's geometry).
# Needs hyperfine and fuse-zip (scripts/bench.sh installs them, and ratarmount in
# target/venv-bench); a missing peer is left out with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
shards=64 per=4096 bytes=1024 runs=5 out=target/bench-zip.md
while [ $# -gt 0 ]; do
  case $1 in
    --shards) shards=$2; shift 2 ;;
    --chunks-per-shard) per=$2; shift 2 ;;
    --chunk-bytes) bytes=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--shards N] [--chunks-per-shard M] [--chunk-bytes B] [--runs N] [--out FILE]" >&2; exit 2 ;;
  esac
done
command -v hyperfine >/dev/null || { echo "bench-zip: needs hyperfine (scripts/bench.sh installs it)" >&2; exit 1; }
cargo build --release --locked -q --bins
bin=$PWD/target/release/shardfs
ratarmount=$PWD/target/venv-bench/bin/ratarmount
source scripts/lib.sh
scratch bench-zip
declare -A dir
systems=(plain shardfs shardfs-dir)
command -v fuse-zip >/dev/null && systems+=(fuse-zip) || echo "bench-zip: no fuse-zip, left out" >&2
[ -x "$ratarmount" ] && systems+=(ratarmount) || echo "bench-zip: no ratarmount in target/venv-bench, left out" >&2
total=$((shards * per))
echo "bench-zip: $total chunks of $bytes bytes in $shards shards"
python3 scripts/bench_store.py "$work/gen" --shards "$shards" --chunks-per-shard "$per" --chunk-bytes "$bytes"
python3 - "$work/gen/sharded" "$work/store.ozx" <<'PY'
import os, sys, zipfile
root, out = sys.argv[1:]
files = sorted((os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns),
               key=lambda p: (not p.endswith("zarr.json"), p))
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
    for f in files:
        z.write(os.path.join(root, f), f)
    z.comment = b'{"ome": {"version": "0.5", "zipFile": {"centralDirectory": {"jsonFirst": true}}}}'
PY
dir[plain]=$work/gen/plain
serve() {
  case $1 in
    shardfs) "$bin" mount "$work/store.ozx" "${dir[$1]}" ;;
    shardfs-dir) "$bin" mount --read-only "$work/gen/sharded" "${dir[$1]}" ;;
    fuse-zip) fuse-zip -r "$work/store.ozx" "${dir[$1]}" ;;
    ratarmount) "$ratarmount" "$work/store.ozx" "${dir[$1]}" >/dev/null ;;
  esac
}
for s in "${systems[@]:1}"; do mkmnt "m-$s"; dir[$s]=$m; serve "$s"; done
# `cat` reads a/c in each: chunk files (plain, shardfs, shardfs-dir) or shard files (the zip peers).
count=$(find "${dir[shardfs]}/a/c" -type f | wc -l)
[ "$count" = "$total" ] || { echo "bench-zip: the view shows $count chunk files, not $total" >&2; exit 1; }
cmp <(cd "${dir[plain]}" && find a/c -type f -print0 | sort -z | xargs -0 cat) \
  <(cd "${dir[shardfs]}" && find a/c -type f -print0 | sort -z | xargs -0 cat) ||
  { echo "bench-zip: the view's chunks differ from the plain files" >&2; exit 1; }

results=$work/results.md
: >"$results"
args=()
for s in "${systems[@]}"; do args+=(-n "$s" "bash -c 'find ${dir[$s]}/a/c -type f -print0 | xargs -0 cat >/dev/null'"); done
hyperfine_json "$work/h.json" "${args[@]}"
python3 - "$work/h.json" >>"$results" <<'PY'
import json, sys
med = {r["command"]: r["median"] for r in json.load(open(sys.argv[1]))["results"]}
print("| `cat` of every file, warm | " + " | ".join(f"{m*1000:.1f} ms ({m/med['plain']:.2f}x)" for m in med.values()) + " |")
PY
cold_cat_row '`cat` of every file, cold (fresh mount, caches dropped)' /a/c >>"$results"
unserve shardfs
start=$(date +%s%N); serve shardfs; end=$(date +%s%N)
mount_ms=$(((end - start) / 1000000))
{
  echo "Zip profile: $total chunks of $bytes bytes in $shards shards, zipped as an .ozx ($(stat -c %s "$work/store.ozx") bytes,"
  echo "stored, zarr.json first); medians of $runs runs. shardfs (the .ozx), shardfs-dir (the same store unzipped) and plain
files \`cat\` the $total chunk files; fuse-zip and"
  echo "ratarmount serve the same .ozx and \`cat\` its $shards shard files (the same bytes plus indexes)."
  echo
  echo "Reproduce: \`scripts/bench_zip.sh --shards $shards --chunks-per-shard $per --chunk-bytes $bytes --runs $runs\`"
  echo
  echo "| operation | $(printf '%s | ' "${systems[@]}" | sed 's/ | $//') |"
  echo "|---|$(printf -- '---|%.0s' "${systems[@]}")"
  cat "$results"
  echo
  echo "- Mount time of the .ozx: $mount_ms ms."
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), Linux $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
  echo "Versions: $("$bin" --version), fuse-zip $(dpkg-query -W -f='${Version}' fuse-zip 2>/dev/null), $("$ratarmount" --version 2>/dev/null | head -1), $(hyperfine --version)."
} >"$work/report.md"
cat "$work/report.md"
cp "$work/report.md" "$out"
