"""A pytest fixture, registered by installing shardfs (the ``pytest11`` entry point):

    def test_reads_a_chunk(shardfs_mount):
        view = shardfs_mount("tests/data/store", read_only=True)
        assert (Path(view) / "array/c/0/0").read_bytes() == expected

Each call mounts a store (options as for :func:`shardfs.mount`) at a new temporary directory and
returns its path; every mount is unmounted when the test ends, whatever its outcome.
"""

import contextlib

import pytest

import shardfs


@pytest.fixture
def shardfs_mount():
    with contextlib.ExitStack() as mounts:
        yield lambda store, mountpoint=None, **options: mounts.enter_context(
            shardfs.mount(store, mountpoint, **options))
