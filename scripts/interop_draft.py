"""Interop test of the draft storage-transformer layout with zarr-python 2.16.1.

    target/venv2/bin/python scripts/interop_draft.py [path/to/shardfs]

zarr-python 2.16.1 with ZARR_V3_SHARDING=1 writes sharded arrays (tests/data/generate_draft.py);
shardfs mounts them; zarr-python 2.16.1 *without* ZARR_V3_SHARDING reads the mounted view as
plain arrays and must get the same data, then writes through the view; after `shardfs unmount`
the sharded store, read with ZARR_V3_SHARDING=1, must hold exactly what was written, and
`shardfs check` must pass. zarr reads ZARR_V3_SHARDING when it is imported, so the sharded side
runs in child processes (`dump` mode).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
from checks import Checks

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data"))


def zarr_env(sharding):
    env = dict(os.environ, ZARR_V3_EXPERIMENTAL_API="1")
    env.pop("ZARR_V3_SHARDING", None)
    if sharding:
        env["ZARR_V3_SHARDING"] = "1"
    return env


def dump(store, out):
    """Saves every array of generate_draft.ARRAYS in `store` to out/<n>.npy (sharding enabled)."""
    import generate_draft
    import zarr
    for i, (path, *_rest) in enumerate(generate_draft.ARRAYS):
        array = zarr.open_array(store=zarr.DirectoryStoreV3(store), path=path, mode="r", zarr_version=3)
        np.save(os.path.join(out, f"{i}.npy"), array[...])


def sharded_data(store, work, tag):
    out = os.path.join(work, tag)
    os.mkdir(out)
    subprocess.run([sys.executable, __file__, "dump", store, out], env=zarr_env(True), check=True)
    import generate_draft
    return {path: np.load(os.path.join(out, f"{i}.npy")) for i, (path, *_r) in enumerate(generate_draft.ARRAYS)}


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    assert "ZARR_V3_SHARDING" not in os.environ, "run without ZARR_V3_SHARDING: the view is read unsharded"
    os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
    import generate_draft
    import zarr
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-draft.") as work:
        subprocess.run([sys.executable, os.path.join(HERE, "..", "tests", "data", "generate_draft.py"), work],
                       env=zarr_env(True), check=True)
        sharded, mnt = os.path.join(work, "sharded"), os.path.join(work, "mnt")
        os.mkdir(mnt)
        written = sharded_data(sharded, work, "before")
        subprocess.run([binary, "mount", sharded, mnt], check=True)
        try:
            view_store = zarr.DirectoryStoreV3(mnt)
            for path, data in written.items():
                view = zarr.open_array(store=view_store, path=path, mode="r+", zarr_version=3)
                check(f"{path}: zarr 2.16.1 without sharding reads the view", np.array_equal(view[...], data))
                region = tuple(slice(1, min(4, n)) for n in data.shape)
                view[region] = 77
                data[region] = 77
                first = (slice(0, view.chunks[0]),) + (slice(None),) * (data.ndim - 1)
                view[first] = 0
                data[first] = 0
                check(f"{path}: zarr 2.16.1 writes through the view", np.array_equal(view[...], data))
            # Metadata through the view: the stored .array.json keeps its sharding transformer.
            view = zarr.open_array(store=view_store, path="g1/arr", mode="r+", zarr_version=3)
            view.attrs["edited"] = "through the view"
            view.resize(30, 70)
            written["g1/arr"] = written["g1/arr"][:30]
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        check("unmounted", not os.path.ismount(mnt))
        stored = sharded_data(sharded, work, "after")
        for path, data in written.items():
            check(f"{path}: the sharded store holds what was written", np.array_equal(stored[path], data))
        import json
        with open(os.path.join(sharded, "meta", "root", "g1", "arr.array.json")) as f:
            doc = json.load(f)
        check("g1/arr: the stored document keeps its transformer and takes the edits",
              len(doc.get("storage_transformers", [])) == 1 and doc["shape"] == [30, 70]
              and doc["attributes"]["edited"] == "through the view", json.dumps(doc)[:300])
        result = subprocess.run([binary, "check", sharded], capture_output=True, text=True)
        check("shardfs check passes after the writes", result.returncode == 0, result.stdout[-500:])
    return check.summary("interop-draft")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
