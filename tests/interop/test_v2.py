"""The Zarr v2 view: zarr-python 2.18 reads sharded v3 arrays through it.

zarr-python 3 and tensorstore write every layout of tests/data/generate.py afresh (gzip, zstd,
crc32c, big-endian data, nested sharding, index at start and end, every key encoding), and
zarr-python 3 also writes a blosc array, a bool array, a float array with a NaN fill value, one
whose inner chunks end in a crc32c, an F-order (transposed) one, unsharded ones (their chunk files
shown at v2 keys) and one with a codec v2 cannot express. shardfs mounts the store with
`--zarr-format 2 --read-only`; then zarr-python 2.18 (target/venv-v2, its own venv) opens every
array of the view and must read exactly what zarr-python 3 reads from the sharded store, the root
opens as a v2 group and through its consolidated `.zmetadata` (zarr.open_consolidated, and xarray
opening a group whose arrays have dimension names), `.zmetadata` follows a document changed in the
store, no zarr.json shows, the arrays v2 cannot express are left out, and a chunk whose crc32c does
not match reads as EIO. GDAL 3.6 from Debian (which reads no Zarr v3) reads 2-D arrays of the view,
and a 3-D one slice by slice, exactly. Then zarr-python 2.18 writes through a writable v2 view
(regions of sharded and unsharded arrays with and without a crc32c, a chunk file deleted, attributes
with dimension names, resizes), a new array is refused, and zarr-python 3 and tensorstore read
exactly what it wrote from the sharded store.

Runs in target/venv (zarr-python 3.1.6, tensorstore); zarr-python 2.18 and xarray run in
target/venv-v2. One part alone: ``target/venv/bin/python -m pytest tests/interop/test_v2.py -k gdal``.
"""

import json
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import BINARY, V2_PYTHON

from v2_arrays import write_store

warnings.filterwarnings("ignore", message="Consolidated metadata")

# Run by zarr-python 2.18: reads each array of the view and compares it with the .npy beside.
READER = r"""
import json, sys, numpy as np, zarr
mnt, expected_dir = sys.argv[1], sys.argv[2]
result = {}
for name in json.load(open(expected_dir + "/arrays.json")):
    want = np.load(f"{expected_dir}/{name.replace('/', '_')}.npy")
    try:
        got = zarr.open_array(f"{mnt}/{name}", mode="r")[...]
        # The byte order is the stored chunks' (">f8" for big-endian ones): the values must match.
        same_type = got.dtype.newbyteorder("=") == want.dtype.newbyteorder("=")
        result[name] = bool(same_type and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"))
    except Exception as e:
        result[name] = repr(e)
group = zarr.open_group(mnt, mode="r")
result["/"] = sorted(group.group_keys())
# The same arrays through the root's consolidated metadata, as xarray and zarr.open_consolidated
# read it.
consolidated = zarr.open_consolidated(mnt, mode="r")
result["consolidated"] = [name for name in json.load(open(expected_dir + "/arrays.json"))
                          if not np.array_equal(consolidated[name][...],
                                                np.load(f"{expected_dir}/{name.replace('/', '_')}.npy"), equal_nan=True)]
import xarray
ds = xarray.open_zarr(mnt, group="xr", consolidated=True)
result["xarray"] = {name: [list(ds[name].dims), bool(np.array_equal(
    ds[name].values, np.load(f"{expected_dir}/xr_{name}.npy")))] for name in ("temperature", "lat")}
print(json.dumps(result))
"""


# Run by zarr-python 2.18: writes through a writable v2 view, saves what each array should hold.
WRITER = r"""
import json, os, sys, numpy as np, zarr
mnt, out = sys.argv[1], sys.argv[2]
result = {}
def save(name, data):
    np.save(f"{out}/{name.replace('/', '_')}.npy", data)
# Regions: a sharded array whose chunks end in a crc32c, a blosc one, an unsharded one with a
# crc32c and "/" keys.
for name, value in (("v2/crc", 7), ("v2/blosc", -5), ("v2/unsharded_crc", 3)):
    a = zarr.open_array(f"{mnt}/{name}", mode="r+")
    a[1:5, 2:7] = value
    save(name, a[...])

# A chunk file deleted: it reads as the fill value.
a = zarr.open_array(f"{mnt}/v2/bool", mode="r+")
os.remove(f"{mnt}/v2/bool/0/0")
# A chunk-key directory made for a new row of chunks outlives the kernel's caches (the stored
# keys, c/i/j, are not the view's, i/j).
a.resize(15, 10)
os.mkdir(f"{mnt}/v2/bool/2")
open("/proc/sys/vm/drop_caches", "w").write("2")
result["made dir"] = os.path.isdir(f"{mnt}/v2/bool/2")
a[14, 0] = True
save("v2/bool", a[...])
# Attributes, with xarray's dimension names.
a = zarr.open_array(f"{mnt}/v2/nan_fill", mode="r+")
a.attrs.update({"units": "K", "_ARRAY_DIMENSIONS": ["y", "x"]})
save("v2/nan_fill", a[...])
# Resizes: a sharded array shrunk then grown, an unsharded one grown and written.
a = zarr.open_array(f"{mnt}/xr/temperature", mode="r+")
a.resize(4, 5)
a.resize(6, 10)
a[5, 9] = 1.5
save("xr/temperature", a[...])
a = zarr.open_array(f"{mnt}/v2/unsharded", mode="r+")
a.resize(14)
a[12:] = 99
save("v2/unsharded", a[...])
# zarr.consolidate_metadata writes .zmetadata: dropped, the view's own stays current.
zarr.consolidate_metadata(mnt)
a = zarr.open_array(f"{mnt}/v2/unsharded", mode="r+")
a.attrs["after"] = 1
result["zmetadata current"] = json.load(open(f"{mnt}/.zmetadata"))["metadata"]["v2/unsharded/.zattrs"]
# Dimension names of the wrong count are refused, not stored.
try:
    zarr.open_array(f"{mnt}/v2/crc", mode="r+").attrs["_ARRAY_DIMENSIONS"] = ["x"]
    result["bad dims"] = "stored"
except Exception as e:
    result["bad dims"] = type(e).__name__
# A zarr.json written into the v2 view is refused: the stored one is hidden, not writable.
try:
    open(f"{mnt}/v2/crc/zarr.json", "w").write("{}")
    result["zarr.json"] = "written"
except OSError as e:
    result["zarr.json"] = e.errno
# A new group, and a new array in it (stored sharded: the mount has --shard-new).
zarr.open_group(f"{mnt}/v2/made", mode="w")
a = zarr.open_array(f"{mnt}/v2/made/new", mode="w", shape=(9, 7), chunks=(2, 3), dtype=">i4",
                    compressor=zarr.Blosc(cname="zstd", clevel=3, shuffle=2), fill_value=-1)
a[1:8, 2:6] = np.arange(28, dtype=">i4").reshape(7, 4)
a.attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
save("v2/made/new", zarr.open_array(f"{mnt}/v2/made/new", mode="r")[...])
# An array v3 cannot hold as written (a filter) is refused.
try:
    zarr.open_array(f"{mnt}/v2/made/filtered", mode="w", shape=(4,), chunks=(2,), dtype="<i4",
                    filters=[zarr.Delta(dtype="<i4")])
    result["new array"] = "created"
except Exception as e:
    result["new array"] = type(e).__name__ + ": " + str(e)
print(json.dumps(result))
"""


class Store:
    """The sharded store zarr-python 3 and tensorstore wrote, and what each array holds."""

    def __init__(self, work):
        self.sharded, self.arrays, self.left_out = write_store(work)
        self.expected = work / "expected"
        self.expected.mkdir()
        for path in self.arrays:
            np.save(self.npy(path), zarr.open_array(self.sharded / path, mode="r")[...])
        (self.expected / "arrays.json").write_text(json.dumps(self.arrays))

    def npy(self, path):
        return self.expected / (path.replace("/", "_") + ".npy")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("v2"))


@pytest.fixture(scope="module")
def view(store, tmp_path_factory):
    """The read-only v2 view, and its log."""
    log = tmp_path_factory.mktemp("v2-log") / "shardfs.log"
    with shardfs.mount(store.sharded, zarr_format=2, read_only=True, log_file=log) as mnt:
        yield Path(mnt), log


def test_zarr_2_18_reads_every_array_directly_and_through_zmetadata(store, view):
    mnt, _ = view
    run = subprocess.run([V2_PYTHON, "-c", READER, mnt, store.expected], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-800:]
    result = json.loads(run.stdout)
    assert {path: result.get(path) for path in store.arrays if result.get(path) is not True} == {}
    assert result["/"] == ["ts", "v2", "xr", "zp"], "the root is a v2 group with the store's groups"
    assert result["consolidated"] == [], "zarr.open_consolidated reads every array exactly through .zmetadata"
    assert result["xarray"] == {"temperature": [["time", "lat"], True], "lat": [["lat"], True]}, \
        "xarray opens a group through .zmetadata, dimensions from _ARRAY_DIMENSIONS"


def test_zmetadata_lists_every_array_and_group_and_no_zarr_json(store, view):
    mnt, _ = view
    zmetadata = json.loads((mnt / ".zmetadata").read_text())["metadata"]
    want_keys = {f"{p}/{n}" for p in store.arrays for n in (".zarray", ".zattrs")} | {".zgroup", "v2/.zgroup"}
    assert want_keys <= set(zmetadata), sorted(want_keys - set(zmetadata))
    assert not [k for k in zmetadata if "zarr.json" in k]
    assert not [k for p in store.left_out for k in zmetadata if k.startswith(p + "/")]
    assert ".zmetadata" in os.listdir(mnt)


def test_no_zarr_json_shows_and_what_v2_cannot_express_is_left_out_and_logged(store, view):
    mnt, log = view
    assert not [p for p in mnt.rglob("zarr.json")]
    for path in store.left_out:
        assert not (mnt / path / ".zarray").exists(), path
    text = log.read_text()
    assert "v2/two_compressors" in text and "more than one compressor" in text, text[-600:]


def test_the_crc32c_is_stripped_and_f_order_shown(view):
    mnt, _ = view
    zarray = json.loads((mnt / "v2/crc/.zarray").read_text())
    assert zarray["compressor"] == {"id": "gzip", "level": 1} and zarray["filters"] is None, zarray
    assert json.loads((mnt / "v2/forder/.zarray").read_text())["order"] == "F"


def gdal_translate(source, out):
    """The raster at `source` as a NumPy array, through gdal_translate to ENVI (raw, native order)."""
    subprocess.run(["gdal_translate", "-q", "-of", "ENVI", source, out], check=True)
    with open(os.path.splitext(out)[0] + ".hdr") as f:
        header = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in f if "=" in line)}
    types = {"1": "u1", "2": "i2", "3": "i4", "4": "f4", "5": "f8", "12": "u2", "13": "u4", "14": "i8", "15": "u8"}
    order = ">" if header.get("byte order") == "1" else "<"
    data = np.fromfile(out, dtype=order + types[header["data type"]])
    return data.reshape(int(header["lines"]), int(header["samples"]))


def test_gdal_3_6_reads_the_v2_view_exactly(store, view, tmp_path):
    """GDAL 3.6 from Debian (no Zarr v3 at all) reads 2-D arrays of the view, and a 3-D one slice
    by slice, exactly."""
    mnt, _ = view
    for path in ["zp/gzip_crc_end", "ts/zstd_crc", "zp/big_endian_index", "v2/blosc", "v2/crc", "v2/nan_fill"]:
        got = gdal_translate(mnt / path, tmp_path / (path.replace("/", "_") + ".envi"))
        np.testing.assert_array_equal(got, np.load(store.npy(path)), err_msg=path)
    cube = np.load(store.npy("zp/zstd_start"))
    slices = [gdal_translate(f'ZARR:"{mnt}/zp/zstd_start":/zstd_start:{i}', tmp_path / f"slice{i}.envi")
              for i in range(cube.shape[0])]
    np.testing.assert_array_equal(np.stack(slices), cube)


def test_zmetadata_follows_a_document_changed_in_the_store(store, view):
    """(Last of the read-only view's cases: it changes the store underneath.) A document changed in
    the store shows in .zmetadata (built once, kept until then) within the watcher's pass."""
    mnt, _ = view
    zarr.open_array(store.sharded / "v2/bool", mode="r+").attrs["changed"] = "yes"
    deadline = time.time() + 5
    while True:
        attrs = json.loads((mnt / ".zmetadata").read_text())["metadata"]["v2/bool/.zattrs"]
        if attrs.get("changed") == "yes" or time.time() > deadline:
            break
        time.sleep(0.1)
    assert attrs.get("changed") == "yes", attrs


def test_a_chunk_whose_crc32c_does_not_match_reads_eio_and_the_rest_is_served(store, tmp_path):
    copy = tmp_path / "sharded"
    shutil.copytree(store.sharded, copy)
    shard = copy / "v2/crc/c/0/0"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(data)
    log = tmp_path / "log"
    with shardfs.mount(copy, zarr_format=2, read_only=True, log_file=log) as mnt:
        top = Path(mnt) / "v2/crc"
        errors = []
        for chunk in sorted(p for p in top.rglob("*") if p.is_file() and not p.name.startswith(".")):
            try:
                chunk.read_bytes()
            except OSError as e:
                errors.append(e.errno)
    assert errors == [5]
    assert "crc32c mismatch" in log.read_text()


@pytest.fixture(scope="module")
def written(store, tmp_path_factory):
    """zarr-python 2.18's writes through a writable v2 view (with --shard-new 2) of a copy of the
    store: the copy, what the writer said, and the directory of what each array must hold."""
    work = tmp_path_factory.mktemp("v2-written")
    copy, out = work / "sharded", work / "written"
    shutil.copytree(store.sharded, copy)
    out.mkdir()
    with shardfs.mount(copy, zarr_format=2, shard_new=2, log_file=work / "log") as mnt:
        run = subprocess.run([V2_PYTHON, "-c", WRITER, mnt, out], capture_output=True, text=True)
    assert run.returncode == 0, f"zarr-python 2.18 writes through the v2 view: {run.stderr[-800:]}"
    return copy, json.loads(run.stdout), out


def test_writes_through_the_v2_view_refuse_what_v3_cannot_hold(written):
    _, result, _ = written
    assert result["new array"] != "created", "a new array with a filter (no v3 form here) is refused"
    assert result["made dir"] is True, "a chunk-key directory made in the v2 view outlives the kernel's caches"
    assert result["zmetadata current"] == {"after": 1}, \
        ".zmetadata written by zarr.consolidate_metadata is dropped; the view's follows the next write at once"
    assert result["bad dims"] not in (None, "stored"), "_ARRAY_DIMENSIONS of the wrong length is refused"
    assert result["zarr.json"] == 22, "writing zarr.json into the v2 view is refused (EINVAL)"


WRITTEN = ["v2/crc", "v2/blosc", "v2/unsharded_crc", "v2/bool", "v2/nan_fill", "xr/temperature", "v2/unsharded",
           "v2/made/new"]


@pytest.mark.parametrize("name", WRITTEN)
def test_zarr_3_and_tensorstore_read_what_zarr_2_wrote(written, name):
    copy, _, out = written
    want = np.load(out / (name.replace("/", "_") + ".npy"))
    got = zarr.open_array(copy / name, mode="r")[...]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(copy / name)}}
    np.testing.assert_array_equal(ts.open(spec, open=True, read=True).result().read().result(), want)


def test_the_stored_documents_take_the_v2_writes_in_v3_form(written):
    copy, _, _ = written
    meta = zarr.open_array(copy / "v2/nan_fill", mode="r").metadata
    assert meta.attributes == {"units": "K"} and tuple(meta.dimension_names or ()) == ("y", "x")
    made = zarr.open_array(copy / "v2/made/new", mode="r").metadata
    assert "ShardingCodec(" in str(made.codecs) and "BloscCodec(" in str(made.codecs)
    assert tuple(made.dimension_names or ()) == ("y", "x")
    assert json.loads((copy / "v2/made/zarr.json").read_text()).get("node_type") == "group"
    codecs = str(zarr.open_array(copy / "v2/crc", mode="r").metadata.codecs)
    assert "ShardingCodec(" in codecs and "GzipCodec(level=1), Crc32cCodec()" in codecs, codecs
    crc_doc = json.loads((copy / "v2/crc/zarr.json").read_text())
    assert crc_doc.get("node_type") == "array" and "dimension_names" not in crc_doc
    stray = [p for p in copy.rglob("*")
             if p.name.endswith(".partial") or p.name in (".zarray", ".zattrs", ".zgroup", ".zmetadata")]
    assert not stray, "no v2 file or temporary file left in the store"
    result = subprocess.run([BINARY, "check", copy], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-500:]
