"""Writes arrays in the draft sharding storage-transformer layout, and their unsharded twins, with
zarr-python 2.16.1 (ZARR_V3_EXPERIMENTAL_API=1, ZARR_V3_SHARDING=1).

    ZARR_V3_EXPERIMENTAL_API=1 ZARR_V3_SHARDING=1 python tests/data/generate_draft.py OUT_DIR

OUT_DIR/sharded and OUT_DIR/unsharded hold the same arrays at the same paths, sharded and not;
shardfs's view of OUT_DIR/sharded must equal OUT_DIR/unsharded. The committed copy under
tests/data/golden_draft was made by this script; tests/interop/test_draft.py runs it again.
"""

import json
import os
import sys

import numcodecs
import numpy as np
import zarr
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer


def values(shape, dtype, seed, empty_rows):
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 200, size=shape).astype(dtype)
    if empty_rows:
        data[: max(1, shape[0] // 3)] = 0
    return data


# path, shape, chunks, chunks_per_shard, dtype, compressor, separator, write_empty_chunks
ARRAYS = [
    ("one_d", (37,), (4,), (3,), "<i4", "zlib", "/", False),
    ("g1/arr", (45, 70), (10, 10), (2, 3), "<u2", "zlib", "/", False),
    ("g1/dots", (20, 18), (4, 6), (2, 2), "<u1", "none", ".", False),
    ("g1/sub/cube", (9, 10, 11), (3, 4, 5), (2, 2, 2), "<f8", "blosc", "/", False),
    ("implicit/deep/empties", (12, 12), (4, 4), (2, 2), "<i2", "zlib", "/", True),
]


def compressor(name):
    return {"zlib": numcodecs.Zlib(level=1), "blosc": numcodecs.Blosc(cname="lz4", clevel=3, shuffle=1, blocksize=0),
            "none": None}[name]


def generate(out):
    for side in ("sharded", "unsharded"):
        store = zarr.DirectoryStoreV3(os.path.join(out, side))
        zarr.group(store=store, path="g1", zarr_version=3).attrs["kind"] = "explicit group"
        for i, (path, shape, chunks, per_shard, dtype, comp, sep, empties) in enumerate(ARRAYS):
            transformers = [ShardingStorageTransformer("indexed", chunks_per_shard=per_shard)] if side == "sharded" else []
            array = zarr.create(shape=shape, chunks=chunks, dtype=dtype, store=store, path=path, zarr_version=3,
                                storage_transformers=transformers, compressor=compressor(comp), fill_value=0,
                                dimension_separator=sep, write_empty_chunks=empties)
            array.attrs["written_by"] = "zarr-python 2.16.1"
            array[...] = values(shape, dtype, i, empty_rows=True)
    with open(os.path.join(out, "arrays.json"), "w") as f:
        json.dump([a[0] for a in ARRAYS], f, indent=1)


if __name__ == "__main__":
    generate(sys.argv[1])
