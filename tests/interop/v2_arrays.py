"""Arrays beyond tests/data/generate.py's, each with a codec the Zarr v2 view must map to its v2
form (or refuse): blosc, bool, a NaN fill value, inner chunks ending in a crc32c, F order
(a transpose), unsharded arrays (one with a crc32c and "/" keys), xarray's dimension names, and one
with two compressors, which v2 cannot express. test_v2.py and test_refs.py write them with the layouts of generate.py (`write_store`)."""

import os
import sys
from pathlib import Path

import numpy as np
import zarr
from conftest import ROOT
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec

sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402


def write_store(work):
    """Every layout of tests/data/generate.py written afresh in WORK/sharded, and the arrays below:
    (the sharded store, the arrays a v2 view shows, the arrays it leaves out)."""
    generate.generate(str(work))
    sharded = Path(work) / "sharded"
    zarr.open_group(sharded / "v2", mode="w")
    made, left_out = extra_arrays(str(sharded))
    shown = [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()] + sorted(made)
    return sharded, shown, left_out


def extra_arrays(root):
    """Arrays beyond generate.py's, each with the codecs a v2 view must map (or refuse)."""
    rng = np.random.default_rng(7)
    made = {}

    def make(path, data, **kwargs):
        arr = zarr.create_array(store=os.path.join(root, path), shape=data.shape, dtype=data.dtype, **kwargs)
        arr[...] = data
        made[path] = data

    floats = rng.random((12, 10)).astype("float32")
    floats[3:5, :] = np.nan
    make("v2/blosc", rng.integers(0, 1000, (16, 12)).astype("int32"), chunks=(4, 4), shards=(8, 12),
         compressors=BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"))
    make("v2/bool", rng.random((10, 10)) > 0.5, chunks=(5, 5), shards=(10, 10), compressors=None, fill_value=False)
    make("v2/nan_fill", floats, chunks=(4, 5), shards=(8, 10), compressors=GzipCodec(level=1), fill_value=np.nan)
    make("v2/crc", rng.integers(0, 100, (9, 8)).astype("uint16"), chunks=(3, 4), shards=(9, 8),
         serializer=BytesCodec(), compressors=[GzipCodec(level=1), Crc32cCodec()])
    make("v2/forder", rng.integers(0, 100, (6, 4)).astype("int16"), chunks=(3, 2), shards=(6, 4),
         filters=[TransposeCodec(order=(1, 0))], compressors=None)
    make("v2/unsharded", rng.integers(0, 1000, (10,)).astype("int64"), chunks=(4,), compressors=GzipCodec(level=1))
    make("v2/unsharded_crc", rng.integers(0, 100, (7, 9)).astype(">u2"), chunks=(3, 4),
         chunk_key_encoding={"name": "v2", "separator": "/"}, compressors=[GzipCodec(level=1), Crc32cCodec()])
    zarr.open_group(os.path.join(root, "xr"), mode="w")
    make("xr/temperature", rng.random((6, 8)).astype("float32"), chunks=(2, 4), shards=(6, 8),
         compressors=GzipCodec(level=1), dimension_names=("time", "lat"))
    make("xr/lat", np.linspace(-80, 80, 8), chunks=(4,), dimension_names=("lat",))
    left_out = {"v2/two_compressors": dict(chunks=(2,), shards=(4,),
                                           compressors=[GzipCodec(level=1), GzipCodec(level=2)])}
    for path, kwargs in left_out.items():
        zarr.create_array(store=os.path.join(root, path), shape=(8,), dtype="uint8", **kwargs)[...] = np.arange(8, dtype="uint8")
    return made, sorted(left_out)
