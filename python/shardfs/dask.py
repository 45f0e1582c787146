"""Dask: mount a store on every worker of a cluster, so that a job writes chunk files that each
worker's own daemon commits into the shards. Workers on many machines writing chunks of the same
shards lose nothing (their daemons take turns through the store; see docs/semantics.md, "Many
machines").

    from dask.distributed import Client
    import shardfs.dask

    client = Client("tcp://scheduler:8786")
    client.register_plugin(shardfs.dask.Mount("s3://bucket/data.zarr", "/mnt/data"))
    dataset.to_zarr("/mnt/data", region="auto", mode="r+")   # chunk-aligned, shards need not be

The plugin mounts when a worker starts, on the workers there now and on every worker that joins
later, and unmounts when the worker closes: the unmount commits every pending write and returns
once it is stored, so a job whose workers closed is in the store. Each worker needs a mount
namespace of its own, as a machine has: one worker process per machine, or each started under
``unshare -m``. A mount point where something is mounted already is refused, loudly, rather than
shared between two workers that would unmount it under each other.
"""

import os

from distributed.diagnostics.plugin import WorkerPlugin

import shardfs

__all__ = ["Mount"]


class Mount(WorkerPlugin):
    """Mounts ``store`` at ``mountpoint`` on each worker, with ``options`` as
    :func:`shardfs.mount` takes them (``endpoint_url=...``, ``commit_idle_ms=...``)."""

    def __init__(self, store, mountpoint, **options):
        self.store, self.mountpoint, self.options = str(store), str(mountpoint), options
        # One plugin per mount point: registering it again replaces it, not adds a second mount.
        self.name = f"shardfs-mount-{self.mountpoint}"
        self._mounted = None

    def setup(self, worker):
        if os.path.ismount(self.mountpoint):
            raise shardfs.MountError(f"{self.mountpoint}: something is mounted there already (another worker "
                                     "in this mount namespace?); start each worker under `unshare -m`")
        os.makedirs(self.mountpoint, exist_ok=True)
        mounted = shardfs.mount(self.store, self.mountpoint, **self.options)
        mounted.__enter__()
        self._mounted = mounted

    def teardown(self, worker):
        mounted, self._mounted = self._mounted, None
        if mounted is not None:
            mounted.__exit__(None, None, None)

    def __getstate__(self):
        # Sent to the workers before it mounts anything: the mount itself stays where it is.
        return {"store": self.store, "mountpoint": self.mountpoint, "options": self.options, "name": self.name}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._mounted = None
