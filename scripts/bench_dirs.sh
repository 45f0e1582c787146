#!/usr/bin/env bash
# Benchmark of listing many chunk directories (run by `scripts/bench.sh --profile dirs`): a warm
# `find -type f | wc -l` over a mount of a 2-D sharded array whose chunk files fill 256 directories
# of 256 (65,536 chunk files, one shard per directory; scripts/bench_store.py --rows), against the
# same chunks as plain files on disk. The kernel keeps a listing once read (FOPEN_CACHE_DIR), so a
# warm walk costs the daemon two requests per directory (opendir, releasedir). Hyperfine medians
# (each command's runs in a row, after a warm-up run); one line to OUT.
#
#   scripts/bench_dirs.sh [--dirs N] [--per-dir M] [--runs N] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=256 per=256 runs=21 out=target/bench-dirs.md
while [ $# -gt 0 ]; do
  case $1 in
    --dirs) dirs=$2; shift 2 ;;
    --per-dir) per=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--dirs N] [--per-dir M] [--runs N] [--out FILE]" >&2; exit 2 ;;
  esac
done
command -v hyperfine >/dev/null || { echo "bench-dirs: needs hyperfine (scripts/bench.sh installs it)" >&2; exit 1; }
cargo build --release --locked -q --bins
bin=$PWD/target/release/shardfs
source scripts/lib.sh
scratch bench-dirs
python3 scripts/bench_store.py "$work/gen" --shards "$dirs" --chunks-per-shard "$per" --chunk-bytes 64 --rows
mkmnt mnt
"$bin" mount --read-only "$work/gen/sharded" "$m"
want=$(find "$work/gen/plain" -type f | wc -l)
got=$(find "$m" -type f | wc -l)
[ "$got" = "$want" ] || { echo "bench-dirs: the mount lists $got files, the plain copy $want" >&2; exit 1; }
hyperfine_json "$work/h.json" -n shardfs "bash -c 'find $m -type f | wc -l'" \
  -n plain "bash -c 'find $work/gen/plain -type f | wc -l'"
python3 - "$work/h.json" "$dirs" "$per" "$runs" >"$out" <<'PY'
import json, sys
data, dirs, per, runs = json.load(open(sys.argv[1]))["results"], *sys.argv[2:]
med = {r["command"]: r["median"] for r in data}
print(f"Warm `find -type f | wc -l` over {int(dirs) * int(per):,} chunk files in {dirs} directories, "
      f"hyperfine medians of {runs} runs: shardfs {med['shardfs'] * 1000:.1f} ms, "
      f"plain files {med['plain'] * 1000:.1f} ms, {med['shardfs'] / med['plain']:.2f}x.")
PY
cat "$out"
