#!/usr/bin/env bash
# Shell-level test: mount the golden sharded store with the shardfs binary and use the view with
# ls, find, stat, cat, md5sum, cp -r and tar, comparing each with the unsharded twin; and a
# directory of BLZ data (Bloscpack files, bcolz directories) with ls and cat.
#     scripts/shell-test.sh [path/to/shardfs]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/debug/shardfs}")
store=tests/data/golden/sharded
twin=tests/data/golden/unsharded

work=$(mktemp -d -t shardfs-shell.XXXXXX)
mnt=$work/mnt
mkdir "$mnt"
holder=
cleanup() {
  if [ -n "$holder" ]; then kill "$holder" 2>/dev/null; fi
  for m in "$mnt" "$work/full/mnt" "$work/blz"; do
    if mountpoint -q "$m"; then "$bin" unmount "$m" 2>/dev/null || umount -l "$m"; fi
  done
  if mountpoint -q "$work/full"; then umount -l "$work/full"; fi
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/checks.sh"
same() { diff <(eval "$1") <(eval "$2"); }
files() { (cd "$1" && find . -type f | sort); }
chunk_sums() { (cd "$1" && find . -type f ! -name zarr.json -print0 | sort -z | xargs -0 md5sum); }
sizes() { (cd "$1" && find . -type f ! -name zarr.json -print0 | sort -z | xargs -0 stat -c '%n %s'); }
json_equal() { python3 -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); sys.exit(a!=b)' "$1" "$2"; }

check "mount returns once the view is ready" "$bin" mount --read-only "$store" "$mnt" -o fsname=golden
check "ls of a chunk directory" same "ls $mnt/zp/gzip_crc_end/c/2" "ls $twin/zp/gzip_crc_end/c/2"
check "ls of a flat key encoding" same "ls $mnt/zp/keys/v2_dot" "ls $twin/zp/keys/v2_dot"
check "find lists exactly the twin's files" same "files $mnt" "files $twin"
check "stat sizes equal the twin's" same "sizes $mnt" "sizes $twin"
check "cat of one chunk" same "cat $mnt/zp/zstd_start/c/1/2/3 | md5sum" "cat $twin/zp/zstd_start/c/1/2/3 | md5sum"
check "md5sum of every chunk" same "chunk_sums $mnt" "chunk_sums $twin"
check "rewritten zarr.json equals the twin's" json_equal "$mnt/zp/nested/zarr.json" "$twin/zp/nested/zarr.json"
check "consolidated metadata rewritten" json_equal "$mnt/zarr.json" "$twin/zarr.json"
check "a chunk has its shard's mtime" same "stat -c %Y $mnt/ts/zstd_crc/c/2/1" "stat -c %Y $store/ts/zstd_crc/c/1/0"
check "cp -r copies an unsharded store" bash -c "cp -r $mnt/zp $work/copy && diff -r -x zarr.json $work/copy $twin/zp"
check "tar reads the whole view" same "tar -C $mnt -cf - . | tar -tf - | grep -v '/\$' | sort" "files $mnt"
check "a read-only mount refuses writes" bash -c "! touch $mnt/zp/new 2>/dev/null"
check "shardfs unmount" "$bin" unmount "$mnt"
check "nothing left mounted" bash -c "! mountpoint -q $mnt"

# Writes through a writable mount of a copy, checked after unmount on the sharded store itself.
copy=$work/store
cp -r "$store" "$copy"
check "writable mount" "$bin" mount "$copy" "$mnt"
check "cp over a chunk" cp "$twin/zp/gzip_crc_end/c/4/0" "$mnt/zp/gzip_crc_end/c/2/1"
check "read your write" cmp "$twin/zp/gzip_crc_end/c/4/0" "$mnt/zp/gzip_crc_end/c/2/1"
check "rm a chunk" rm "$mnt/zp/raw_nocrc/c/7"
check "mkdir -p and write a new chunk" bash -c "mkdir -p $mnt/zp/big_endian_index/c/0 && printf new > $mnt/zp/big_endian_index/c/0/1"
check "mv a temporary file onto a chunk key" bash -c "printf moved > $mnt/zp/raw_nocrc/c/.tmp && mv $mnt/zp/raw_nocrc/c/.tmp $mnt/zp/raw_nocrc/c/2"
check "shardfs unmount commits everything" "$bin" unmount "$mnt"
check "shardfs check passes after the writes" "$bin" check "$copy"
check "remount read-only" "$bin" mount --read-only "$copy" "$mnt"
check "overwritten chunk is durable" cmp "$twin/zp/gzip_crc_end/c/4/0" "$mnt/zp/gzip_crc_end/c/2/1"
check "removed chunk stays removed" bash -c "! test -e $mnt/zp/raw_nocrc/c/7"
check "new chunk is durable" bash -c "test \"\$(cat $mnt/zp/big_endian_index/c/0/1)\" = new"
check "renamed chunk is durable" bash -c "test \"\$(cat $mnt/zp/raw_nocrc/c/2)\" = moved"
check "untouched chunks unchanged" cmp "$twin/zp/zstd_start/c/1/2/3" "$mnt/zp/zstd_start/c/1/2/3"
check "final unmount" "$bin" unmount "$mnt"

# A full disk: the commit fails with ENOSPC at fsync, the shard keeps its last good state, the
# daemon keeps serving, unmount refuses to drop the pending write, and once space is freed the
# write is committed after all. Needs root for a small tmpfs.
full=$work/full
mkdir "$full"
if mount -t tmpfs -o size=1m tmpfs "$full" 2>/dev/null; then
  cp -r "$store" "$full/store" && mkdir "$full/mnt"
  check "writable mount on a small tmpfs" "$bin" mount "$full/store" "$full/mnt"
  head -c 2000000 /dev/zero > "$full/filler" 2>/dev/null
  check "fsync of a chunk on a full disk fails with ENOSPC" bash -c \
    "! dd if=/dev/urandom of=$full/mnt/zp/gzip_crc_end/c/2/1 bs=64k count=4 conv=fsync 2>$work/dd.err && grep -q 'No space left' $work/dd.err"
  check "the daemon keeps serving" cmp "$twin/zp/zstd_start/c/1/2/3" "$full/mnt/zp/zstd_start/c/1/2/3"
  check "the shard kept its last good state" "$bin" check "$full/store"
  check "unmount refuses to drop the pending write" bash -c "! $bin unmount $full/mnt 2>/dev/null && mountpoint -q $full/mnt"
  rm -f "$full/filler"
  check "unmount commits once space is free" "$bin" unmount "$full/mnt"
  check "the write survived the full disk" bash -c "test \$(stat -c %s $full/store/zp/gzip_crc_end/c/1/0) -gt 262144"
  check "shardfs check passes after it" "$bin" check "$full/store"
else
  echo "skip full-disk checks: cannot mount a tmpfs (not root?)"
fi

# A mount namespace made after the mount (unshare -m, a container) holds a copy of it: unmount
# here succeeds and says so, and the daemon serves the copy until that namespace lets it go.
check "mount, then a namespace that copies it" "$bin" mount --read-only "$store" "$mnt"
daemon=$(pgrep -f "shardfs mount .* $mnt\$" | head -1)
unshare -m --propagation private sleep 60 &
holder=$!
for _ in $(seq 100); do grep -q " $mnt " "/proc/$holder/mountinfo" 2>/dev/null && break; sleep 0.05; done
check "unmount with a copy elsewhere succeeds and says so" bash -c \
  "$bin unmount $mnt 2>$work/unmount.err && grep -q 'unmounted here' $work/unmount.err"
check "nothing left mounted here" bash -c "! mountpoint -q $mnt"
check "the daemon serves the copy" kill -0 "$daemon"
kill "$holder"; wait "$holder" 2>/dev/null
check "the daemon ends once the copy is gone" bash -c \
  "for _ in \$(seq 200); do kill -0 $daemon 2>/dev/null || exit 0; sleep 0.05; done; exit 1"

# BLZ data (tests/data/blz): Bloscpack files and bcolz directories with no zarr.json, mounted
# read-only whatever is asked; chunk files are the stored blosc buffers.
blz=tests/data/blz/store
mkdir -p "$work/blz"
check "BLZ: mount a directory of Bloscpack files and bcolz directories" "$bin" mount "$blz" "$work/blz"
check "BLZ: ls shows arrays, groups and zarr.json, no .blp or bcolz internals" same \
  "ls $work/blz; ls $work/blz/prices; ls $work/blz/bars" \
  "printf '%s\n' bars bytes16 grid ints ints_short nested prices zarr.json c zarr.json close day high id low open volume zarr.json"
check "BLZ: ls of a chunk directory" same "ls $work/blz/prices/c | sort -n | tr '\n' ' '" "seq 0 10 | tr '\n' ' '"
check "BLZ: cat of a carray chunk is data/__i.blp after its header" same \
  "cat $work/blz/prices/c/3/0 | md5sum" "tail -c +17 $blz/prices/data/__3.blp | md5sum"
check "BLZ: cat of a Bloscpack chunk is found in the file" python3 -c \
  "import sys; c=open(sys.argv[1],'rb').read(); sys.exit(c not in open(sys.argv[2],'rb').read())" \
  "$work/blz/ints/c/4" "$blz/ints.blp"
check "BLZ: the short last chunk is a memcpyed blosc buffer of a full chunk" same \
  "head -c 16 $work/blz/prices/c/10/0 | od -An -tx1 | tr -s ' '; stat -c %s $work/blz/prices/c/10/0" \
  "printf ' 02 01 02 08 40 06 00 00 40 06 00 00 50 06 00 00\n1616\n'"
check "BLZ: a ctable's attributes in its zarr.json" grep -q calendar_offset "$work/blz/bars/zarr.json"
check "BLZ: writes are refused (EROFS)" bash -c "! touch $work/blz/new 2>$work/touch.err && grep -q 'Read-only' $work/touch.err"
check "BLZ: unmount" "$bin" unmount "$work/blz"

summary shell
