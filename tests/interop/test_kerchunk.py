"""kerchunk references mounted as the store they describe, with the field's own writers and readers:
h5py writes HDF5 files, kerchunk (SingleHdf5ToZarr, refs_to_dataframe) makes JSON and parquet
references to them, and zarr-python reads through the mount exactly what h5py reads, and each
file exactly the bytes fsspec's ReferenceFileSystem reads for its key. Hostile reference sets
read EIO for the keys concerned and nothing else.
"""

import contextlib
import errno
import json
import shutil
from pathlib import Path

import fsspec
import h5py
import numpy as np
import pytest
import zarr
from kerchunk.df import refs_to_dataframe
from kerchunk.hdf import SingleHdf5ToZarr

from conftest import read_errno
from shardfs import MountError

DATASETS = ("temp", "x", "flag", "names")


@pytest.fixture(scope="session")
def hdf5(tmp_path_factory):
    """An HDF5 file (chunked and deflated, contiguous, scalar, small enough to inline) and
    kerchunk's references to it, as JSON and as parquet (four rows to a record file, so that
    arrays span several)."""
    work = tmp_path_factory.mktemp("kerchunk")
    with h5py.File(work / "data.h5", "w") as f:
        f.attrs["title"] = "shardfs kerchunk test"
        temp = f.create_dataset("temp", data=np.arange(100 * 60, dtype="f4").reshape(100, 60) / 7,
                                chunks=(32, 25), compression="gzip", compression_opts=4)
        temp.attrs["units"] = "K"
        f.create_dataset("x", data=np.arange(60, dtype="i4"))
        f.create_dataset("flag", data=np.int8(7))
        f.create_dataset("names", data=np.arange(12, dtype="<i8").reshape(3, 4), chunks=(1, 4))
    with fsspec.open(str(work / "data.h5"), "rb") as inf:
        refs = SingleHdf5ToZarr(inf, "data.h5", inline_threshold=100).translate()
    (work / "refs.json").write_text(json.dumps(refs))
    refs_to_dataframe(refs, str(work / "refs.parq"), record_size=4)
    return work, refs


def h5py_arrays(path):
    with h5py.File(path) as f:
        return {name: f[name][()] for name in DATASETS}, {k: f.attrs[k] for k in f.attrs}


def assert_reads_as_h5py(view, h5):
    expected, attrs = h5py_arrays(h5)
    group = zarr.open_group(view, mode="r", zarr_format=2)
    assert dict(group.attrs) == attrs
    for name in DATASETS:
        got = group[name][...]
        assert got.dtype == expected[name].dtype, name
        np.testing.assert_array_equal(got, expected[name], err_msg=name)


def assert_files_as_fsspec(view, fo):
    """Every file of the mount holds the bytes fsspec reads for its key, and every key fsspec
    finds is a file of the mount. fsspec takes relative URLs from the working directory, and
    shardfs from the reference set's: the same here."""
    with contextlib.chdir(Path(fo).parent):
        fs = fsspec.filesystem("reference", fo=fo, remote_protocol="file")
        mapper = fs.get_mapper("")
        files = {str(p.relative_to(view)) for p in Path(view).rglob("*") if p.is_file()}
        assert files == set(mapper.keys())
        for key in files:
            assert (Path(view) / key).read_bytes() == mapper[key], key


@pytest.mark.parametrize("layout", ["refs.json", "refs.parq"])
def test_references_read_as_h5py_reads_the_file(hdf5, shardfs_mount, layout):
    work, _ = hdf5
    view = shardfs_mount(work / layout)
    assert_reads_as_h5py(view, work / "data.h5")
    assert_files_as_fsspec(view, str(work / layout))


def test_json_version_0_and_templates_read_alike(hdf5, shardfs_mount, tmp_path):
    work, refs = hdf5
    shutil.copy(work / "data.h5", tmp_path / "data.h5")
    v0 = {key: value for key, value in refs["refs"].items()}
    (tmp_path / "v0.json").write_text(json.dumps(v0))
    templated = {"version": 1, "templates": {"u": str(tmp_path)}, "refs": {
        key: ["{{u}}/" + value[0], *value[1:]] if isinstance(value, list) else value
        for key, value in refs["refs"].items()}}
    (tmp_path / "templated.json").write_text(json.dumps(templated))
    for name in ["v0.json", "templated.json"]:
        view = shardfs_mount(tmp_path / name)
        assert_reads_as_h5py(view, work / "data.h5")
        assert_files_as_fsspec(view, str(tmp_path / name))


def test_generated_keys_read_their_ranges(shardfs_mount, tmp_path):
    data = np.arange(64 * 3, dtype="<i4")
    data.tofile(tmp_path / "raw.bin")
    zarray = {"shape": [64 * 3], "chunks": [8], "dtype": "<i4", "compressor": None, "filters": None,
              "fill_value": 0, "order": "C", "zarr_format": 2}
    refs = {"version": 1, "templates": {"f": "raw.bin"},
            "gen": [{"key": "raw/{{i}}", "url": "{{f}}", "offset": "{{i * 32}}", "length": 32,
                     "dimensions": {"i": {"stop": 24}}}],
            "refs": {".zgroup": json.dumps({"zarr_format": 2}), "raw/.zarray": json.dumps(zarray)}}
    (tmp_path / "gen.json").write_text(json.dumps(refs))
    view = shardfs_mount(tmp_path / "gen.json")
    assert len(list((Path(view) / "raw").iterdir())) == 24 + 1
    np.testing.assert_array_equal(zarr.open_array(f"{view}/raw", mode="r", zarr_format=2)[...], data)


def test_references_in_a_bucket_read_from_the_bucket(hdf5, shardfs_mount, s3_server, tmp_path):
    work, refs = hdf5
    s3_server.put("refs")
    s3_server.put("refs/data/data.h5", (work / "data.h5").read_bytes())
    absolute = {"version": 1, "refs": {key: ["s3://refs/data/data.h5", *value[1:]] if isinstance(value, list) else value
                                       for key, value in refs["refs"].items()}}
    s3_server.put("refs/sets/refs.json", json.dumps(absolute).encode())
    # Relative URLs are taken from where the reference set is: here, the bucket.
    s3_server.put("refs/sets/data.h5", (work / "data.h5").read_bytes())
    s3_server.put("refs/sets/relative.json", (work / "refs.json").read_bytes())
    for name in ["refs.json", "relative.json"]:
        view = shardfs_mount(f"s3://refs/sets/{name}", endpoint_url=s3_server.endpoint)
        assert_reads_as_h5py(view, work / "data.h5")
    # A parquet reference directory in the bucket, referring to the bucket's HDF5 file.
    local = tmp_path / "refs.parq"
    refs_to_dataframe(absolute, str(local), record_size=4)
    for path in local.rglob("*"):
        if path.is_file():
            s3_server.put(f"refs/sets/refs.parq/{path.relative_to(local)}", path.read_bytes())
    view = shardfs_mount("s3://refs/sets/refs.parq", endpoint_url=s3_server.endpoint)
    assert_reads_as_h5py(view, work / "data.h5")


def test_hostile_references_fail_the_keys_concerned_and_nothing_else(hdf5, shardfs_mount, tmp_path):
    work, refs = hdf5
    shutil.copy(work / "data.h5", tmp_path / "data.h5")
    size = (tmp_path / "data.h5").stat().st_size
    hostile = dict(refs["refs"])
    hostile["temp/0.0"] = ["missing.h5", 0, 10]
    hostile["temp/0.1"] = ["data.h5", size - 5, 10]
    hostile["temp/0.2"] = ["data.h5", size + 100, 10]
    hostile["temp/1.0"] = 42
    (tmp_path / "hostile.json").write_text(json.dumps({"version": 1, "refs": hostile}))
    view = Path(shardfs_mount(tmp_path / "hostile.json"))
    for key in ["temp/0.0", "temp/0.1", "temp/0.2", "temp/1.0"]:
        assert read_errno(view / key) == errno.EIO, key
    # Never the fill value: zarr-python's read of the array fails, and other arrays read.
    with pytest.raises(OSError):
        zarr.open_array(view / "temp", mode="r", zarr_format=2)[...]
    expected, _ = h5py_arrays(work / "data.h5")
    np.testing.assert_array_equal(zarr.open_array(view / "x", mode="r", zarr_format=2)[...], expected["x"])
    with contextlib.chdir(work):
        assert (view / "temp/1.1").read_bytes() == fsspec.filesystem("reference", fo="refs.json").cat("temp/1.1")

    # A reference set that is not one is refused in one line naming it.
    (tmp_path / "cut.json").write_text((work / "refs.json").read_text()[:200])
    with pytest.raises(MountError, match=r"cut\.json: not a kerchunk reference file"):
        shardfs_mount(tmp_path / "cut.json")


def test_a_damaged_record_file_fails_its_chunks_alone(hdf5, shardfs_mount, tmp_path):
    work, _ = hdf5
    shutil.copy(work / "data.h5", tmp_path / "data.h5")
    shutil.copytree(work / "refs.parq", tmp_path / "refs.parq")
    record = tmp_path / "refs.parq/temp/refs.1.parq"
    record.write_bytes(record.read_bytes()[:40])
    view = Path(shardfs_mount(tmp_path / "refs.parq"))
    # Rows 4-7 of the grid of 4 x 3 chunks: chunks 1.1, 1.2, 2.0 and 2.1.
    for key in ["temp/1.1", "temp/1.2", "temp/2.0", "temp/2.1"]:
        assert read_errno(view / key) == errno.EIO, key
    assert read_errno(view / "temp/0.0") is None
    assert read_errno(view / "temp/2.2") is None
    expected, _ = h5py_arrays(work / "data.h5")
    np.testing.assert_array_equal(zarr.open_array(view / "names", mode="r", zarr_format=2)[...], expected["names"])


def test_the_v2_view_of_a_v2_store_is_refused(hdf5, shardfs_mount):
    work, _ = hdf5
    with pytest.raises(MountError, match="leave out --zarr-format 2"):
        shardfs_mount(work / "refs.json", zarr_format=2)
