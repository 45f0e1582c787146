#!/usr/bin/env bash
# Fuzzing with cargo-fuzz (libFuzzer): the metadata parser, the chunk-key decoder, the shard-index
# decoder, a whole-shard read through the view, and the BLZ parsers (Bloscpack header, metadata,
# offsets and chunk walk; bcolz metadata, chunk headers and blosc decoding), a zip file's end
# records, central directory and local headers, and kerchunk reference sets (JSON with templates
# and gen, .zmetadata, .zarray). Seeds come from the golden stores (one zipped by
# Python's zipfile, once stored and once deflated), tests/data/blz, and two reference sets written here.
#
#   scripts/fuzz.sh [--dev] [SECONDS-PER-TARGET] [TARGET...]     (default: 20 s, every target)
#
# --dev builds unoptimized (cargo fuzz's --dev): the build takes about half the time and each run
# does fewer executions, which suits the test command's short smoke run; runs by hand leave it out.
#
# The machine's toolchain is stable: RUSTC_BOOTSTRAP lets cargo-fuzz pass its flags, and
# `-s none` builds without a sanitizer. cargo-fuzz builds optimized by default, and then with
# debug assertions and overflow checks (its -O would turn them off): an arithmetic overflow on
# bad input is a crash here, as it is in the test build. A crash leaves its input under
# fuzz/artifacts/ and fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
if [ "${1:-}" = --dev ]; then profile=(--dev); shift; fi
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(metadata chunk_key shard_index shard_read blz_bloscpack blz_bcolz zip_directory kerchunk)
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
seed() { # seed TARGET FILES...: copies FILES into the target's corpus, named by content
  local dir=fuzz/corpus/$1; shift
  mkdir -p "$dir"
  for f in "$@"; do cp "$f" "$dir/seed-$(sha1sum "$f" | cut -c1-16)"; done
}
mapfile -t documents < <(find tests/data/golden tests/data/golden_draft -name zarr.json -o -name '*.array.json')
mapfile -t shards < <(find tests/data/golden/sharded -path '*/c/*' -type f -size -64k)
seed metadata "${documents[@]}"
seed shard_index "${shards[@]}"
seed shard_read "${shards[@]}"
mapfile -t blps < <(find tests/data/blz -name '*.blp' -size -64k)
seed blz_bloscpack "${blps[@]}"
seed blz_bcolz "${blps[@]}" tests/data/blz/store/prices/meta/*
mkdir -p fuzz/corpus/zip_directory
python3 - tests/data/golden/sharded/zp/raw_nocrc fuzz/corpus/zip_directory <<'PY'
import os, sys, zipfile
root, out = sys.argv[1:]
for name, method in (("seed-stored", zipfile.ZIP_STORED), ("seed-deflated", zipfile.ZIP_DEFLATED)):
    with zipfile.ZipFile(os.path.join(out, name), "w", method) as z:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                z.write(os.path.join(d, f), os.path.relpath(os.path.join(d, f), root))
PY
mkdir -p fuzz/corpus/kerchunk
cat >fuzz/corpus/kerchunk/seed-json <<'JSON'
{"version": 1, "templates": {"u": "data.h5"}, "gen": [{"key": "x/{{i}}.{{j}}", "url": "{{u}}",
 "offset": "{{(i * 3 + j) * 100 - 7 // 2 % 5}}", "length": 100, "dimensions": {"i": {"stop": 4},
 "j": [0, 1, 2]}}], "refs": {".zgroup": "{\"zarr_format\": 2}", "x/.zarray": {"shape": [4, 3],
 "chunks": [1, 1], "dimension_separator": "."}, "a": "base64:AAE=", "b": ["{{u}}", 0, 9], "c": ["s3://b/k"]}}
JSON
cat >fuzz/corpus/kerchunk/seed-zmetadata <<'JSON'
{"metadata": {".zgroup": {"zarr_format": 2}, "x/.zarray": {"shape": [10, 6], "chunks": [4, 4], "dimension_separator": "."}}, "record_size": 4}
JSON
# cargo fuzz has no --locked: a stale fuzz/Cargo.lock would build with whatever versions are newest.
if ! cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null 2>&1; then
  echo "fuzz: fuzz/Cargo.lock is stale; refresh it from the crate's: cp Cargo.lock fuzz/Cargo.lock && cargo metadata --manifest-path fuzz/Cargo.toml >/dev/null"
  exit 1
fi
build_log=$(mktemp)
if ! cargo fuzz build "${profile[@]}" -s none >"$build_log" 2>&1; then
  grep -m 20 -A 12 '^error' "$build_log" || tail -40 "$build_log"; echo "fuzz: the targets do not build"; exit 1
fi
tail -1 "$build_log"; rm -f "$build_log"
for target in "${targets[@]}"; do
  log=$(mktemp)
  if ! cargo fuzz run "${profile[@]}" -s none "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
    tail -30 "$log"; echo "fuzz: $target FAILED"; exit 1
  fi
  echo "fuzz: $target: $(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 | sed 's/Done //')s, no crash"
  rm -f "$log"
done
