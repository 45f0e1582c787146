#!/usr/bin/env bash
# The test command (README): installs what the tests need (scripts/setup.sh), then runs every test:
# unit and integration tests (cargo test, real mounts included), fuzzing, the shell-level tests,
# the package, the interop suite against real peers and servers (tests/interop, pytest), and the
# benchmark's smallest profiles. docs/testing.md says what each part covers and how to run one.
# With SHARDFS_REQUIRE_FUSE=1 a machine without usable FUSE fails the run instead of skipping the
# mount tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time goes to stderr, so that a run's cost is read off its log (CI's budget is 40 min).
timed() {
  local start=$SECONDS
  "$@"
  echo "test.sh: $((SECONDS - start)) s: $*" >&2
}
# A run takes about 9 GB of disk in the clone (builds 5 GB, venvs and servers 4 GB) and 1 GB of
# Cargo's registry; a full disk fails a build far from its cause, so the log starts with what is free.
echo "test.sh: $(df -h --output=avail . | tail -1 | tr -d ' ') free on $(df --output=target . | tail -1)" >&2
timed scripts/setup.sh
# The crate as the Rust package registry would take it (packaged and built, not uploaded), with
# our fork of fuser (vendor/fuser) packaged first, as a publish would upload it first: the crate's
# build is verified against the fork as packaged.
scripts/check_fork_version.sh
timed cargo publish --dry-run --locked --allow-dirty --workspace
# The fork's own tests (upstream's and ours, vendor/fuser/CHANGES.md; about 20 s).
timed cargo test --locked -p shardfs-fuser
# The checks with the newest peers need Python 3.12 or newer (setup.sh makes target/venv-newest
# only then); without it they are skipped, loudly, unless SHARDFS_REQUIRE_NEWEST=1 (.ci/run).
newest() {
  if [ -x target/venv-newest/bin/python ]; then
    target/venv-newest/bin/python "$@"
  else
    echo "*** SKIPPED (no Python 3.12 or newer for target/venv-newest): $* ***" >&2
  fi
}
# Runs interop test files (tests/interop, pytest) with the Python of a venv (scripts/setup.sh):
# interop PYTHON FILE...
interop() { timed "$1" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning "${@:2}"; }
# The unit and integration tests, with a local S3 server (moto) and Azure one (Azurite) up for
# tests/bucket.rs and tests/cloud.rs, stopped however the run ends (tests/interop/object_stores.py).
SHARDFS_REQUIRE_S3=1 SHARDFS_REQUIRE_AZURE=1 timed target/venv/bin/python tests/interop/object_stores.py \
  cargo test --locked
# A bounded fuzz run of every target, 10 s each, unoptimized (the optimized build took 8.5 of the
# step's 10 minutes; longer runs by hand, optimized: scripts/fuzz.sh 3600).
timed scripts/fuzz.sh --dev 10
# Reference files are for machines without FUSE: their interop test needs none, nor does the check
# of the Kubernetes deployment files (deploy/: the manifests and the Helm chart's templates).
interop target/venv/bin/python tests/interop/test_refs.py tests/interop/test_deploy.py
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
# The interop suite (tests/interop, pytest; docs/testing.md says what each file covers), each file
# run in the venv of its peers (scripts/setup.sh). In target/venv: zarr-python 3 and tensorstore
# through the view, arrays changing underneath, nginx, object stores (moto, Azurite,
# fake-gcs-server; S3 behind a fault-injecting proxy), the Zarr v2 view, BLZ and zip, many daemons
# writing one dataset (s3s-fs, built by scripts/s3s_fs.sh, and Azurite) and a Dask cluster writing
# through the plugin, the Kubernetes CSI driver driven over its socket as kubelet drives it, the
# metrics endpoint scraped while a mount reads and writes, and a web identity token exchanged at an
# STS of the test's: about 10 min.
interop target/venv/bin/python tests/interop/test_peers.py tests/interop/test_changes.py \
  tests/interop/test_overwrite.py tests/interop/test_http.py tests/interop/test_object_stores.py \
  tests/interop/test_faults.py tests/interop/test_v2.py tests/interop/test_blz.py tests/interop/test_zip.py \
  tests/interop/test_many_writers.py tests/interop/test_extend.py tests/interop/test_torture.py \
  tests/interop/test_killed_daemon.py tests/interop/test_dask.py \
  tests/interop/test_databases.py tests/interop/test_csi.py tests/interop/test_metrics.py \
  tests/interop/test_credentials.py
# The newest releases (pinned in setup.sh), so that a release that breaks the view is caught: the
# peers again, zarr-python's own store suite in a writable mount, Icechunk (read, and written
# through branch mounts) and GDAL 3.12.
interop newest tests/interop/test_peers.py tests/interop/test_store_suite.py tests/interop/test_icechunk.py \
  tests/interop/test_icechunk_writes.py \
  tests/interop/test_gdal.py
interop target/venv2/bin/python tests/interop/test_draft.py
interop target/venv-ome/bin/python tests/interop/test_ome.py
interop target/venv-kerchunk/bin/python tests/interop/test_kerchunk.py
# The benchmark on its smallest profile, so that it keeps working (its figures are not checked).
timed scripts/bench.sh --profile tiny --runs 2 --out target/bench-tiny.md
# The huge profile's small version (98,304 and 131,072 chunk files): every count and read checked.
timed scripts/bench.sh --profile huge --quick --out target/bench-huge-small.md
