#!/usr/bin/env bash
# The Debian package, built and installed for real: scripts/package.sh (of the dev build the test
# command has already made: a release build would cost a fresh machine minutes of its CI budget,
# and what is checked here, the package's contents and install, is the same for both), its
# contents (dpkg-deb -c) and dependencies (dpkg-deb -f), then dpkg -i, and as a user meets it:
# `shardfs --version` from /usr/bin, `man shardfs-mount`, completions that bash-completion, zsh and
# fish find where they look, `mount -t fuse.shardfs` through the installed binary; then dpkg -r,
# so that the next run starts clean. Needs root (dpkg); runs of it on one machine take turns.
#     scripts/package-test.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "*** SKIPPING the package test: dpkg -i needs root ***" >&2
  exit 0
fi
exec 9>/tmp/shardfs-package-test.lock
flock 9

built=$(scripts/package.sh --profile dev) || { echo "FAIL scripts/package.sh --profile dev"; exit 1; }
deb=$(tail -n 1 <<<"$built")
wheel=$(head -n 1 <<<"$built")
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
work=$(mktemp -d -t shardfs-package.XXXXXX)
mnt=$work/mnt
mkdir "$mnt"
installed=0
cleanup() {
  if mountpoint -q "$mnt"; then umount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
  if [ "$installed" = 1 ]; then dpkg -r shardfs >/dev/null 2>&1; fi
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/checks.sh"
same() { diff <(eval "$1") <(eval "$2"); }

dpkg-deb -c "$deb" | awk '{print $NF}' | grep -v '/$' | sort >"$work/contents"
cat >"$work/expected" <<EOF
./usr/bin/shardfs
./usr/share/bash-completion/completions/shardfs
./usr/share/doc/shardfs/README.md
./usr/share/doc/shardfs/copyright
$(for doc in docs/*.md; do echo "./usr/share/doc/shardfs/$doc"; done)
./usr/share/fish/vendor_completions.d/shardfs.fish
./usr/share/man/man1/shardfs-check.1.gz
./usr/share/man/man1/shardfs-compact.1.gz
./usr/share/man/man1/shardfs-csi.1.gz
./usr/share/man/man1/shardfs-demo.1.gz
./usr/share/man/man1/shardfs-generate.1.gz
./usr/share/man/man1/shardfs-info.1.gz
./usr/share/man/man1/shardfs-mount.1.gz
./usr/share/man/man1/shardfs-refs.1.gz
./usr/share/man/man1/shardfs-status.1.gz
./usr/share/man/man1/shardfs-unmount.1.gz
./usr/share/man/man1/shardfs.1.gz
./usr/share/zsh/vendor-completions/_shardfs
EOF
check "the .deb holds the binary, 11 man pages, 3 completions and the docs" diff <(sort "$work/expected") "$work/contents"
check "it depends on fuse3" bash -c "dpkg-deb -f $deb Depends | tr ',' '\n' | grep -qx ' *fuse3'"
check "its version is the crate's" same "dpkg-deb -f $deb Version" "echo $version-1"
check "the binary in it is stripped" bash -c "dpkg-deb --fsys-tarfile $deb | tar -xOf - ./usr/bin/shardfs >$work/bin && file $work/bin | grep -q ', stripped'"

if dpkg -s shardfs >/dev/null 2>&1; then echo "note: a shardfs package was installed already; it is replaced and removed"; fi
installed=1
check "dpkg -i" dpkg -i "$deb"
check "shardfs --version from /usr/bin" same "/usr/bin/shardfs --version" "echo shardfs $version"
check "man finds shardfs(1)" same "man -w shardfs" "echo /usr/share/man/man1/shardfs.1.gz"
check "man shardfs-mount documents its flags" bash -c "MANWIDTH=200 man shardfs-mount 2>&1 | grep -q -- '--memory-limit <BYTES> \[default: 1G\]'"
check "bash-completion loads the completion" bash -c "source /usr/share/bash-completion/bash_completion && __load_completion shardfs && complete -p shardfs | grep -q _shardfs"
check "fish finds the completion" same "fish -c \"complete -C 'shardfs mount --max-c'\" | cut -f1" "echo --max-cache-size"
check "zsh finds the completion on its fpath" \
  zsh -fc 'for d in $fpath; do [[ -f $d/_shardfs ]] && exit 0; done; exit 1'
# mount(8) runs helpers with /bin/sh's default PATH, where /usr/bin/shardfs now is.
check "mount(8) finds the installed binary" same "env -u PATH /bin/sh -c 'command -v shardfs'" "echo /usr/bin/shardfs"
check "mount -t fuse.shardfs through the installed binary" \
  mount -t fuse.shardfs "$PWD/tests/data/golden/sharded" "$mnt" -o ro,noauto
check "a chunk read through it equals the twin's" cmp "$mnt/zp/zstd_start/c/1/2/3" tests/data/golden/unsharded/zp/zstd_start/c/1/2/3
check "umount" umount "$mnt"
check "dpkg -r" dpkg -r shardfs && installed=0
check "nothing left in /usr/bin" bash -c "! test -e /usr/bin/shardfs && ! test -e /usr/share/man/man1/shardfs.1.gz"

# The wheel, as a Python user meets it: pip install into a fresh venv puts shardfs on its PATH, and
# the module's tests (tests/python: shardfs.mount, its errors, the pytest fixture) pass there.
check "the wheel is manylinux-tagged" bash -c "[[ $wheel == *-py3-none-manylinux_*_x86_64.whl ]]"
python3 -m venv "$work/venv"
check "pip install of the wheel into a fresh venv" \
  "$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel" 'pytest==9.2.0'
check "shardfs on the venv's PATH" same "PATH=$work/venv/bin:/usr/bin:/bin shardfs --version" "echo shardfs $version"
check "the Python module and its pytest fixture" "$work/venv/bin/python" -m pytest -q -p no:cacheprovider tests/python

summary package
