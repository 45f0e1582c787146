"""Interop test with GDAL 3.12 (bundled in rasterio 1.5's wheels): it cannot read sharded Zarr,
and reads the v3 view.

    target/venv-newest/bin/python scripts/interop_gdal.py [path/to/shardfs]

zarr-python and tensorstore (the newest releases, target/venv-newest) write every layout of
tests/data/generate.py afresh. rasterio opening `ZARR:"<array>":/<name>` on the sharded store
itself fails with GDAL's "Unsupported codec: sharding_indexed"; through a read-only mount of the
v3 view it reads every array exactly (1-D, 2-D, and 3-D as bands): gzip, zstd, crc32c,
big-endian data, nested sharding, index at the start, every chunk key encoding.
"""

import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import rasterio
import zarr
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import generate  # noqa: E402
from checks import Checks

warnings.filterwarnings("ignore", category=NotGeoreferencedWarning)
warnings.filterwarnings("ignore", message="Consolidated metadata")


def gdal_read(root, path):
    """The array at `path` of the store at `root` as GDAL reads it, shaped as the array (GDAL
    shows a 3-D array as bands and a 1-D one as one row)."""
    with rasterio.open(f'ZARR:"{os.path.join(root, path)}":/{path.split("/")[-1]}') as dataset:
        return dataset.read()


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()

    gdal = f"GDAL {rasterio.__gdal_version__}"
    with tempfile.TemporaryDirectory(prefix="shardfs-interop-gdal.") as work:
        generate.generate(work)
        sharded, mnt = os.path.join(work, "sharded"), os.path.join(work, "mnt")
        arrays = [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]
        for path in arrays:
            try:
                gdal_read(sharded, path)
                outcome = "read it"
            except RasterioIOError as e:
                outcome = str(e)
            check(f"{path}: {gdal} cannot read the sharded array itself", "Unsupported codec: sharding_indexed" in outcome,
                  outcome)
        os.mkdir(mnt)
        subprocess.run([binary, "mount", "--read-only", sharded, mnt], check=True)
        try:
            for path in arrays:
                want = zarr.open_array(os.path.join(sharded, path), mode="r")[...]
                try:
                    got = gdal_read(mnt, path)
                    ok, detail = got.size == want.size and np.array_equal(got.reshape(want.shape), want), ""
                    ok = ok and got.dtype == want.dtype
                except RasterioIOError as e:
                    ok, detail = False, str(e)
                check(f"{path}: {gdal} reads the v3 view exactly", ok, detail)
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        check("unmounted", not os.path.ismount(mnt))
    return check.summary("interop-gdal")


if __name__ == "__main__":
    sys.exit(main())
