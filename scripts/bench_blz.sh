#!/usr/bin/env bash
# Benchmark of BLZ data through shardfs (run by `scripts/bench.sh --profile blz`): a zipline-like
# ctable of ROWS rows (seven uint32 columns, written by bcolz-zipline) and a Bloscpack file of the
# same size (bloscpack 0.16.0, 1 MiB chunks, adler32), read chunk by chunk through the view against
# cat of the same source files. Prints a markdown table (hyperfine medians) and writes it to OUT.
#
#   scripts/bench_blz.sh [--rows N] [--runs N] [--out FILE]      (default: 10,000,000 rows)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=10000000 runs=5 out=target/bench-blz.md
while [ $# -gt 0 ]; do
  case $1 in
    --rows) rows=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--rows N] [--runs N] [--out FILE]" >&2; exit 2 ;;
  esac
done
scripts/setup.sh
command -v hyperfine >/dev/null || { echo "bench-blz: needs hyperfine (scripts/bench.sh installs it)" >&2; exit 1; }
cargo build --release --locked -q --bins
bin=$PWD/target/release/shardfs
source scripts/lib.sh
scratch bench-blz
mkmnt mnt; mnt=$m
mkdir -p "$work/src"
target/venv-blz/bin/python - "$work/src" "$rows" <<'PY'
import collections, collections.abc, sys
collections.MutableMapping = collections.abc.MutableMapping
import bcolz, bloscpack, numpy as np
out, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
walk = lambda: (10_000 + np.cumsum(rng.integers(-5, 6, n))).astype("<u4")
cols = {"open": walk(), "high": walk(), "low": walk(), "close": walk(),
        "volume": rng.integers(0, 1_000_000, n).astype("<u4"),
        "day": np.repeat(np.arange(n // 1000 + 1, dtype="<u4") * 86400, 1000)[:n],
        "id": np.tile(np.arange(1000, dtype="<u4"), n // 1000 + 1)[:n]}
bcolz.ctable(columns=list(cols.values()), names=list(cols), rootdir=f"{out}/bars", mode="w", expectedlen=n).flush()
bloscpack.pack_ndarray_to_file(np.concatenate([cols["open"], cols["volume"]]), f"{out}/prices.blp",
                               bloscpack_args=bloscpack.BloscpackArgs(checksum="adler32"))
PY
"$bin" mount "$work/src" "$mnt"
chunks=$(find "$mnt/bars" -path '*/c/*' -type f | wc -l)
bytes=$(du -sb --apparent-size "$work/src/bars" | cut -f1)
results=$work/results.md
measure() { # measure TITLE VIEW-COMMAND SOURCE-COMMAND
  hyperfine -N --style none --warmup 1 --runs "$runs" --export-json "$work/h.json" \
    -n source "$3" -n view "$2" >/dev/null 2>&1 ||
    hyperfine --style none --warmup 1 --runs "$runs" --export-json "$work/h.json" -n source "$3" -n view "$2" >/dev/null
  python3 - "$1" "$work/h.json" >>"$results" <<'PY'
import json, sys
title, data = sys.argv[1], json.load(open(sys.argv[2]))["results"]
med = {r["command"]: r["median"] for r in data}
print(f"| {title} | {med['source']*1000:.1f} ms | {med['view']*1000:.1f} ms | {med['view']/med['source']:.2f}x |")
PY
}
: >"$results"
measure "cat of every chunk of the ctable ($chunks chunk files)" \
  "bash -c 'find $mnt/bars -path \"*/c/*\" -type f -print0 | xargs -0 cat >/dev/null'" \
  "bash -c 'find $work/src/bars -name \"__*.blp\" -print0 | xargs -0 cat >/dev/null'"
measure "cat of every chunk of the Bloscpack file" \
  "bash -c 'cat $mnt/prices/c/* >/dev/null'" "cat $work/src/prices.blp"
"$bin" unmount "$mnt"
start=$(date +%s%N); "$bin" mount "$work/src" "$mnt"; end=$(date +%s%N)
mount_ms=$(((end - start) / 1000000))
{
  echo "BLZ profile: a ctable of $rows rows x 7 uint32 columns (bcolz-zipline, default chunklen; $bytes bytes in"
  echo "$chunks chunk files) and a Bloscpack file of $((2 * rows)) uint32 (1 MiB chunks, adler32); hyperfine medians of $runs warm runs."
  echo
  echo "Reproduce: \`scripts/bench.sh --profile blz --runs $runs\`"
  echo
  echo "| operation | cat of the source files | through the view | view / source |"
  echo "|---|---|---|---|"
  cat "$results"
  echo
  echo "- Mount time: $mount_ms ms."
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), Linux $(uname -r); $("$bin" --version)."
} >"$work/report.md"
cat "$work/report.md"
cp "$work/report.md" "$out"
