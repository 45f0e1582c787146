"""Writes BLZ-family data (Bloscpack files, bcolz carrays and ctables) with the real writers.

    target/venv-blz/bin/python tests/data/generate_blz.py OUT_DIR [--all]

Needs bloscpack 0.16.0 and bcolz-zipline (wheels for Python 3.11 only), which scripts/setup.sh
installs in target/venv-blz. OUT_DIR/store is the directory to mount; OUT_DIR/expected holds, per
array (its path in the view, '/' replaced by '__'), NAME.npy with the values the view must show and
a line in arrays.json: {path: {"dtype", "shape", "chunks", "fill_value", "attributes"}}.

Without --all: the small set committed under tests/data/blz (1-D and 2-D; lz4, zstd, zlib,
blosclz; shuffle, bitshuffle, none; checksums none, adler32, sha256; with and without offsets;
with and without a short last chunk; no metadata; a carray and a ctable with attributes; a nested
directory). With --all, every combination of codec, shuffle and checksum, and larger arrays.
"""

import collections
import collections.abc
import itertools
import json
import os
import shutil
import sys

# bloscpack 0.16.0 predates Python 3.10, which moved MutableMapping to collections.abc.
collections.MutableMapping = collections.abc.MutableMapping

import bcolz  # noqa: E402
import blosc  # noqa: E402
import bloscpack  # noqa: E402
import bloscpack.append  # noqa: E402
import numpy as np  # noqa: E402

SHUFFLES = {"none": blosc.NOSHUFFLE, "shuffle": blosc.SHUFFLE, "bitshuffle": blosc.BITSHUFFLE}


def values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1000, size=shape).astype(dtype)


class Writer:
    def __init__(self, out):
        self.store = os.path.join(out, "store")
        self.expected = os.path.join(out, "expected")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(self.store)
        os.makedirs(self.expected)
        self.arrays = {}

    def expect(self, path, data, chunk_rows, fill_value=0, attributes=None):
        np.save(os.path.join(self.expected, path.replace("/", "__") + ".npy"), data)
        self.arrays[path] = {
            "dtype": data.dtype.str,
            "shape": list(data.shape),
            "chunks": [chunk_rows] + list(data.shape[1:]),
            "fill_value": fill_value,
            "attributes": attributes or {},
        }

    def blp(self, path, data, rows, cname="lz4", shuffle="shuffle", checksum="adler32", offsets=True):
        """A Bloscpack file at PATH.blp holding `data` in chunks of `rows` rows."""
        target = os.path.join(self.store, path + ".blp")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        row_bytes = data.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
        bloscpack.pack_ndarray_to_file(
            data,
            target,
            chunk_size=rows * row_bytes,
            blosc_args=bloscpack.BloscArgs(typesize=data.itemsize, clevel=5, shuffle=SHUFFLES[shuffle], cname=cname),
            bloscpack_args=bloscpack.BloscpackArgs(offsets=offsets, checksum=checksum),
        )
        self.expect(path, data, rows)

    def raw_blp(self, path, payload, chunk_size, cname="blosclz"):
        """A Bloscpack file of plain bytes, without metadata: a 1-D uint8 array in the view."""
        target = os.path.join(self.store, path + ".blp")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        bloscpack.pack_bytes_to_file(
            payload,
            target,
            chunk_size=chunk_size,
            blosc_args=bloscpack.BloscArgs(typesize=1, clevel=5, shuffle=blosc.NOSHUFFLE, cname=cname),
            bloscpack_args=bloscpack.BloscpackArgs(offsets=True, checksum="None"),
        )
        self.expect(path, np.frombuffer(payload, dtype=np.uint8), chunk_size)

    def carray(self, path, data, chunklen, cname="lz4", shuffle="shuffle", clevel=5, dflt=0, attrs=None):
        target = os.path.join(self.store, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        cparams = bcolz.cparams(clevel=clevel, shuffle=SHUFFLES[shuffle], cname=cname)
        array = bcolz.carray(data, rootdir=target, mode="w", chunklen=chunklen, cparams=cparams, dflt=dflt)
        for key, value in (attrs or {}).items():
            array.attrs[key] = value
        array.flush()
        self.expect(path, data, chunklen, dflt, attrs)

    def ctable(self, path, columns, chunklen, attrs=None, cname="lz4"):
        target = os.path.join(self.store, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        names = list(columns)
        cparams = bcolz.cparams(clevel=5, shuffle=blosc.SHUFFLE, cname=cname)
        table = bcolz.ctable(
            columns=[columns[n] for n in names], names=names, rootdir=target, mode="w", chunklen=chunklen, cparams=cparams
        )
        for key, value in (attrs or {}).items():
            table.attrs[key] = value
        table.flush()
        for name in names:
            self.expect(f"{path}/{name}", columns[name], chunklen)
        return attrs or {}

    def finish(self, groups):
        with open(os.path.join(self.expected, "arrays.json"), "w") as f:
            json.dump(self.arrays, f, indent=1, sort_keys=True)
        with open(os.path.join(self.expected, "groups.json"), "w") as f:
            json.dump(groups, f, indent=1, sort_keys=True)


def small(w):
    groups = {"": {}, "nested": {}, "nested/deeper": {}}
    # Bloscpack files: 1-D and 2-D, each codec, shuffle and checksum at least once.
    w.blp("ints", values(1000, "<i4", 1), 100, "lz4", "shuffle", "adler32", True)  # whole chunks
    w.blp("ints_short", values(1037, "<i4", 2), 100, "zstd", "bitshuffle", "sha256", False)  # short last
    w.blp("grid", values((53, 3), "<f8", 3), 10, "zlib", "none", "None", True)
    w.blp("bytes16", values(700, "<u2", 4), 128, "blosclz", "shuffle", "adler32", False)
    w.blp("nested/deeper/small", values(5, "<i8", 5), 4, "lz4", "none", "sha256", True)
    w.raw_blp("nested/raw", bytes(range(256)) * 9 + b"tail", 500)
    # bcolz: a 2-D carray with attributes and a short last chunk; a zipline-like ctable.
    w.carray("prices", values((1050, 2), "<f8", 6), 100, "lz4", "shuffle", 5, -1.5, {"unit": "USD", "n": 3})
    w.carray("nested/counts", values(317, "<u4", 7), 100, "zstd", "bitshuffle", 3, 7)
    n = 777
    bars = {
        "open": values(n, "<u4", 10),
        "high": values(n, "<u4", 11),
        "low": values(n, "<u4", 12),
        "close": values(n, "<u4", 13),
        "volume": values(n, "<u4", 14),
        "day": np.arange(n, dtype="<u4") * 86400,
        "id": np.repeat(np.arange(7, dtype="<u4"), 111),
    }
    groups["bars"] = w.ctable("bars", bars, 64, {"first_row": {"1": 0}, "last_row": {"1": 776}, "calendar_offset": {"1": 0}})
    return groups


def everything(w):
    groups = small(w)
    data_1d = values(20_011, "<i4", 20)
    data_2d = values((2_003, 5), "<f4", 21)
    for i, (cname, shuffle, checksum, offsets) in enumerate(
        itertools.product(["lz4", "zstd", "zlib", "blosclz"], SHUFFLES, ["None", "adler32", "sha256"], [True, False])
    ):
        name = f"all/{cname}_{shuffle}_{checksum}_{'offsets' if offsets else 'walk'}"
        if i % 2:
            w.blp(name, data_2d, 64, cname, shuffle, checksum, offsets)
        else:
            w.blp(name, data_1d, 1_000 if i % 4 else 1_024, cname, shuffle, checksum, offsets)
    for cname, shuffle in itertools.product(["lz4", "zstd", "zlib", "blosclz"], SHUFFLES):
        w.carray(f"carrays/{cname}_{shuffle}", values(10_000, "<i8", 22), 1_000 if cname == "lz4" else 999, cname, shuffle)
    w.carray("carrays/floats2d", values((3_001, 4), "<f8", 23), 256, dflt=-1.5)
    groups["carrays"] = {}
    groups["all"] = {}
    refused(w)
    return groups


def refused(w):
    """Arrays the view must leave out (listed in expected/refused.json, by view path)."""
    root = os.path.join(w.store, "refused")
    os.makedirs(root)
    # Appended to without updating the numpy metadata: the header and the shape disagree.
    data = values(1_000, "<i4", 30)
    args = bloscpack.BloscpackArgs(offsets=True, checksum="adler32", max_app_chunks=8)
    bloscpack.pack_ndarray_to_file(data, os.path.join(root, "appended.blp"), chunk_size=400, bloscpack_args=args)
    extra = os.path.join(root, "extra.bin")
    with open(extra, "wb") as f:
        f.write(values(300, "<i4", 31).tobytes())
    bloscpack.append.append(os.path.join(root, "appended.blp"), extra)
    os.remove(extra)
    # A structured dtype, and chunks that do not hold whole rows.
    pairs = np.zeros(50, dtype=[("a", "<i4"), ("b", "<f8")])
    bloscpack.pack_ndarray_to_file(pairs, os.path.join(root, "structured.blp"), chunk_size=120)
    bloscpack.pack_ndarray_to_file(values((10, 3), "<i4", 32), os.path.join(root, "rows.blp"), chunk_size=20)
    # An object carray.
    bcolz.carray(np.array(["a", 1, None], dtype=object), rootdir=os.path.join(root, "objects"), mode="w").flush()
    with open(os.path.join(w.expected, "refused.json"), "w") as f:
        json.dump(["refused/appended", "refused/structured", "refused/rows", "refused/objects"], f)


def main():
    out = sys.argv[1]
    w = Writer(out)
    groups = everything(w) if "--all" in sys.argv[2:] else small(w)
    w.finish(groups)


if __name__ == "__main__":
    main()
