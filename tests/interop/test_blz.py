"""BLZ data through the view: zarr-python 3 and tensorstore read Bloscpack files and bcolz
directories through the Zarr v3 view, and zarr-python 2.18 through the Zarr v2 view.

tests/data/generate_blz.py --all (run by target/venv-blz's Python: bloscpack 0.16.0 and
bcolz-zipline) writes every combination of codec (lz4, zstd, zlib, blosclz), shuffle (none, byte,
bit), checksum (none, adler32, sha256) and offsets (with, without) in 1-D and 2-D Bloscpack files,
with and without a short last chunk, carrays of every codec and shuffle, a zipline-like ctable with
attributes, and arrays the view must refuse (appended to without updating the metadata, a
structured dtype, chunks that do not hold whole rows, an object carray). Every array must read
exactly what the writer was given, with its shape, chunks, fill value and attributes; the refused
ones must be absent and named in the log; a write fails with EROFS; a Bloscpack chunk whose sha256
does not match fails to read (never a silent fill value) while its neighbours read.

Runs in target/venv (zarr-python 3.1.6, tensorstore); one case alone:
``target/venv/bin/python -m pytest tests/interop/test_blz.py -k tensorstore``.
"""

import errno
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import ROOT, zarr2_reads

BLZ_PYTHON = ROOT / "target/venv-blz/bin/python"
DAMAGED_SOURCE = "all/lz4_none_sha256_offsets"

def flip_chunk_byte(path, chunk):
    """Flips one byte inside chunk `chunk` of a Bloscpack file with offsets."""
    with open(path, "r+b") as f:
        header = f.read(32)
        assert header[5] & 1, "the file has offsets"
        meta = 0
        if header[5] & 2:
            meta_header = f.read(32)
            meta = 32 + int.from_bytes(meta_header[16:20], "little") + {0: 0, 1: 4, 6: 32}[meta_header[9]]
        f.seek(32 + meta + 8 * chunk)
        offset = int.from_bytes(f.read(8), "little")
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0xFF]))


class Data:
    """The generated store, what each array must read as, and which arrays are refused."""

    def __init__(self, work: Path):
        self.store, self.expected = work / "store", work / "expected"
        self.arrays = json.loads((self.expected / "arrays.json").read_text())
        self.groups = json.loads((self.expected / "groups.json").read_text())
        self.refused = json.loads((self.expected / "refused.json").read_text())

    def want(self, path):
        return np.load(self.expected / (path.replace("/", "__") + ".npy"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    work = tmp_path_factory.mktemp("blz")
    subprocess.run([BLZ_PYTHON, ROOT / "tests/data/generate_blz.py", work, "--all"], check=True)
    data = Data(work)
    # A copy of a sha256 file with offsets, one byte of its chunk 2 flipped.
    damaged = data.store / "damaged.blp"
    damaged.write_bytes((data.store / (DAMAGED_SOURCE + ".blp")).read_bytes())
    flip_chunk_byte(damaged, 2)
    return data


@pytest.fixture(scope="module")
def view(data, tmp_path_factory):
    """The v3 view, its log in the log file; no --read-only: BLZ mounts are read-only anyway."""
    log = tmp_path_factory.mktemp("blz-log") / "shardfs.log"
    with shardfs.mount(data.store, log_file=log) as mnt:
        yield Path(mnt), log


def test_zarr_python_3_reads_every_array_exactly(data, view):
    mnt, _ = view
    wrong = {}
    for path, meta in sorted(data.arrays.items()):
        try:
            array = zarr.open_array(mnt / path, mode="r")
            same = (np.array_equal(array[...], data.want(path)) and list(array.shape) == meta["shape"]
                    and list(array.chunks) == meta["chunks"] and array.dtype == np.dtype(meta["dtype"])
                    and float(array.fill_value) == float(meta["fill_value"])
                    and dict(array.attrs) == meta["attributes"])
            if not same:
                wrong[path] = "data or metadata differ"
        except Exception as e:  # noqa: BLE001 - every array is reported
            wrong[path] = repr(e)
    assert not wrong and len(data.arrays) >= 100, wrong


def test_tensorstore_reads_every_array_exactly(data, view):
    mnt, _ = view
    wrong = {}
    for path in sorted(data.arrays):
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(mnt / path)}}
        try:
            if not np.array_equal(ts.open(spec, read=True).result().read().result(), data.want(path)):
                wrong[path] = "data differ"
        except Exception as e:  # noqa: BLE001
            wrong[path] = repr(e)
    assert not wrong, wrong


def test_groups_have_their_attributes(data, view):
    mnt, _ = view
    for group, attributes in sorted(data.groups.items()):
        assert dict(zarr.open_group(mnt / group, mode="r").attrs) == attributes, group


def test_refused_arrays_are_not_shown_and_the_log_says_why(data, view):
    mnt, log = view
    for path in data.refused:
        assert not (mnt / path).exists(), path
    lines = log.read_text().splitlines()
    for path in data.refused:
        assert any(path.split("/")[-1] in line and "not shown" in line for line in lines), path


def test_a_write_is_refused_with_erofs(view):
    mnt, _ = view
    with pytest.raises(OSError) as refused:
        (mnt / "new").write_text("x")
    assert refused.value.errno == errno.EROFS


def test_a_chunk_failing_its_sha256_is_an_error_and_its_neighbours_read(data, view):
    mnt, log = view
    bad = zarr.open_array(mnt / "damaged", mode="r")
    want, rows = data.want(DAMAGED_SOURCE), bad.chunks[0]
    with pytest.raises(Exception):
        bad[2 * rows:3 * rows]
    assert np.array_equal(bad[:2 * rows], want[:2 * rows]) and np.array_equal(bad[3 * rows:], want[3 * rows:])
    text = log.read_text()
    assert "damaged.blp" in text and "sha256" in text


def test_zarr_python_2_reads_the_v2_view_exactly(data, shardfs_mount, tmp_path):
    mnt = shardfs_mount(data.store, zarr_format=2)
    result = zarr2_reads(mnt, {path: data.want(path) for path in data.arrays}, tmp_path)
    assert {path: ok for path, ok in result.items() if ok is not True} == {}
    assert set(result) == set(data.arrays)
