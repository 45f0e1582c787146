"""The peers read and write the view: zarr-python 3 and tensorstore write every layout of
tests/data/generate.py afresh, with their unsharded twins, and shardfs mounts the sharded store.
For every array, both peers open the view as a plain unsharded array and read exactly the data
written, and the view's chunk files are exactly the twin's (the non-empty inner chunks inside the
array bounds). Through a writable mount of a copy, both peers write (partial overwrites, regions
set to fill value, which deletes chunks), `cp -r` copies an unsharded array in and zarr-python
edits attributes and resizes; after the unmount the sharded store, read by both peers directly,
holds exactly that data, `shardfs check` passes, and `shardfs compact` frees the space the appends
left without changing a value. With ``--shard-new`` an array created through the view is stored
sharded; and zarr-python rewriting every shard underneath a read-only mount never makes a read
through it a mix of versions.

Runs in ``target/venv`` (zarr-python 3.1.6) and again in ``target/venv-newest`` (the newest
releases, pinned in scripts/setup.sh). One part alone:
``target/venv/bin/python -m pytest tests/interop/test_peers.py -k rewrite``.
"""

import gzip
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import BINARY, ROOT

from peers import chunk_files, peers_write_regions

sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata")
ARRAYS = [path for path, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]


def ts_read(path):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec, open=True, read=True).result().read().result()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The sharded store and its unsharded twin, as the peers write them."""
    work = tmp_path_factory.mktemp("peers")
    generate.generate(str(work))
    return SimpleNamespace(sharded=work / "sharded", twin=work / "unsharded", work=work)


@pytest.fixture(scope="module")
def view(stores):
    with shardfs.mount(stores.sharded) as mnt:
        yield Path(mnt)


@pytest.mark.parametrize("path", ARRAYS)
def test_both_peers_read_each_array_of_the_view_exactly(stores, view, path):
    expected = zarr.open_array(stores.sharded / path, mode="r")[...]
    shown = zarr.open_array(view / path, mode="r")
    assert "sharding_indexed" not in str(shown.metadata.codecs), "zarr-python sees a sharded array"
    assert np.array_equal(shown[...], expected, equal_nan=True), "zarr-python"
    assert np.array_equal(ts_read(view / path), expected, equal_nan=True), "tensorstore"
    got, want = chunk_files(view / path), chunk_files(stores.twin / path)
    assert got == want, f"chunk files: extra {sorted(got - want)[:5]} missing {sorted(want - got)[:5]}"


def test_consolidated_metadata_describes_unsharded_arrays(view):
    members = dict(zarr.open_group(view, mode="r", use_consolidated=True).members(max_depth=None))
    arrays = [a for a in members.values() if isinstance(a, zarr.Array)]
    assert len(members) >= len(ARRAYS)
    assert all("sharding_indexed" not in str(a.metadata.codecs) for a in arrays)


@pytest.fixture(scope="module")
def written(stores):
    """A copy of the sharded store after both peers wrote through a writable mount of it; the
    data each array must now hold."""
    sharded = stores.work / "written"
    shutil.copytree(stores.sharded, sharded)
    with shardfs.mount(sharded) as mnt:
        expected = peers_write_regions(mnt, ["zp/gzip_crc_end", "zp/zstd_start", "zp/keys/v2_dot", "zp/raw_nocrc",
                                             "zp/nested"], ["ts/zstd_crc", "ts/gzip_start_nocrc"])
        subprocess.run(["cp", "-r", stores.twin / "zp/nested", Path(mnt) / "zp/copied"], check=True)
        expected["zp/copied"] = zarr.open_array(stores.twin / "zp/nested", mode="r")[...]
        # Metadata through the view: attributes and a resize land in the stored (sharded) zarr.json.
        edited = zarr.open_array(Path(mnt) / "zp/raw_nocrc", mode="r+")
        edited.attrs["edited"] = "through the view"
        edited.resize((20,))
        expected["zp/raw_nocrc"] = expected["zp/raw_nocrc"][:20]
        assert zarr.open_array(Path(mnt) / "zp/raw_nocrc", mode="r").shape == (20,), "resized through the view"
        mnt = Path(mnt)
    assert not os.path.ismount(mnt)
    return SimpleNamespace(store=sharded, expected=expected)


@pytest.fixture(scope="module")
def compacted(written):
    """The written store after `shardfs check` and `shardfs compact`: their outputs."""
    checked = subprocess.run([BINARY, "check", written.store], capture_output=True, text=True)
    compact = subprocess.run([BINARY, "compact", written.store], capture_output=True, text=True)
    return SimpleNamespace(checked=checked, compact=compact)


WRITTEN = ["zp/gzip_crc_end", "zp/zstd_start", "zp/keys/v2_dot", "zp/raw_nocrc", "zp/nested", "ts/zstd_crc",
           "ts/gzip_start_nocrc", "zp/copied"]


@pytest.mark.parametrize("path", WRITTEN)
def test_the_sharded_store_holds_what_the_peers_wrote(written, path):
    data = written.expected[path]
    assert np.array_equal(zarr.open_array(written.store / path, mode="r")[...], data, equal_nan=True), "zarr-python"
    if path.startswith(("ts/", "zp/gzip")):
        assert np.array_equal(ts_read(written.store / path), data, equal_nan=True), "tensorstore"


def test_shardfs_check_passes_after_the_writes(compacted):
    assert compacted.checked.returncode == 0, compacted.checked.stdout[-500:]


def test_compact_frees_the_space_the_appends_left(written, compacted):
    assert compacted.compact.returncode == 0 and "bytes freed" in compacted.compact.stdout, \
        compacted.compact.stdout[-300:] + compacted.compact.stderr[-300:]
    info = subprocess.run([BINARY, "info", written.store], capture_output=True, text=True).stdout
    unused = [line.split()[4] for line in info.splitlines()[1:] if not line.startswith("zp/nested")]
    assert all(u == "0" for u in unused), info
    result = subprocess.run([BINARY, "check", written.store], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-500:]


@pytest.mark.parametrize("path", WRITTEN)
def test_compaction_changes_no_value(written, compacted, path):
    stored = zarr.open_array(written.store / path, mode="r")[...]
    assert np.array_equal(stored, written.expected[path], equal_nan=True)


def test_a_stored_document_keeps_its_sharding_and_takes_the_edits(written):
    stored = zarr.open_array(written.store / "zp/raw_nocrc", mode="r")
    assert stored.shards is not None and stored.shape == (20,) and stored.attrs["edited"] == "through the view"


def test_an_array_made_through_the_view_with_shard_new_is_stored_sharded(tmp_path):
    store = tmp_path / "fresh"
    zarr.open_group(store, mode="w")
    data = np.arange(24 * 20, dtype="int32").reshape(24, 20)
    with shardfs.mount(store, shard_new=[4, 2]) as mnt:
        created = zarr.create_array(store=str(Path(mnt) / "made"), shape=data.shape, chunks=(3, 5), dtype="int32",
                                    compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
        created[...] = data
        shown = zarr.open_array(Path(mnt) / "made", mode="r")
        assert "sharding_indexed" not in str(shown.metadata.codecs), "the view shows the array as created"
    stored = zarr.open_array(store / "made", mode="r")
    assert (stored.shards, stored.chunks) == ((12, 10), (3, 5)), "4x2 inner chunks per shard"
    assert np.array_equal(stored[...], data)


def test_a_store_rewritten_underneath_is_read_one_whole_version_at_a_time(tmp_path):
    """zarr-python rewrites every shard of an array underneath a read-only mount, again and again,
    while chunk files are read through the view: each read is some whole version of its chunk (or
    a clean EIO while a shard is half-written), and after the cache timeout the view serves the
    last version."""
    store = tmp_path / "rewritten"
    arr = zarr.create_array(store=str(store), shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="uint16",
                            compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
    arr[...] = 1
    counts, last, seen = {"whole": 0, "eio": 0, "wrong": 0}, [1], set()
    stop = threading.Event()

    def rewrite():
        version = 1
        while not stop.is_set():
            version = version % 200 + 1
            arr[...] = version
            last[0] = version

    with shardfs.mount(store, read_only=True) as mnt:
        writer = threading.Thread(target=rewrite)
        writer.start()
        try:
            deadline = time.time() + 4
            while time.time() < deadline:
                for i in range(8):
                    for j in range(8):
                        try:
                            raw = (Path(mnt) / "c" / str(i) / str(j)).read_bytes()
                        except OSError:
                            counts["eio"] += 1
                            continue
                        try:
                            values = np.frombuffer(gzip.decompress(raw), dtype="<u2")
                            whole = values.size == 64 and (values == values[0]).all() and 1 <= values[0] <= 200
                        except (OSError, EOFError, ValueError):
                            whole = False
                        counts["whole" if whole else "wrong"] += 1
                        if whole:
                            seen.add(int(values[0]))
        finally:
            stop.set()
            writer.join()
        time.sleep(1.5)
        final = zarr.open_array(mnt, mode="r")[...]
    print(f"external rewrite reads: {counts}, {len(seen)} versions seen")
    assert counts["wrong"] == 0 and len(seen) > 1, f"{counts}, {len(seen)} versions seen"
    assert (final == last[0]).all(), f"want {last[0]}, got {np.unique(final)}"
