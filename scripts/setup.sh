#!/usr/bin/env bash
# Installs what shardfs's tests need on a fresh Debian machine, and nothing when it is already
# there: fuse3 (fusermount3, as users have it) from apt, and the interop peers (zarr-python 3,
# tensorstore, numpy) in a Python venv under target/venv.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3 with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq fuse3 >/dev/null
fi

venv=target/venv
stamp="$venv/.installed-zarr3.1.6-ts0.1.86"
if [ ! -f "$stamp" ]; then
  echo "setup: creating $venv with zarr-python 3 and tensorstore"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'zarr==3.1.6' 'tensorstore==0.1.86' 'numpy>=2,<3'
  touch "$stamp"
fi
