"""`shardfs mount --metrics-address` and `shardfs status`, on a local store and on S3 (moto): the
endpoint's text parses with the Prometheus project's own parser (prometheus-client), every family
is typed as its samples are named, and the numbers move as the work done says they must: a read
of a chunk file raises the GETs and the bytes read from the store, a written chunk is pending until
its fsync, which raises the commits and the writes to the store, and a lookup of a missing name
counts an ENOENT given. `shardfs status` prints the same numbers; a mount made without the flag
serves none, and says so.

Run: target/venv/bin/python -m pytest tests/interop/test_metrics.py
"""

import contextlib
import os
import subprocess
import urllib.request
from pathlib import Path

import boto3
import numpy as np
import pytest
import zarr
from prometheus_client.parser import text_string_to_metric_families
from zarr.storage import ObjectStore

from object_stores import BUCKET, s3_objects

SHAPE, CHUNKS, SHARDS = (64, 64), (8, 8), (32, 32)


def shardfs(*args):
    return subprocess.run(["shardfs", *map(str, args)], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def mounted(store, mountpoint, *flags):
    """`store` mounted at `mountpoint` with `flags`, unmounted however the block ends."""
    mountpoint.mkdir()
    started = shardfs("mount", store, mountpoint, *flags)
    assert started.returncode == 0, started.stderr
    try:
        yield mountpoint
    finally:
        if shardfs("unmount", mountpoint).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)


def served_at(mountpoint):
    """The metrics URL `shardfs status` names on its first line."""
    status = shardfs("status", mountpoint)
    assert status.returncode == 0, status.stderr
    first = status.stdout.splitlines()[0]
    assert first.startswith(f"# {mountpoint}: served at http://") and first.endswith("/metrics"), first
    return first.split("served at ", 1)[1]


def families(text):
    """The metric families of `text`, by name, each checked to be typed as its samples say."""
    found = {f.name: f for f in text_string_to_metric_families(text)}
    for family in found.values():
        assert family.type != "unknown", f"{family.name}: a sample without its TYPE line"
    return found


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return families(reply.read().decode())


def value(found, family, sample=None, **labels):
    """The sum of the samples of `family` (named `sample`, default the family's own counter or
    gauge sample) whose labels include `labels`."""
    f = found[family]
    name = sample or (family + "_total" if f.type == "counter" else family)
    return sum(s.value for s in f.samples if s.name == name and labels.items() <= s.labels.items())


def requests(found, *kinds, outcome="ok"):
    return sum(value(found, "shardfs_store_requests", kind=k, outcome=outcome) for k in kinds)


def write_array(store):
    data = np.random.default_rng(63).integers(1, 60000, SHAPE, dtype="uint16")
    zarr.create_array(store=store, name="a", shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint16",
                      fill_value=0)[...] = data


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """A sharded array `a` in a local directory or an S3 bucket, as (address, flags, write kinds):
    the kinds of store request a commit writes with."""
    if request.param == "local":
        write_array(tmp_path / "store.zarr")
        return str(tmp_path / "store.zarr"), [], ("put", "write")
    s3_server = request.getfixturevalue("s3_server")
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=BUCKET)
    prefix = f"metrics-{os.getpid()}-{tmp_path.name}"
    write_array(ObjectStore(s3_objects(s3_server.endpoint, prefix)))
    return f"s3://{BUCKET}/{prefix}", ["--endpoint-url", s3_server.endpoint], ("put", "multipart")


def test_the_numbers_move_with_reads_writes_and_errors(store, tmp_path):
    address, flags, write_kinds = store
    # The idle commit held off: a written chunk stays pending until its fsync.
    with mounted(address, tmp_path / "mnt", *flags, "--metrics-address", "127.0.0.1:0",
                 "--commit-idle-ms", "600000") as view:
        url = served_at(view)
        before = scrape(url)

        chunk = (view / "a/c/0/0").read_bytes()
        assert len(chunk) > 0
        read = scrape(url)
        assert requests(read, "get") > requests(before, "get")
        assert value(read, "shardfs_store_received_bytes") >= value(before, "shardfs_store_received_bytes") + len(chunk)
        histogram = read["shardfs_store_request_duration_seconds"]
        count = value(read, "shardfs_store_request_duration_seconds", "shardfs_store_request_duration_seconds_count",
                      kind="get")
        assert count >= requests(read, "get")
        assert value(read, "shardfs_store_request_duration_seconds", "shardfs_store_request_duration_seconds_bucket",
                     kind="get", le="+Inf") == count
        assert {s.labels.get("le") for s in histogram.samples if s.name.endswith("_bucket")} >= {"0.001", "+Inf"}

        # Another chunk of the same shard: its index is known by now.
        assert (view / "a/c/0/1").read_bytes()
        again = scrape(url)
        assert value(again, "shardfs_cache_hits", cache="index") > value(read, "shardfs_cache_hits", cache="index")
        if address.startswith("s3://"):
            assert value(read, "shardfs_cache_misses", cache="fetch") > value(before, "shardfs_cache_misses",
                                                                              cache="fetch")

        with pytest.raises(FileNotFoundError):
            (view / "a/no-such-file").stat()
        missing = scrape(url)
        assert value(missing, "shardfs_errors", errno="ENOENT") >= value(read, "shardfs_errors", errno="ENOENT") + 1

        fd = os.open(view / "a/c/1/1", os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, chunk)
            written = scrape(url)
            assert value(written, "shardfs_chunks_pending") == 1
            assert value(written, "shardfs_pending_bytes") == len(chunk)
            assert value(written, "shardfs_commits", outcome="ok") == value(read, "shardfs_commits", outcome="ok")
            os.fsync(fd)
        finally:
            os.close(fd)
        synced = scrape(url)
        assert value(synced, "shardfs_commits", outcome="ok") == value(written, "shardfs_commits", outcome="ok") + 1
        assert value(synced, "shardfs_chunks_pending") == 0
        assert requests(synced, *write_kinds) > requests(written, *write_kinds)
        assert value(synced, "shardfs_store_sent_bytes") > value(written, "shardfs_store_sent_bytes")
        assert (view / "a/c/1/1").read_bytes() == chunk

        status = shardfs("status", view)
        assert status.returncode == 0, status.stderr
        shown = families(status.stdout)
        assert set(shown) == set(synced)
        assert value(shown, "shardfs_commits", outcome="ok") == value(synced, "shardfs_commits", outcome="ok")
        assert value(shown, "shardfs_errors", errno="ENOENT") == value(synced, "shardfs_errors", errno="ENOENT")
        assert requests(shown, *write_kinds) == requests(synced, *write_kinds)


def test_a_mount_without_the_flag_serves_no_metrics_and_status_says_so(tmp_path):
    write_array(tmp_path / "store.zarr")
    with mounted(tmp_path / "store.zarr", tmp_path / "mnt", "--read-only") as view:
        assert (view / "a/c/0/0").read_bytes()
        status = shardfs("status", view)
        assert status.returncode != 0
        assert "without --metrics-address" in status.stderr and status.stderr.count("\n") == 1, status.stderr
    status = shardfs("status", tmp_path)
    assert status.returncode != 0 and "not a shardfs mount" in status.stderr, status.stderr


def test_an_address_that_cannot_be_listened_on_refuses_the_mount_in_one_line(tmp_path):
    write_array(tmp_path / "store.zarr")
    (tmp_path / "mnt").mkdir()
    started = shardfs("mount", tmp_path / "store.zarr", tmp_path / "mnt", "--metrics-address", "192.0.2.1:1")
    assert started.returncode != 0
    assert "--metrics-address 192.0.2.1:1" in started.stderr and started.stderr.count("\n") == 1, started.stderr
    assert not os.path.ismount(tmp_path / "mnt")
