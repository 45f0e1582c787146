"""Interop test of BLZ data: zarr-python 3 and tensorstore read Bloscpack files and bcolz
directories through shardfs's Zarr v3 view, and zarr-python 2.18 through its Zarr v2 view.

    target/venv/bin/python scripts/interop_blz.py [path/to/shardfs]

tests/data/generate_blz.py --all (run by target/venv-blz's Python: bloscpack 0.16.0 and
bcolz-zipline) writes every combination of codec (lz4, zstd, zlib, blosclz), shuffle (none,
byte, bit), checksum (none, adler32, sha256) and offsets (with, without) in 1-D and 2-D Bloscpack
files, with and without a short last chunk, carrays of every codec and shuffle, a zipline-like
ctable with attributes, and arrays the view must refuse (appended to without updating the
metadata, a structured dtype, chunks that do not hold whole rows, an object carray). shardfs mounts
the directory (no --read-only: BLZ mounts are read-only anyway); every array must read exactly
what the writer was given, with its shape, chunks, fill value and attributes; the refused ones
must be absent and named in the log; a write must fail with EROFS; a Bloscpack chunk whose sha256
does not match must fail to read (never a silent fill value) while its neighbours read.
"""

import errno
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorstore as ts
import zarr
from checks import Checks

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BLZ_PYTHON = os.path.join(ROOT, "target", "venv-blz", "bin", "python")
V2_PYTHON = os.path.join(ROOT, "target", "venv-v2", "bin", "python")

# Run by zarr-python 2.18: reads each array of the v2 view and compares it with its .npy.
V2_READER = r"""
import json, sys, numpy as np, zarr
mnt, expected = sys.argv[1], sys.argv[2]
result = {}
for path in json.load(open(expected + "/arrays.json")):
    want = np.load(f"{expected}/{path.replace('/', '__')}.npy")
    try:
        result[path] = bool(np.array_equal(zarr.open_array(f"{mnt}/{path}", mode="r")[...], want))
    except Exception as e:
        result[path] = repr(e)
print(json.dumps(result))
"""


def flip_chunk_byte(path, chunk):
    """Flips one byte inside chunk `chunk` of a Bloscpack file with offsets."""
    with open(path, "r+b") as f:
        header = f.read(32)
        assert header[5] & 1, "the file has offsets"
        meta = 0
        if header[5] & 2:
            meta_header = f.read(32)
            meta = 32 + int.from_bytes(meta_header[16:20], "little") + {0: 0, 1: 4, 6: 32}[meta_header[9]]
        f.seek(32 + meta + 8 * chunk)
        offset = int.from_bytes(f.read(8), "little")
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0xFF]))


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-interop-blz.") as work:
        subprocess.run([BLZ_PYTHON, os.path.join(ROOT, "tests", "data", "generate_blz.py"), work, "--all"], check=True)
        store, expected, mnt = (os.path.join(work, d) for d in ("store", "expected", "mnt"))
        arrays = json.load(open(os.path.join(expected, "arrays.json")))
        groups = json.load(open(os.path.join(expected, "groups.json")))
        refused = json.load(open(os.path.join(expected, "refused.json")))
        # A copy of a sha256 file with offsets, one byte of its chunk 2 flipped.
        damaged = "all/lz4_none_sha256_offsets"
        with open(os.path.join(store, damaged + ".blp"), "rb") as f:
            good = f.read()
        with open(os.path.join(store, "damaged.blp"), "wb") as f:
            f.write(good)
        flip_chunk_byte(os.path.join(store, "damaged.blp"), 2)
        os.mkdir(mnt)
        log = os.path.join(work, "shardfs.log")
        subprocess.run([binary, "mount", "--log-file", log, store, mnt], check=True)
        try:
            for path, meta in sorted(arrays.items()):
                want = np.load(os.path.join(expected, path.replace("/", "__") + ".npy"))
                try:
                    array = zarr.open_array(os.path.join(mnt, path), mode="r")
                    got = array[...]
                    same_meta = (
                        list(array.shape) == meta["shape"]
                        and list(array.chunks) == meta["chunks"]
                        and array.dtype == np.dtype(meta["dtype"])
                        and float(array.fill_value) == float(meta["fill_value"])
                        and dict(array.attrs) == meta["attributes"]
                    )
                    check(f"{path}: zarr-python 3 reads it exactly", np.array_equal(got, want) and same_meta)
                except Exception as e:  # noqa: BLE001 - reported as a failed check
                    check(f"{path}: zarr-python 3 reads it exactly", False, repr(e))
                spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}}
                try:
                    got = ts.open(spec, read=True).result().read().result()
                    check(f"{path}: tensorstore reads it exactly", np.array_equal(got, want))
                except Exception as e:  # noqa: BLE001
                    check(f"{path}: tensorstore reads it exactly", False, repr(e))
            for group, attributes in sorted(groups.items()):
                opened = zarr.open_group(os.path.join(mnt, group), mode="r")
                check(f"/{group}: a group with its attributes", dict(opened.attrs) == attributes)
            for path in refused:
                check(f"{path}: refused, not shown", not os.path.exists(os.path.join(mnt, path)))
            try:
                with open(os.path.join(mnt, "new"), "w") as f:
                    f.write("x")
                check("a write is refused with EROFS", False)
            except OSError as e:
                check("a write is refused with EROFS", e.errno == errno.EROFS, repr(e))
            bad = zarr.open_array(os.path.join(mnt, "damaged"), mode="r")
            want = np.load(os.path.join(expected, damaged.replace("/", "__") + ".npy"))
            rows = bad.chunks[0]
            try:
                bad[2 * rows : 3 * rows]
                check("damaged: a chunk failing its sha256 is an error, not fill value", False)
            except Exception as e:  # noqa: BLE001
                check("damaged: a chunk failing its sha256 is an error, not fill value", True, repr(e))
            check("damaged: its neighbours read", np.array_equal(bad[: 2 * rows], want[: 2 * rows])
                  and np.array_equal(bad[3 * rows :], want[3 * rows :]))
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        with open(log) as f:
            text = f.read()
        for path in refused:
            check(f"{path}: the log says why it is not shown", any(
                path.split("/")[-1] in line and "not shown" in line for line in text.splitlines()), text[-2000:])
        check("damaged: the log names the file and the checksum", "damaged.blp" in text and "sha256" in text)

        subprocess.run([binary, "mount", "--zarr-format", "2", "--log-file", log, store, mnt], check=True)
        try:
            run = subprocess.run([V2_PYTHON, "-c", V2_READER, mnt, expected], capture_output=True, text=True)
            result = json.loads(run.stdout) if run.returncode == 0 else {}
            check("zarr-python 2.18 runs over the v2 view", run.returncode == 0, run.stderr[-800:])
            for path in sorted(arrays):
                check(f"{path}: zarr-python 2.18 reads the v2 view exactly", result.get(path) is True, result.get(path))
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)

    sys.exit(check.summary("interop-blz"))


if __name__ == "__main__":
    main()
