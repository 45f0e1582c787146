"""The Dask client of tests/interop/test_dask.py, run in a mount namespace of its own (`unshare -m`)
as a machine of its own would be:

    python dask_job.py SCHEDULER URL ENDPOINT MOUNTPOINT shardfs|direct

`shardfs`: the README's example. The plugin mounts URL at MOUNTPOINT on every worker, this machine
mounts it too (xarray opens the array here and writes from the workers), and an xarray Dataset
whose Dask chunks are aligned to the array's chunks but not to its shards is written with
``to_zarr(region=...)``. `direct`: the control, the same job written by zarr-python straight to the
bucket (obstore), which must be told ``safe_chunks=False`` to write partial shards at all. Prints
nothing; the test reads the bucket.
"""

import sys

import dask.array as da
import numpy as np
import shardfs
import shardfs.dask
import xarray as xr
from dask.distributed import Client
from obstore.store import S3Store
from zarr.storage import ObjectStore

SHAPE, CHUNKS, SHARDS, BLOCKS = (256, 256), (16, 16), (128, 128), (48, 80)


def expected():
    return np.arange(SHAPE[0] * SHAPE[1], dtype="float32").reshape(SHAPE)


def dataset():
    return xr.Dataset({"v": (("y", "x"), da.from_array(expected(), chunks=BLOCKS))})


def bucket_store(endpoint, prefix):
    return ObjectStore(S3Store("interop", prefix=prefix, endpoint=endpoint, region="us-east-1",
                               access_key_id="test", secret_access_key="test", client_options={"allow_http": True}))


def main(scheduler, url, endpoint, mountpoint, how):
    client = Client(scheduler)
    region = {"y": slice(0, SHAPE[0]), "x": slice(0, SHAPE[1])}
    if how == "shardfs":
        client.register_plugin(shardfs.dask.Mount(url, mountpoint, endpoint_url=endpoint))
        with shardfs.mount(url, mountpoint, endpoint_url=endpoint) as view:
            dataset().to_zarr(view, region=region, mode="r+", consolidated=False)
    else:
        prefix = url.split("/", 3)[3]
        dataset().to_zarr(bucket_store(endpoint, prefix), region=region, mode="r+", consolidated=False,
                          safe_chunks=False)
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
