#!/usr/bin/env bash
# Installs what shardfs's tests need on a fresh Debian machine, and nothing when it is already
# there: fuse3 (fusermount3, as users have it) from apt, the interop peers (zarr-python 3,
# tensorstore, numpy; moto, a local S3 server, and obstore, zarr-python's S3 client) in a Python
# venv under target/venv, and zarr-python 2.16.1 (the draft
# sharding storage transformer) in target/venv2.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3 with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq fuse3 >/dev/null
fi
# GDAL from Debian (3.6: Zarr v2 only), a reader of the Zarr v2 view.
if ! command -v gdal_translate >/dev/null 2>&1; then
  echo "setup: installing gdal-bin with apt-get"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gdal-bin >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gdal-bin >/dev/null; }
fi

venv=target/venv
stamp="$venv/.installed-zarr3.1.6-ts0.1.86-moto5.2.5"
if [ ! -f "$stamp" ]; then
  echo "setup: creating $venv with zarr-python 3, tensorstore, and moto (a local S3 server) with obstore"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'zarr==3.1.6' 'tensorstore==0.1.86' 'numpy>=2,<3' \
    'moto[server]==5.2.5' 'obstore==0.12.1'
  touch "$stamp"
fi

venv2=target/venv2
stamp2="$venv2/.installed-zarr2.16.1"
if [ ! -f "$stamp2" ]; then
  echo "setup: creating $venv2 with zarr-python 2.16.1"
  python3 -m venv "$venv2"
  # pytest: zarr 2.16.1 imports one of its test modules when reading v3 metadata.
  "$venv2/bin/pip" install -q --disable-pip-version-check 'zarr==2.16.1' 'numcodecs<0.13' 'numpy<2' pytest
  touch "$stamp2"
fi

venv_v2=target/venv-v2
stamp_v2="$venv_v2/.installed-zarr2.18.7-xarray2025.1.2"
if [ ! -f "$stamp_v2" ]; then
  echo "setup: creating $venv_v2 with zarr-python 2.18.7 and xarray (the Zarr v2 view's readers)"
  python3 -m venv "$venv_v2"
  "$venv_v2/bin/pip" install -q --disable-pip-version-check 'zarr==2.18.7' 'numcodecs==0.15.2' \
    'xarray==2025.1.2' 'pandas==2.2.3'
  touch "$stamp_v2"
fi
