"""What several interop tests do with the peers (zarr-python 3 and tensorstore): the chunk files
of a store, a directory tree as ``ls -R`` shows it, and regions written through a view. Shared by
the pytest files here."""

import os

import numpy as np
import tensorstore as ts
import zarr


def chunk_files(root):
    """Every file below `root` but the documents, relative to it."""
    found = set()
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name != "zarr.json":
                found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def walk(root):
    """Every directory of `root` with its sorted entries, as `ls -R` shows them."""
    return {os.path.relpath(d, root): (sorted(dirs), sorted(files)) for d, dirs, files in os.walk(root)}


def peers_write_regions(mnt, zp_paths, ts_paths):
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
        np.testing.assert_array_equal(view[...], data, err_msg=f"{path}: zarr-python writes through the view")
        expected[path] = data
    for path in ts_paths:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}}
        store = ts.open(spec, open=True, read=True, write=True).result()
        data = store.read().result().copy()
        region = tuple(slice(2, min(7, n)) for n in data.shape)
        data[region] = 5
        store[region] = 5
        np.testing.assert_array_equal(store.read().result(), data, err_msg=f"{path}: tensorstore writes through the view")
        expected[path] = data
    return expected
