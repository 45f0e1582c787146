#!/usr/bin/env bash
# Builds the Debian package with cargo-deb: target/debian/shardfs_VERSION-1_ARCH.deb, holding
# /usr/bin/shardfs, the man pages and the bash, zsh and fish completions `shardfs generate` writes
# (into target/generated), and README.md; it depends on fuse3 (mount.fuse3, fusermount3). Beside it
# the Python wheel with maturin (pyproject.toml): target/wheels/shardfs-VERSION-py3-none-manylinux_*.whl,
# the binary (on the venv's PATH once installed) and the module in python/shardfs.
#     scripts/package.sh [--profile PROFILE]    (default release; the tests package the dev build,
#                                               which cargo-deb 3.8 takes with a warning)
# Prints the path of the wheel, then of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [ "${1:-}" = --profile ]; then profile=${2:?--profile needs a name}; fi
case $profile in dev) out=debug ;; *) out=$profile ;; esac

# cargo-deb, compiled once into ~/.cargo/bin (about 3 minutes on 2 cores) and reused after that.
cargo_deb_version=3.8.0
if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $cargo_deb_version" ]; then
  echo "package: installing cargo-deb $cargo_deb_version" >&2
  cargo install --locked --quiet cargo-deb --version "$cargo_deb_version"
fi

cargo build --locked --profile "$profile"
rm -rf target/generated
"target/$out/shardfs" generate target/generated
# Debian installs man pages compressed; -n keeps the archive the same from one build to the next.
gzip -9n target/generated/man/*.1
# maturin, in a venv of its own (about 10 s the first time).
maturin_version=1.16.0
if [ "$(target/venv-build/bin/maturin --version 2>/dev/null)" != "maturin $maturin_version" ]; then
  echo "package: installing maturin $maturin_version in target/venv-build" >&2
  python3 -m venv target/venv-build
  target/venv-build/bin/pip install -q --disable-pip-version-check "maturin==$maturin_version" >&2
fi
rm -rf target/wheels
# --strip, as for the .deb; maturin picks the oldest manylinux tag the binary's symbols allow.
target/venv-build/bin/maturin build --locked --strip --profile "$profile" --out target/wheels >&2
ls target/wheels/shardfs-*.whl
# --strip: the release profile keeps line tables (debug = 1) for profiling; users get none.
cargo deb --locked --no-build --strip --profile "$profile"
