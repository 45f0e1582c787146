#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs every test: unit and
# integration tests (cargo test, real mounts included), the shell-level test, and the interop
# tests against zarr-python 3 and tensorstore (arrays changing while mounted too), against
# zarr-python 2.16.1 (draft layout), of object stores against a local S3 server (moto, also behind
# a fault-injecting proxy), Azurite (Azure Blob Storage) and fake-gcs-server (GCS, read-only), of the
# Zarr v2 view against zarr-python 2.18, of OME-Zarr 0.5 shown as 0.4 (ngff-zarr, ome-zarr-models,
# ome-zarr 0.9 on zarr-python 2.18), of reference files (`shardfs refs`, no FUSE needed), of
# the newest releases of zarr-python and tensorstore (tests/interop/test_peers.py again, in
# target/venv-newest), of GDAL 3.12 (rasterio's wheels), of BLZ data (Bloscpack, bcolz)
# against zarr-python 3 and 2.18 and tensorstore, and of kerchunk references (kerchunk, h5py,
# fsspec) and of Icechunk repositories (icechunk 2.3; both in tests/interop, pytest). With
# SHARDFS_REQUIRE_FUSE=1 a machine without usable FUSE fails the run instead of skipping the mount
# tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time goes to stderr, so that a run's cost is read off its log (CI's budget is 40 min).
timed() {
  local start=$SECONDS
  "$@"
  echo "test.sh: $((SECONDS - start)) s: $*" >&2
}
timed scripts/setup.sh
# The crate as the Rust package registry would take it (packaged and built, not uploaded).
timed cargo publish --dry-run --locked --allow-dirty
# The checks with the newest peers need Python 3.12 or newer (setup.sh makes target/venv-newest
# only then); without it they are skipped, loudly, unless SHARDFS_REQUIRE_NEWEST=1 (.ci/run).
newest() {
  if [ -x target/venv-newest/bin/python ]; then
    target/venv-newest/bin/python "$@"
  else
    echo "*** SKIPPED (no Python 3.12 or newer for target/venv-newest): $1 ***" >&2
  fi
}
cargo build --locked
# A local S3 server (moto) for the object-store conformance checks, stopped however the run ends.
s3_port=$(target/venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
target/venv/bin/moto_server -H 127.0.0.1 -p "$s3_port" >target/moto.log 2>&1 &
s3_pid=$!
trap 'kill $s3_pid 2>/dev/null || true' EXIT
target/venv/bin/python -c '
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
' "$s3_port"
# Azurite, for the same checks through az:// (tests/cloud.rs), with a container made for them.
az_port=$(target/venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
az_data=$(mktemp -d)
target/azurite/node_modules/.bin/azurite-blob --blobHost 127.0.0.1 --blobPort "$az_port" --location "$az_data" \
  --skipApiVersionCheck --disableTelemetry --silent >target/azurite.log 2>&1 &
az_pid=$!
trap 'kill $s3_pid $az_pid 2>/dev/null || true; wait $az_pid 2>/dev/null || true; rm -rf "$az_data"' EXIT
az_endpoint="http://127.0.0.1:$az_port/devstoreaccount1"
target/venv-cloud/bin/python -c '
import sys, time
from azure.storage.blob import BlobServiceClient
key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
client = BlobServiceClient(sys.argv[1], credential={"account_name": "devstoreaccount1", "account_key": key})
for attempt in range(100):
    try:
        client.create_container("shardfs-test")
        break
    except Exception:
        if attempt == 99:
            raise
        time.sleep(0.1)
' "$az_endpoint"
SHARDFS_TEST_S3_ENDPOINT="http://127.0.0.1:$s3_port" SHARDFS_REQUIRE_S3=1 \
  SHARDFS_TEST_AZURE_ENDPOINT="$az_endpoint" SHARDFS_TEST_AZURE_CONTAINER=shardfs-test SHARDFS_REQUIRE_AZURE=1 \
  timed cargo test --locked
kill $s3_pid $az_pid
# A bounded fuzz run of every target, 10 s each (its build is most of its 10 minutes; longer runs
# by hand: scripts/fuzz.sh 3600).
timed scripts/fuzz.sh 10
# Reference files are for machines without FUSE: their interop test needs none.
timed target/venv/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_refs.py
# The wan benchmark's latency proxy: the round trip it adds and the bytes it carries (a few s).
timed python3 scripts/latency_proxy.py --self-check

if ! (exec 3<>/dev/fuse) 2>/dev/null; then
  if [ "${SHARDFS_REQUIRE_FUSE:-}" = 1 ]; then
    echo "FAIL: SHARDFS_REQUIRE_FUSE=1 but /dev/fuse cannot be opened" >&2
    exit 1
  fi
  echo "*** SKIPPING the shell and interop tests: /dev/fuse cannot be opened on this machine ***" >&2
  exit 0
fi
timed scripts/shell-test.sh target/debug/shardfs
timed scripts/mount-helper-test.sh target/debug/shardfs
timed scripts/package-test.sh
timed target/venv/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_peers.py
# The same with the newest releases (pinned in setup.sh), so that a release that breaks the view
# is caught: about 10 s.
timed newest -m pytest -q -p no:cacheprovider tests/interop/test_peers.py
# zarr-python's own store conformance suite in a writable mount, against a plain directory.
timed newest -m pytest -q -p no:cacheprovider tests/interop/test_store_suite.py
# Shards rewritten underneath mounts while they are read: 100,000 reads, none a mix of versions.
timed target/venv/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_changes.py \
  tests/interop/test_overwrite.py
timed target/venv/bin/python scripts/interop_s3.py target/debug/shardfs
# Web servers: nginx with WebDAV listings and without (about 20 s).
timed target/venv/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_http.py
# The same on Azure Blob Storage (Azurite) and, read-only, on GCS (fake-gcs-server takes no XML
# PUT): the script starts and stops each server itself. About 50 s and 15 s.
timed target/venv-cloud/bin/python scripts/interop_s3.py --service azure target/debug/shardfs
timed target/venv-cloud/bin/python scripts/interop_s3.py --service gcs target/debug/shardfs
# The same kind of server behind a fault-injecting proxy of our own (scripts/fault_proxy.py).
timed target/venv/bin/python scripts/interop_faults.py target/debug/shardfs
# The interop tests as pytest (tests/interop), each file in its peers' venv.
timed target/venv/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_v2.py tests/interop/test_blz.py \
  tests/interop/test_zip.py
timed target/venv2/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_draft.py
timed target/venv-ome/bin/python -m pytest -q -p no:cacheprovider tests/interop/test_ome.py
timed target/venv-kerchunk/bin/python -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  tests/interop/test_kerchunk.py
timed newest -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning tests/interop/test_icechunk.py \
  tests/interop/test_gdal.py
# The benchmark on its smallest profile, so that it keeps working (its figures are not checked).
timed scripts/bench.sh --profile tiny --runs 2 --out target/bench-tiny.md
# The huge profile's small version (98,304 and 131,072 chunk files): every count and read checked.
timed scripts/bench.sh --profile huge --quick --out target/bench-huge-small.md
