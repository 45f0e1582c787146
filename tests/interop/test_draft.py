"""The draft storage-transformer layout with zarr-python 2.16.1.

zarr-python 2.16.1 with ZARR_V3_SHARDING=1 writes sharded arrays (tests/data/generate_draft.py);
shardfs mounts them; zarr-python 2.16.1 *without* ZARR_V3_SHARDING reads the mounted view as plain
arrays and must get the same data, then writes through the view; after the unmount the sharded
store, read with ZARR_V3_SHARDING=1, must hold exactly what was written, and `shardfs check` must
pass. zarr reads ZARR_V3_SHARDING when it is imported, so the sharded side runs in child
processes.

Runs in target/venv2 (zarr-python 2.16.1); one array alone:
``target/venv2/bin/python -m pytest tests/interop/test_draft.py -k cube``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import shardfs
from conftest import BINARY, ROOT

# Read when zarr is first imported (generate_draft imports it).
assert "ZARR_V3_SHARDING" not in os.environ, "run without ZARR_V3_SHARDING: the view is read unsharded"
os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
sys.path.insert(0, str(ROOT / "tests/data"))
import generate_draft  # noqa: E402
import zarr  # noqa: E402

ARRAYS = [path for path, *_ in generate_draft.ARRAYS]

# Run with ZARR_V3_SHARDING=1: saves the array at argv[2] of the store at argv[1] to argv[3].
DUMP = r"""
import sys, numpy as np, zarr
store, path, out = sys.argv[1:]
np.save(out, zarr.open_array(store=zarr.DirectoryStoreV3(store), path=path, mode="r", zarr_version=3)[...])
"""


def sharded_data(store, path, out):
    """The array at `path` of the sharded `store`, as zarr-python 2.16.1 with sharding reads it."""
    env = dict(os.environ, ZARR_V3_SHARDING="1")
    subprocess.run([sys.executable, "-c", DUMP, store, path, out], env=env, check=True)
    return np.load(out)


@pytest.fixture
def sharded(tmp_path):
    """The arrays, freshly written sharded by zarr-python 2.16.1 (each test writes to them)."""
    env = dict(os.environ, ZARR_V3_SHARDING="1")
    subprocess.run([sys.executable, ROOT / "tests/data/generate_draft.py", tmp_path], env=env, check=True)
    return tmp_path / "sharded"


@pytest.mark.parametrize("path", ARRAYS)
def test_zarr_2_16_reads_and_writes_the_view_and_the_shards_hold_it(sharded, tmp_path, path):
    data = sharded_data(sharded, path, tmp_path / "before.npy")
    with shardfs.mount(sharded) as mnt:
        view = zarr.open_array(store=zarr.DirectoryStoreV3(mnt), path=path, mode="r+", zarr_version=3)
        np.testing.assert_array_equal(view[...], data, err_msg="read unsharded through the view")
        region = tuple(slice(1, min(4, n)) for n in data.shape)
        view[region] = data[region] = 77
        first = (slice(0, view.chunks[0]),) + (slice(None),) * (data.ndim - 1)
        view[first] = data[first] = 0
        np.testing.assert_array_equal(view[...], data, err_msg="written through the view")
    np.testing.assert_array_equal(sharded_data(sharded, path, tmp_path / "after.npy"), data,
                                  err_msg="the sharded store after the unmount")
    checked = subprocess.run([BINARY, "check", sharded], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout[-500:]


def test_metadata_edits_through_the_view_keep_the_transformer(sharded, tmp_path):
    data = sharded_data(sharded, "g1/arr", tmp_path / "before.npy")
    with shardfs.mount(sharded) as mnt:
        view = zarr.open_array(store=zarr.DirectoryStoreV3(mnt), path="g1/arr", mode="r+", zarr_version=3)
        view.attrs["edited"] = "through the view"
        view.resize(30, 70)
    doc = json.loads((sharded / "meta/root/g1/arr.array.json").read_text())
    assert len(doc.get("storage_transformers", [])) == 1 and doc["shape"] == [30, 70]
    assert doc["attributes"]["edited"] == "through the view"
    np.testing.assert_array_equal(sharded_data(sharded, "g1/arr", tmp_path / "after.npy"), data[:30])
    checked = subprocess.run([BINARY, "check", sharded], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout[-500:]
