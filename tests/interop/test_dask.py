"""A real Dask cluster writes a sharded dataset through shardfs: a scheduler and `dask worker`
processes, each started under `unshare -m` (a mount namespace of its own, as a machine has), each
with its own daemon mounted at the same path by the plugin (`shardfs.dask.Mount`), against s3s-fs.
The client (tests/interop/dask_job.py, in a namespace of its own too) writes an xarray Dataset
whose Dask chunks are aligned to the array's chunks but not to its shards, with
``to_zarr(region=...)``: every shard is written by several workers at once.

- a worker that joins after the plugin was registered mounts too;
- the workers close (each unmount commits): the bucket, read directly, holds every chunk exactly,
  and nothing of the daemons' turn-taking is left in it;
- the control: the same job written by zarr-python straight to the bucket. What it loses is
  printed, not asserted (docs/semantics.md, "Many machines", records it).

Runs in ``target/venv``: ``target/venv/bin/python -m pytest tests/interop/test_dask.py``.
"""

import contextlib
import os
import subprocess
import sys
import time

import numpy as np
import obstore
import pytest
import zarr
from conftest import ROOT
from dask.distributed import Client

from object_stores import S3sFs, serving, url, zarr_store
from ports import free_port, wait_for_port

sys.path.insert(0, str(ROOT / "tests/interop"))
import dask_job  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with serving(S3sFs(), tmp_path_factory.mktemp("s3s-env")) as server:
        yield server


def own_namespace(command):
    """`command` in a mount namespace of its own, whose mounts nothing outside sees."""
    return ["unshare", "--mount", "--propagation", "private", *command]


class Cluster:
    """A scheduler and workers, each a process of its own; the workers in their own namespaces."""

    def __init__(self, work):
        self.work, self.port = work, free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        self.processes = []
        self.spawn([f"{VENV_BIN}/dask", "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                    "--no-dashboard"], "scheduler")
        wait_for_port(self.port, "the Dask scheduler", self.processes[0])

    def spawn(self, command, name):
        log = open(self.work / f"{name}.log", "w")
        self.processes.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def add_worker(self):
        n = len(self.processes)
        self.spawn(own_namespace([f"{VENV_BIN}/dask", "worker", self.address, "--nthreads", "2", "--no-nanny",
                                  "--no-dashboard", "--name", f"w{n}"]), f"worker{n}")

    def workers(self):
        return self.processes[1:]

    def stop(self):
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def make_template(s3, prefix):
    """The sharded array the job writes into, made in the bucket directly (its documents only)."""
    ds = dask_job.dataset()
    encoding = {"v": {"chunks": dask_job.CHUNKS, "shards": dask_job.SHARDS, "compressors": None}}
    ds.to_zarr(zarr_store(s3, prefix), compute=False, encoding=encoding, zarr_format=3, consolidated=False,
              safe_chunks=False)


def lost(s3, prefix):
    """The chunks (by grid position) the bucket does not hold exactly as written."""
    got = zarr.open_array(zarr_store(s3, prefix), path="v", mode="r")[...]
    want = dask_job.expected()
    ci, cj = dask_job.CHUNKS
    return [(i, j) for i in range(got.shape[0] // ci) for j in range(got.shape[1] // cj)
            if not np.array_equal(got[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj], want[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj])]


def run_job(cluster, s3, prefix, mountpoint, how):
    subprocess.run(own_namespace([sys.executable, ROOT / "tests/interop/dask_job.py", cluster.address,
                                  url(s3, prefix), s3.endpoint, str(mountpoint), how]),
                   env=cluster.env, check=True, timeout=300)


def close_workers(cluster):
    """Each worker closes as a machine leaving the cluster does; its plugin unmounts, committing."""
    with Client(cluster.address) as client:
        client.retire_workers(close_workers=True)
    for worker in cluster.workers():
        worker.wait(timeout=120)


def test_a_dask_cluster_writes_partial_shards_through_the_plugin_and_loses_nothing(s3, tmp_path):
    make_template(s3, "dask")
    cluster = Cluster(tmp_path)
    mountpoint = tmp_path / "data"
    try:
        for _ in range(3):
            cluster.add_worker()
        with Client(cluster.address) as client:
            client.wait_for_workers(3, timeout=60)
        run_job(cluster, s3, "dask", mountpoint, "shardfs")
        # A worker joining now mounts too.
        cluster.add_worker()
        with Client(cluster.address) as client:
            client.wait_for_workers(4, timeout=60)
            deadline = time.monotonic() + 30
            while not all(client.run(os.path.ismount, str(mountpoint)).values()):
                assert time.monotonic() < deadline, client.run(os.path.ismount, str(mountpoint))
                time.sleep(0.2)
        close_workers(cluster)
    finally:
        cluster.stop()
    assert [w.returncode for w in cluster.workers()] == [0] * 4
    assert lost(s3, "dask") == []
    left = [m["path"] for batch in obstore.list(s3.objects(), prefix="dask/__shardfs/") for m in batch]
    # A takeover's `doubt-` markers stay for a delta's lifetime (docs/semantics.md).
    assert [k for k in left if "/doubt-" not in k] == []


def test_control_zarr_python_writing_the_same_job_straight_to_the_bucket(s3, tmp_path):
    make_template(s3, "control")
    cluster = Cluster(tmp_path)
    try:
        for _ in range(3):
            cluster.add_worker()
        with Client(cluster.address) as client:
            client.wait_for_workers(3, timeout=60)
        run_job(cluster, s3, "control", tmp_path / "unused", "direct")
    finally:
        with contextlib.suppress(Exception):
            close_workers(cluster)
        cluster.stop()
    missing = lost(s3, "control")
    total = (dask_job.SHAPE[0] // dask_job.CHUNKS[0]) * (dask_job.SHAPE[1] // dask_job.CHUNKS[1])
    print(f"control: zarr-python straight to the bucket lost {len(missing)} of {total} chunks")
