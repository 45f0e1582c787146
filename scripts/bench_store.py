"""Writes the benchmark stores: a sharded Zarr v3 store and the same chunks as plain files.

    python3 scripts/bench_store.py OUT_DIR --shards N --chunks-per-shard M --chunk-bytes B [--index-only] [--rows]

OUT_DIR/sharded: a group with one array `a` of N shards (a 1-D grid of shards, each M inner
chunks, uncompressed `bytes`, crc32c index at the end); OUT_DIR/plain: the unsharded equivalent,
one file per chunk at `a/c/<i>`. With --index-only, every inner chunk of every shard points at
the same single data byte: a store of many chunks whose size is all index (for memory tests);
no plain copy is written then. With --rows, `a` is 2-D, one row of chunks per shard: N chunk
directories `a/c/<row>/` of M chunk files each (shard `a/c/<row>/0`). Pure Python, no third-party module.
"""

import argparse
import json
import os
import random
import struct


def crc32c(data, crc=0):
    # CRC-32C (Castagnoli), table-driven; fast enough for indexes.
    table = crc32c.table
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


crc32c.table = _table()


def array_doc(shards, per_shard, chunk_bytes, rows):
    row = [1] if rows else []
    shape = [shards, per_shard * chunk_bytes] if rows else [shards * per_shard * chunk_bytes]
    return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": row + [per_shard * chunk_bytes]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": row + [chunk_bytes], "codecs": [{"name": "bytes"}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}], "attributes": {}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--chunks-per-shard", type=int, required=True)
    parser.add_argument("--chunk-bytes", type=int, required=True)
    parser.add_argument("--index-only", action="store_true")
    parser.add_argument("--rows", action="store_true")
    args = parser.parse_args()
    n, size = args.chunks_per_shard, args.chunk_bytes

    def shard_path(s):
        path = os.path.join(sharded, "a", "c", *([str(s), "0"] if args.rows else [str(s)]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def plain_path(s, i):
        path = os.path.join(plain, *([str(s), str(i)] if args.rows else [str(s * n + i)]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path
    sharded = os.path.join(args.out, "sharded")
    os.makedirs(os.path.join(sharded, "a", "c"), exist_ok=True)
    with open(os.path.join(sharded, "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {}}, f)
    with open(os.path.join(sharded, "a", "zarr.json"), "w") as f:
        json.dump(array_doc(args.shards, n, size, args.rows), f)
    if args.index_only:
        index = struct.pack("<QQ", 0, 1) * n
        blob = b"\x01" + index + struct.pack("<I", crc32c(index))
        for s in range(args.shards):
            with open(shard_path(s), "wb") as f:
                f.write(blob)
        return
    plain = os.path.join(args.out, "plain", "a", "c")
    os.makedirs(plain, exist_ok=True)
    with open(os.path.join(args.out, "plain", "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {}}, f)
    rng = random.Random(7)
    for s in range(args.shards):
        chunks = [rng.randbytes(size) for _ in range(n)]
        index = b"".join(struct.pack("<QQ", i * size, size) for i in range(n))
        with open(shard_path(s), "wb") as f:
            f.write(b"".join(chunks) + index + struct.pack("<I", crc32c(index)))
        for i, chunk in enumerate(chunks):
            with open(plain_path(s, i), "wb") as f:
                f.write(chunk)
    doc = array_doc(args.shards, n, size, args.rows)
    doc["chunk_grid"]["configuration"]["chunk_shape"] = ([1] if args.rows else []) + [size]
    doc["codecs"] = [{"name": "bytes"}]
    with open(os.path.join(args.out, "plain", "a", "zarr.json"), "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
