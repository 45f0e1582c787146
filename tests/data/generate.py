"""Writes sharded Zarr v3 arrays and their unsharded twins with real peers.

    python tests/data/generate.py OUT_DIR

OUT_DIR/sharded is a store of sharded arrays in every layout shardfs shows unsharded, written by
zarr-python 3 and tensorstore; OUT_DIR/unsharded holds, at the same paths, the same data written
by the same library as unsharded arrays with the inner chunk shape and inner codecs. shardfs's
view of OUT_DIR/sharded must equal OUT_DIR/unsharded: the same chunk files with the same bytes,
and the same zarr.json documents (as JSON values). Both roots carry consolidated metadata.

The committed copy under tests/data/golden was made by this script; tests/interop/test_peers.py runs it
again with the peers installed by the test script.
"""

import json
import os
import sys

import numpy as np
import tensorstore as ts
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}


def values(shape, dtype, seed, empty_rows=True):
    """Deterministic data; with empty_rows, a third of it is fill value so that some inner chunks
    are empty."""
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 250, size=shape).astype(dtype)
    if empty_rows and data.ndim >= 1 and data.shape[0] > 3:
        data[: data.shape[0] // 3] = 0
    return data


def zarr_python_arrays():
    """(path, create_array keyword arguments for the sharded array, the twin's, data)."""
    cases = []

    def case(path, shape, dtype, shard, inner, inner_codecs, index_codecs, location="end",
             key_encoding=None, seed=0):
        compressors = [c for c in inner_codecs if not isinstance(c, BytesCodec)]
        serializer = [c for c in inner_codecs if isinstance(c, BytesCodec)] or [BytesCodec()]
        sharded = dict(shape=shape, dtype=dtype, chunks=shard, compressors=None, fill_value=0,
                       serializer=ShardingCodec(chunk_shape=inner, codecs=inner_codecs,
                                                index_codecs=index_codecs, index_location=location))
        twin = dict(shape=shape, dtype=dtype, chunks=inner, compressors=compressors or None,
                    serializer=serializer[0], fill_value=0)
        if key_encoding:
            sharded["chunk_key_encoding"] = key_encoding
            twin["chunk_key_encoding"] = key_encoding
        cases.append((path, sharded, twin, values(shape, dtype, seed)))

    crc = [BytesCodec(), Crc32cCodec()]
    case("zp/gzip_crc_end", (20, 18), "uint16", (8, 12), (4, 6), [BytesCodec(), GzipCodec(level=5)], crc)
    case("zp/zstd_start", (13, 9, 7), "int32", (8, 6, 4), (4, 3, 2), [BytesCodec(), ZstdCodec(level=3)], crc,
         location="start", seed=1)
    case("zp/raw_nocrc", (30,), "uint8", (12,), (4,), [BytesCodec()], [BytesCodec()], seed=2)
    case("zp/big_endian_index", (9, 9), "float64", (6, 6), (3, 3), [BytesCodec(endian="big")],
         [BytesCodec(endian="big"), Crc32cCodec()], seed=3)
    case("zp/keys/default_dot", (10, 10), "uint8", (4, 4), (2, 2), [BytesCodec()], crc,
         key_encoding={"name": "default", "separator": "."}, seed=4)
    case("zp/keys/v2_dot", (10, 10), "uint8", (4, 4), (2, 2), [BytesCodec()], crc,
         key_encoding={"name": "v2", "separator": "."}, seed=5)
    case("zp/keys/v2_slash", (10, 10), "uint8", (4, 4), (2, 2), [BytesCodec()], crc,
         key_encoding={"name": "v2", "separator": "/"}, seed=6)
    nested = ShardingCodec(chunk_shape=(4, 4), codecs=[BytesCodec(), GzipCodec(level=1)], index_codecs=crc)
    cases.append(("zp/nested",
                  dict(shape=(20, 16), dtype="int16", chunks=(16, 16), compressors=None, fill_value=0,
                       serializer=ShardingCodec(chunk_shape=(8, 8), codecs=[nested], index_codecs=crc)),
                  dict(shape=(20, 16), dtype="int16", chunks=(4, 4), compressors=GzipCodec(level=1),
                       serializer=BytesCodec(), fill_value=0),
                  # zarr-python stores all-fill chunks inside nested shards, so none are made here.
                  values((20, 16), "int16", 7, empty_rows=False)))
    return cases


def write_zarr_python(root, path, kwargs, data):
    array = zarr.create_array(store=os.path.join(root, path), attributes={"written_by": "zarr-python"},
                              dimension_names=[f"d{i}" for i in range(data.ndim)], **kwargs)
    array[...] = data


def tensorstore_arrays():
    """(path, sharded metadata, twin metadata, data) for tensorstore's zarr3 driver."""
    def sharded(shape, shard, inner, dtype, inner_codecs, index_codecs, location=None):
        config = {"chunk_shape": inner, "codecs": inner_codecs, "index_codecs": index_codecs}
        if location:
            config["index_location"] = location
        return {"shape": shape, "data_type": dtype, "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
                "codecs": [{"name": "sharding_indexed", "configuration": config}]}

    def twin(shape, inner, dtype, inner_codecs):
        return {"shape": shape, "data_type": dtype, "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": inner}},
                "codecs": inner_codecs}

    crc = [BYTES_LE, {"name": "crc32c"}]
    zstd = [BYTES_LE, {"name": "zstd", "configuration": {"level": 3, "checksum": False}}]
    gzip = [BYTES_LE, {"name": "gzip", "configuration": {"level": 6}}]
    return [
        ("ts/zstd_crc", sharded([21, 10], [8, 10], [4, 5], "uint16", zstd, crc),
         twin([21, 10], [4, 5], "uint16", zstd), values((21, 10), "uint16", 10)),
        ("ts/gzip_start_nocrc", sharded([17], [8], [2], "int64", gzip, [BYTES_LE], "start"),
         twin([17], [2], "int64", gzip), values((17,), "int64", 11)),
    ]


def write_tensorstore(root, path, metadata, data):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(root, path)},
            "metadata": dict(metadata, attributes={"written_by": "tensorstore"})}
    ts.open(spec, create=True, delete_existing=True).result()[...].write(data).result()


def generate(out):
    for side in ("sharded", "unsharded"):
        zarr.open_group(os.path.join(out, side), mode="w", attributes={"golden": True})
        for group in ("zp", "zp/keys", "ts"):
            zarr.open_group(os.path.join(out, side, group), mode="w", attributes={"group": group})
    for path, sharded, twin, data in zarr_python_arrays():
        write_zarr_python(os.path.join(out, "sharded"), path, sharded, data)
        write_zarr_python(os.path.join(out, "unsharded"), path, twin, data)
    for path, sharded, twin, data in tensorstore_arrays():
        write_tensorstore(os.path.join(out, "sharded"), path, sharded, data)
        write_tensorstore(os.path.join(out, "unsharded"), path, twin, data)
    for side in ("sharded", "unsharded"):
        zarr.consolidate_metadata(os.path.join(out, side))
    with open(os.path.join(out, "arrays.json"), "w") as f:
        json.dump([p for p, *_ in zarr_python_arrays() + tensorstore_arrays()], f, indent=1)


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore", message="Consolidated metadata")
    generate(sys.argv[1])
