"""Arrays that change while mounted: the view must follow every zarr.json change at once (through
the view) or within one watcher pass (underneath), and never serve old geometry.

Through a writable mount, zarr-python appends rows after writing (the chunk directories were in
use before the resize), shrinks then grows then writes, and resizes smaller then larger with reads
between; then a loop of 100 appends with a full read of the array after each; after unmount
zarr-python and tensorstore read the sharded store directly and must get exactly that data.

Underneath a read-only mount whose chunk files and listings were read warm first, zarr-python
grows, shrinks and re-creates arrays (other chunk and shard shapes; sharded -> unsharded ->
sharded): each time the view must serve exactly the new array within a few watcher passes, and
never the fill value where data is.

Runs in target/venv (zarr-python 3.1.6, tensorstore); one case alone:
``target/venv/bin/python -m pytest tests/interop/test_changes.py -k underneath``.
"""

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import BINARY

APPENDS = 100
# The watcher passes once a second; a change underneath must show within this long.
SETTLE = 3.0


def chunk_files(root):
    """The files below `root` but its zarr.json documents, relative to it."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file() and p.name != "zarr.json"}


def expected_chunk_files(arr):
    """The chunk keys an unsharded twin of `arr` would hold: every inner chunk that is not all fill."""
    data, inner = arr[...], arr.chunks
    keys = set()
    for idx in np.ndindex(*[-(-s // c) for s, c in zip(arr.shape, inner)]):
        block = data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, inner))]
        if not (block == arr.fill_value).all():
            keys.add(os.path.join("c", *map(str, idx)))
    return keys


def create(path, shape, chunks, shards, dtype="uint16"):
    return zarr.create_array(store=path, shape=shape, chunks=chunks, shards=shards, dtype=dtype,
                             compressors=zarr.codecs.GzipCodec(level=1), fill_value=0, overwrite=True)


def rows(n, width, start):
    return (np.arange(n * width, dtype="uint16").reshape(n, width) + start).astype("uint16")


def assert_stored(store, expected):
    """After the unmount: zarr-python and tensorstore read each array from the sharded store
    exactly, and `shardfs check` passes."""
    for path, data in expected.items():
        stored = zarr.open_array(store / path, mode="r")
        assert stored.shards is not None, f"{path} stays sharded"
        np.testing.assert_array_equal(stored[...], data, err_msg=f"zarr-python {path}")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(store / path)}}
        np.testing.assert_array_equal(ts.open(spec, open=True, read=True).result().read().result(), data,
                                      err_msg=f"tensorstore {path}")
    result = subprocess.run([BINARY, "check", store], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-300:]


def test_an_append_after_writes_works_through_the_view(tmp_path):
    store = tmp_path / "store"
    zarr.open_group(store, mode="w")
    create(store / "temps", (64, 64), (8, 8), (32, 32))[...] = 3
    want = np.full((64, 64), 3, dtype="uint16")
    want[0:16, 0:16] = 7
    extra = rows(8, 64, 100)
    with shardfs.mount(store) as mnt:
        a = zarr.open_array(Path(mnt) / "temps", mode="r+")
        a[0:16, 0:16] = 7
        a.append(extra, axis=0)
        want = np.concatenate([want, extra])
        np.testing.assert_array_equal(zarr.open_array(Path(mnt) / "temps", mode="r")[...], want)
    assert_stored(store, {"temps": want})


def test_resizes_through_the_view_follow_an_unsharded_twin(tmp_path):
    # zarr-python keeps what edge chunks hold beyond a shrink, so the expectation is an unsharded
    # twin that zarr-python changes the same way.
    store, twin_path = tmp_path / "store", tmp_path / "twin"
    zarr.open_group(store, mode="w")
    create(store / "resized", (64, 64), (8, 8), (32, 32))[...] = 5
    twin = zarr.create_array(store=twin_path, shape=(64, 64), chunks=(8, 8), dtype="uint16",
                             compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
    twin[...] = 5
    with shardfs.mount(store) as mnt:
        view = Path(mnt) / "resized"
        r = zarr.open_array(view, mode="r+")
        r[...]
        for step, change in [
            ("shrunk", lambda a: a.resize((20, 20))),
            ("grown again", lambda a: a.resize((80, 72))),
            ("written in the grown region", lambda a: a.__setitem__((slice(60, 80), slice(40, 72)), 9)),
            ("smaller again", lambda a: a.resize((30, 30))),
            # Long enough for the idle commit (2 s): the chunks zarr-python deleted before the
            # shrink must stay deleted when the array grows again.
            ("left to commit", lambda a: time.sleep(1.5)),
            ("larger again", lambda a: a.resize((64, 64))),
            ("written across the old and new bounds", lambda a: a.__setitem__((slice(20, 50), slice(20, 50)), 4)),
        ]:
            change(r)
            change(twin)
            got = zarr.open_array(view, mode="r")
            assert got.shape == twin.shape, step
            np.testing.assert_array_equal(got[...], twin[...], err_msg=step)
            assert chunk_files(view) == chunk_files(twin_path), step
    assert_stored(store, {"resized": twin[...]})


def test_appends_through_the_view_each_read_back_exactly(tmp_path):
    store = tmp_path / "store"
    zarr.open_group(store, mode="w")
    create(store / "grown", (10, 64), (8, 8), (32, 32))
    want = np.zeros((10, 64), dtype="uint16")
    with shardfs.mount(store) as mnt:
        g = zarr.open_array(Path(mnt) / "grown", mode="r+")
        bad = []
        for i in range(APPENDS):
            block = rows(3, 64, i)
            g.append(block, axis=0)
            want = np.concatenate([want, block])
            if not np.array_equal(zarr.open_array(Path(mnt) / "grown", mode="r")[...], want):
                bad.append(i)
        assert not bad, f"wrong after appends {bad[:5]}"
    assert_stored(store, {"grown": want})


def view_matches(mnt, store, path):
    """None when the view of `path` reads exactly what the store holds, with exactly its chunk
    files; else what differs."""
    direct = zarr.open_array(store / path, mode="r")
    want = direct[...]
    view = zarr.open_array(Path(mnt) / path, mode="r")
    if view.shape != want.shape:
        return f"shape {view.shape}, want {want.shape}"
    got = view[...]
    if not np.array_equal(got, want):
        fill = int(((got == 0) & (want != 0)).sum())
        return f"{int((got != want).sum())} elements differ (fill value where data is: {fill})"
    files, want_files = chunk_files(Path(mnt) / path), expected_chunk_files(direct)
    if files != want_files:
        return f"chunk files: extra {sorted(files - want_files)[:3]}, missing {sorted(want_files - files)[:3]}"
    return None


def assert_served_within_settle(mnt, store, path, step):
    """Polls the view of `path` until it matches the store, for SETTLE at most."""
    deadline = time.time() + SETTLE
    while True:
        try:
            wrong = view_matches(mnt, store, path)
        except Exception as e:  # noqa: BLE001 - until the watcher's pass, a read may be cut short
            wrong = repr(e)
        if wrong is None:
            return
        assert time.time() <= deadline, f"{step}: {wrong}"
        time.sleep(0.1)


def warm(mnt, path):
    """Reads every chunk file and listing of `path` through the view, so the kernel caches them
    (errors are for the checks that follow to find)."""
    try:
        for p in (Path(mnt) / path).rglob("*"):
            if p.is_file():
                p.read_bytes()
        zarr.open_array(Path(mnt) / path, mode="r")[...]
    except Exception:  # noqa: BLE001 - the checks after it say what is wrong
        pass


@pytest.fixture
def changing(tmp_path):
    """A store of three sharded arrays, mounted read-only, every chunk read warm."""
    store = tmp_path / "store"
    zarr.open_group(store, mode="w")
    arrays = {"a": create(store / "a", (64, 64), (8, 8), (32, 32)), "b": create(store / "b", (64, 64), (8, 8), (32, 32)),
              "c": create(store / "c", (48, 48), (8, 8), (16, 16))}
    for value, array in enumerate(arrays.values(), start=1):
        array[...] = value
    with shardfs.mount(store, read_only=True) as mnt:
        for path in arrays:
            warm(mnt, path)
        yield store, mnt, arrays


def test_underneath_a_grown_then_shrunk_array_is_served_as_it_is(changing):
    store, mnt, arrays = changing
    a = arrays["a"]
    a.resize((96, 64))
    a[64:96] = rows(32, 64, 50)
    assert_served_within_settle(mnt, store, "a", "grown: the new rows served (never the fill value)")
    warm(mnt, "a")
    a.resize((40, 40))
    assert_served_within_settle(mnt, store, "a", "shrunk: chunks beyond the bounds gone")


def test_underneath_an_array_re_created_with_other_shapes_is_served_as_it_is(changing):
    store, mnt, _ = changing
    create(store / "b", (64, 64), (4, 16), (16, 32))[...] = rows(64, 64, 7)
    assert_served_within_settle(mnt, store, "b", "re-created with other chunk and shard shapes")
    warm(mnt, "b")
    create(store / "b", (64, 64), (16, 8), (32, 64))[...] = rows(64, 64, 900)
    assert_served_within_settle(mnt, store, "b", "re-created again with yet other shapes")


def test_underneath_sharded_then_unsharded_then_sharded_is_served_as_it_is(changing):
    store, mnt, _ = changing
    unsharded = zarr.create_array(store=store / "c", shape=(48, 48), chunks=(8, 8), dtype="uint16",
                                  compressors=zarr.codecs.GzipCodec(level=1), fill_value=0, overwrite=True)
    unsharded[...] = rows(48, 48, 3)
    assert_served_within_settle(mnt, store, "c", "sharded -> unsharded")
    warm(mnt, "c")
    create(store / "c", (48, 48), (8, 8), (16, 16))[...] = rows(48, 48, 11)
    assert_served_within_settle(mnt, store, "c", "unsharded -> sharded")
