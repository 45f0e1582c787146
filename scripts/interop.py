"""Interop test: peers write sharded arrays, shardfs mounts them, peers read and write the view.

    target/venv/bin/python scripts/interop.py [path/to/shardfs]

zarr-python 3 and tensorstore (installed by scripts/setup.sh) write every layout of
tests/data/generate.py afresh, with their unsharded twins. The shardfs binary mounts the sharded
store; then, for every array, zarr-python and tensorstore open the *mounted view* as plain
unsharded arrays and must read exactly the data written, and the view's chunk files must be
exactly the twin's (the non-empty inner chunks inside the array bounds). Then both peers write
through the view (partial overwrites, regions set to fill value, which deletes chunks), `cp -r`
copies an unsharded array in, and after `shardfs unmount` the sharded store itself, read by both
peers directly, must hold exactly that data, and `shardfs check` must pass.
"""

import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import tensorstore as ts
import zarr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import generate  # noqa: E402
from checks import Checks

warnings.filterwarnings("ignore", message="Consolidated metadata")


def chunk_files(root):
    found = set()
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name != "zarr.json":
                found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def peers_write_regions(mnt, zp_paths, ts_paths, check):
    """zarr-python writes a region of each of `zp_paths` and sets its first chunk row back to fill
    value (which deletes those chunk files); tensorstore writes a region of each of `ts_paths`.
    Returns the data each array must now hold."""
    expected = {}
    for path in zp_paths:
        view = zarr.open_array(os.path.join(mnt, path), mode="r+")
        data = view[...].copy()
        region = tuple(slice(1, min(5, n)) for n in data.shape)
        data[region] = 77
        view[region] = 77
        # A whole leading chunk row back to fill value: zarr-python deletes those chunk files.
        first = tuple(slice(0, c) for c in view.chunks[:1]) + (slice(None),) * (data.ndim - 1)
        data[first] = 0
        view[first] = 0
        check(f"{path}: zarr-python writes through the view", np.array_equal(view[...], data))
        expected[path] = data
    for path in ts_paths:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}}
        store = ts.open(spec, open=True, read=True, write=True).result()
        data = store.read().result().copy()
        region = tuple(slice(2, min(7, n)) for n in data.shape)
        data[region] = 5
        store[region] = 5
        check(f"{path}: tensorstore writes through the view", np.array_equal(store.read().result(), data))
        expected[path] = data
    return expected


def write_through_view(mnt, sharded, twin, check):
    """Both peers write through the mounted view; returns the data each array must now hold."""
    expected = peers_write_regions(mnt, ["zp/gzip_crc_end", "zp/zstd_start", "zp/keys/v2_dot", "zp/raw_nocrc", "zp/nested"],
                                   ["ts/zstd_crc", "ts/gzip_start_nocrc"], check)
    subprocess.run(["cp", "-r", os.path.join(twin, "zp", "nested"), os.path.join(mnt, "zp", "copied")], check=True)
    expected["zp/copied"] = zarr.open_array(os.path.join(twin, "zp", "nested"), mode="r")[...]
    # Metadata through the view: attributes and a resize land in the stored (sharded) zarr.json.
    view = zarr.open_array(os.path.join(mnt, "zp/raw_nocrc"), mode="r+")
    view.attrs["edited"] = "through the view"
    view.resize((20,))
    expected["zp/raw_nocrc"] = expected["zp/raw_nocrc"][:20]
    check("zp/raw_nocrc: resized through the view", zarr.open_array(os.path.join(mnt, "zp/raw_nocrc"), mode="r").shape == (20,))
    return expected


def shard_new_through_view(binary, work, check):
    """With --shard-new, an array zarr-python creates through the view is stored sharded."""
    store, mnt = os.path.join(work, "fresh"), os.path.join(work, "mnt-fresh")
    zarr.open_group(store, mode="w")
    os.mkdir(mnt)
    data = np.arange(24 * 20, dtype="int32").reshape(24, 20)
    subprocess.run([binary, "mount", "--shard-new", "4,2", store, mnt], check=True)
    try:
        created = zarr.create_array(store=os.path.join(mnt, "made"), shape=data.shape, chunks=(3, 5), dtype="int32",
                                    compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
        created[...] = data
        check("--shard-new: the view shows the array as created",
              "sharding_indexed" not in str(zarr.open_array(os.path.join(mnt, "made"), mode="r").metadata.codecs))
    finally:
        subprocess.run([binary, "unmount", mnt], check=False)
    stored = zarr.open_array(os.path.join(store, "made"), mode="r")
    check("--shard-new: stored sharded, 4x2 inner chunks per shard",
          stored.shards == (12, 10) and stored.chunks == (3, 5), f"{stored.shards} {stored.chunks}")
    check("--shard-new: zarr-python reads the data from the sharded store", np.array_equal(stored[...], data))


def external_rewrite(binary, work, check):
    """zarr-python rewrites every shard of an array underneath a read-only mount, again and again,
    while chunk files are read through the view: each read must be some whole version of its chunk
    (or a clean EIO while a shard is half-written), and after the cache timeout the view serves the
    last version."""
    import gzip
    import threading
    import time
    store, mnt = os.path.join(work, "rewritten"), os.path.join(work, "mnt-rewritten")
    arr = zarr.create_array(store=store, shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="uint16",
                            compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
    arr[...] = 1
    os.mkdir(mnt)
    subprocess.run([binary, "mount", "--read-only", store, mnt], check=True)
    counts = {"whole": 0, "eio": 0, "wrong": 0}
    last, seen = [1], set()
    stop = threading.Event()

    def rewrite():
        version = 1
        while not stop.is_set():
            version = version % 200 + 1
            arr[...] = version
            last[0] = version

    writer = threading.Thread(target=rewrite)
    try:
        writer.start()
        deadline = time.time() + 4
        while time.time() < deadline:
            for i in range(8):
                for j in range(8):
                    try:
                        with open(os.path.join(mnt, "c", str(i), str(j)), "rb") as f:
                            raw = f.read()
                    except OSError:
                        counts["eio"] += 1
                        continue
                    try:
                        values = np.frombuffer(gzip.decompress(raw), dtype="<u2")
                        whole = values.size == 64 and (values == values[0]).all() and 1 <= values[0] <= 200
                    except (OSError, EOFError, ValueError):
                        whole = False
                    counts["whole" if whole else "wrong"] += 1
                    if whole:
                        seen.add(int(values[0]))
        stop.set()
        writer.join()
        time.sleep(1.5)
        final = zarr.open_array(mnt, mode="r")[...]
        check("external rewrite: every chunk read was a whole version or EIO, never mixed bytes",
              counts["wrong"] == 0 and len(seen) > 1, f"{counts}, {len(seen)} versions seen")
        check("external rewrite: after the cache timeout the view serves the last version",
              (final == last[0]).all(), f"want {last[0]}, got {np.unique(final)}")
    finally:
        stop.set()
        subprocess.run([binary, "unmount", mnt], check=False)
    print(f"     external rewrite reads: {counts}, {len(seen)} versions seen")


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-interop.") as work:
        generate.generate(work)
        sharded, twin, mnt = (os.path.join(work, d) for d in ("sharded", "unsharded", "mnt"))
        os.mkdir(mnt)
        subprocess.run([binary, "mount", sharded, mnt], check=True)
        try:
            arrays = [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]
            for path in arrays:
                expected = zarr.open_array(os.path.join(sharded, path), mode="r")[...]
                view = zarr.open_array(os.path.join(mnt, path), mode="r")
                check(f"{path}: zarr-python sees an unsharded array",
                      "sharding_indexed" not in str(view.metadata.codecs), str(view.metadata.codecs))
                check(f"{path}: zarr-python reads the view", np.array_equal(view[...], expected, equal_nan=True))
                store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}},
                                open=True, read=True).result()
                check(f"{path}: tensorstore reads the view",
                      np.array_equal(store.read().result(), expected, equal_nan=True))
                got, want = chunk_files(os.path.join(mnt, path)), chunk_files(os.path.join(twin, path))
                check(f"{path}: chunk files are the non-empty in-bounds inner chunks", got == want,
                      f"extra {sorted(got - want)[:5]} missing {sorted(want - got)[:5]}")
            group = zarr.open_group(mnt, mode="r", use_consolidated=True)
            members = dict(group.members(max_depth=None))
            unsharded = all("sharding_indexed" not in str(a.metadata.codecs)
                            for a in members.values() if isinstance(a, zarr.Array))
            check("consolidated metadata describes unsharded arrays", unsharded and len(members) >= len(arrays))
            expected = write_through_view(mnt, sharded, twin, check)
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        check("unmounted", not os.path.ismount(mnt))
        for path, data in expected.items():
            stored = zarr.open_array(os.path.join(sharded, path), mode="r")[...]
            check(f"{path}: zarr-python reads the written data from the sharded store",
                  np.array_equal(stored, data, equal_nan=True))
            if path.startswith("ts/") or path.startswith("zp/gzip"):
                spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(sharded, path)}}
                got = ts.open(spec, open=True, read=True).result().read().result()
                check(f"{path}: tensorstore reads the written data from the sharded store",
                      np.array_equal(got, data, equal_nan=True))
        result = subprocess.run([binary, "check", sharded], capture_output=True, text=True)
        check("shardfs check passes after the writes", result.returncode == 0, result.stdout[-500:])
        result = subprocess.run([binary, "compact", sharded], capture_output=True, text=True)
        check("shardfs compact frees the space the appends left", result.returncode == 0 and "bytes freed" in result.stdout,
              result.stdout[-300:] + result.stderr[-300:])
        info = subprocess.run([binary, "info", sharded], capture_output=True, text=True).stdout
        unused = [line.split()[4] for line in info.splitlines()[1:] if not line.startswith("zp/nested")]
        check("shardfs info shows no unused bytes after compaction", all(u == "0" for u in unused), info)
        for path, data in expected.items():
            stored = zarr.open_array(os.path.join(sharded, path), mode="r")[...]
            check(f"{path}: zarr-python reads the same data after compaction", np.array_equal(stored, data, equal_nan=True))
        result = subprocess.run([binary, "check", sharded], capture_output=True, text=True)
        check("shardfs check passes after compaction", result.returncode == 0, result.stdout[-500:])
        stored = zarr.open_array(os.path.join(sharded, "zp/raw_nocrc"), mode="r")
        check("zp/raw_nocrc: the stored document keeps its sharding and takes the edits",
              stored.shards is not None and stored.shape == (20,) and stored.attrs["edited"] == "through the view")
        shard_new_through_view(binary, work, check)
        external_rewrite(binary, work, check)
    return check.summary("interop")


if __name__ == "__main__":
    sys.exit(main())
