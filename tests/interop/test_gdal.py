"""GDAL 3.12 (bundled in rasterio 1.5's wheels) cannot read sharded Zarr, and reads the v3 view.

zarr-python and tensorstore (the newest releases, target/venv-newest) write every layout of
tests/data/generate.py afresh. rasterio opening `ZARR:"<array>":/<name>` on the sharded store
itself fails with GDAL's "Unsupported codec: sharding_indexed"; through a read-only mount of the
v3 view it reads every array exactly (1-D, 2-D, and 3-D as bands): gzip, zstd, crc32c, big-endian
data, nested sharding, index at the start, every chunk key encoding.

Runs in target/venv-newest; one array alone:
``target/venv-newest/bin/python -m pytest tests/interop/test_gdal.py -k nested``.
"""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import shardfs
import rasterio
import zarr
from conftest import ROOT
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402

warnings.filterwarnings("ignore", category=NotGeoreferencedWarning)
warnings.filterwarnings("ignore", message="Consolidated metadata")

ARRAYS = [path for path, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]


def gdal_read(root, path):
    """The array at `path` of the store at `root` as GDAL reads it (a 3-D array as bands, a 1-D
    one as one row)."""
    with rasterio.open(f'ZARR:"{Path(root) / path}":/{path.split("/")[-1]}') as dataset:
        return dataset.read()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    work = tmp_path_factory.mktemp("gdal")
    generate.generate(str(work))
    return work / "sharded"


@pytest.fixture(scope="module")
def view(sharded):
    with shardfs.mount(sharded, read_only=True) as mnt:
        yield Path(mnt)


@pytest.mark.parametrize("path", ARRAYS)
def test_gdal_cannot_read_the_sharded_array_itself(sharded, path):
    with pytest.raises(RasterioIOError, match="Unsupported codec: sharding_indexed"):
        gdal_read(sharded, path)


@pytest.mark.parametrize("path", ARRAYS)
def test_gdal_reads_the_v3_view_exactly(sharded, view, path):
    want = zarr.open_array(sharded / path, mode="r")[...]
    got = gdal_read(view, path)
    assert got.dtype == want.dtype and got.size == want.size
    np.testing.assert_array_equal(got.reshape(want.shape), want)
