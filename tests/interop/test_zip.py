"""Zip stores: zipped Zarr written by the field's own writers, read through a mount by the field's
own readers.

Writers: zarr-python 3's `ZipStore` writes a sharded array at the root of one zip and a group of
two sharded arrays (gzip with partial edge shards; zstd with a crc32c index at the start) in
another; ngff-zarr 0.50 (target/venv-ome) writes an OME-Zarr 0.5 image as an RFC-9 `.ozx` (it
shards, stores uncompressed and puts `zarr.json` entries first: checked; ZIP64 records, which a zip
this small does not need, are covered by the unit tests of src/format/zip.rs). What each array
holds is taken from the writer (the arrays given, or zarr-python 3 reading the zip directly).
Through read-only mounts of each zip: zarr-python 3 and tensorstore read every array exactly in
the v3 view, zarr-python 2.18 (target/venv-v2) in the v2 view (where the image's metadata is
OME-Zarr 0.4); writes fail with EROFS; `shardfs check` passes each zip, and `shardfs refs` names
ranges of the zip that zarr-python 3 reads every array from exactly (fsspec's
ReferenceFileSystem). A zip with a truncated central directory is refused in one line, and a shard
entry whose range runs past the end reads EIO while the other chunks are served. Last, the group's
zip as an object of a local S3 server (moto) mounted by its s3:// URL reads exactly too.

Runs in target/venv (zarr-python 3.1.6, tensorstore); one zip alone:
``target/venv/bin/python -m pytest tests/interop/test_zip.py -k ozx``.
"""

import errno
import json
import os
import struct
import subprocess
import warnings
import zipfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import tensorstore as ts
import zarr
from conftest import BINARY, ROOT, zarr2_reads
from zarr.storage import FsspecStore, ZipStore

warnings.filterwarnings("ignore", message="Duplicate name")
OME_PYTHON = ROOT / "target/venv-ome/bin/python"
ZIPS = ["single.zip", "group.zip", "image.ozx"]

# Run by ngff-zarr 0.50: an OME-Zarr 0.5 image written straight to an .ozx.
OZX_WRITER = r"""
import sys, numpy as np, ngff_zarr as nz
data = (np.arange(2 * 96 * 80, dtype=np.uint16) * 7 % 5003).reshape(2, 96, 80)
image = nz.to_ngff_image(data, dims=["c", "y", "x"], scale={"y": 0.5, "x": 0.5}, name="image")
nz.to_ngff_zarr(sys.argv[1], nz.to_multiscales(image, scale_factors=[2], chunks=16), version="0.5")
"""

def write_zarr_python_zips(work):
    """zarr-python 3's ZipStore: one sharded array at the root, and a group of two; each array
    written once, so that each shard is one entry."""
    data = (np.arange(50 * 70, dtype=np.uint16) * 3 % 1009).reshape(50, 70)
    with ZipStore(work / "single.zip", mode="w") as store:
        zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(5, 7), shards=(20, 28),
                          compressors=zarr.codecs.GzipCodec(level=5))[...] = data
    temperature = np.linspace(-10, 30, 24 * 33 * 17, dtype=np.float32).reshape(24, 33, 17)
    counts = np.arange(1000, dtype=np.int64)[::-1].copy()
    with ZipStore(work / "group.zip", mode="w") as store:
        root = zarr.create_group(store, attributes={"written_by": "zarr-python ZipStore"})
        root.create_array("temperature", shape=temperature.shape, dtype="float32", chunks=(4, 11, 17),
                          shards=(8, 33, 17), compressors=zarr.codecs.ZstdCodec(level=3))[...] = temperature
        sharding = zarr.codecs.ShardingCodec(chunk_shape=(64,), codecs=[zarr.codecs.BytesCodec()],
                                             index_codecs=[zarr.codecs.BytesCodec(), zarr.codecs.Crc32cCodec()],
                                             index_location="start")
        root.create_array("nested/counts", shape=counts.shape, dtype="int64", chunks=(256,),
                          serializer=sharding, compressors=None)[...] = counts
    return {"single.zip": {"": data}, "group.zip": {"temperature": temperature, "nested/counts": counts}}


@pytest.fixture(scope="module")
def zips(tmp_path_factory):
    """Each zip's path and what each of its arrays holds."""
    work = tmp_path_factory.mktemp("zip")
    arrays = write_zarr_python_zips(work)
    run = subprocess.run([OME_PYTHON, "-c", OZX_WRITER, work / "image.ozx"], capture_output=True, text=True)
    assert run.returncode == 0, f"ngff-zarr 0.50 writes an OME-Zarr 0.5 image as .ozx: {run.stderr[-800:]}"
    with ZipStore(work / "image.ozx", mode="r") as store:
        root = zarr.open_group(store, mode="r")
        paths = [d["path"] for d in root.attrs["ome"]["multiscales"][0]["datasets"]]
        arrays["image.ozx"] = {path: zarr.open_array(store, path=path, mode="r")[...] for path in paths}
    return {name: (work / name, arrays[name]) for name in ZIPS}


def test_ngff_zarr_writes_an_ozx_of_rfc9s_shape_sharded(zips):
    ozx, arrays = zips["image.ozx"]
    with zipfile.ZipFile(ozx) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    first_data = next((n for n, i in enumerate(infos) if not i.filename.endswith("zarr.json")), len(infos))
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos), "stored entries"
    assert all(not n.endswith("zarr.json") for n in names[first_data:]), f"zarr.json entries first: {names[:8]}"
    with ZipStore(ozx, mode="r") as store:
        for path in arrays:
            codecs = zarr.open_array(store, path=path, mode="r").metadata.codecs
            assert any(isinstance(c, zarr.codecs.ShardingCodec) for c in codecs), f"{path} stored sharded"


@pytest.mark.parametrize("name", ZIPS)
def test_the_v3_view_reads_exactly_and_refuses_writes(zips, name, shardfs_mount):
    path, arrays = zips[name]
    mnt = Path(shardfs_mount(path))
    for array, want in arrays.items():
        np.testing.assert_array_equal(zarr.open_array(mnt / array, mode="r")[...], want, err_msg=f"zarr {array}")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(mnt / array)}}
        got = ts.open(spec, open=True, read=True).result().read().result()
        np.testing.assert_array_equal(got, want, err_msg=f"tensorstore {array}")
    with pytest.raises(OSError) as refused:
        (mnt / "new").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS, "mounted read-only without being asked"


@pytest.mark.parametrize("name", ZIPS)
def test_zarr_python_2_reads_the_v2_view_exactly(zips, name, shardfs_mount, tmp_path):
    path, arrays = zips[name]
    mnt = shardfs_mount(path, zarr_format=2)
    assert zarr2_reads(mnt, arrays, tmp_path) == {array: True for array in arrays}
    if name.endswith(".ozx"):
        attrs = json.loads((Path(mnt) / ".zattrs").read_text())
        assert attrs["multiscales"][0]["version"] == "0.4", "the image's metadata as OME-Zarr 0.4"


@pytest.mark.parametrize("name", ZIPS)
def test_check_passes_and_refs_name_ranges_of_the_zip(zips, name):
    path, arrays = zips[name]
    run = subprocess.run([BINARY, "check", path], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-400:] + run.stderr[-400:]
    run = subprocess.run([BINARY, "refs", path], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-400:]
    refs = json.loads(run.stdout)
    ranges = [r for r in refs["refs"].values() if isinstance(r, list)]
    assert ranges and all(len(r) == 3 and r[0] == os.path.abspath(path) for r in ranges), ranges[:3]
    store = FsspecStore(fsspec.filesystem("reference", fo=refs, asynchronous=True), read_only=True, path="")
    for array, want in arrays.items():
        np.testing.assert_array_equal(zarr.open_array(store, path=array, mode="r")[...], want, err_msg=array)


def test_a_truncated_central_directory_is_refused_in_one_line(zips, tmp_path):
    data = zips["single.zip"][0].read_bytes()
    end = data.rindex(b"PK\x05\x06")
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(data[:end - 100] + data[end:])
    (tmp_path / "mnt").mkdir()
    run = subprocess.run([BINARY, "mount", truncated, tmp_path / "mnt"], capture_output=True, text=True)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert str(truncated) in lines[0] and "truncated" in lines[0], run.stderr


def test_an_entry_past_the_end_reads_eio_and_the_others_are_served(zips, shardfs_mount, tmp_path):
    source = zips["single.zip"][0]
    data = source.read_bytes()
    # The first shard entry's sizes in the central directory made to run past the end.
    with zipfile.ZipFile(source) as z:
        at = z.start_dir
        shard = next(i.filename for i in z.infolist() if "/c/" in i.filename or i.filename.startswith("c/"))
    past = bytearray(data)
    while True:
        name_len, extra_len, comment_len = struct.unpack("<HHH", past[at + 28:at + 34])
        if past[at + 46:at + 46 + name_len].decode() == shard:
            past[at + 20:at + 28] = struct.pack("<II", len(data), len(data))
            break
        at += 46 + name_len + extra_len + comment_len
    broken, log = tmp_path / "past-the-end.zip", tmp_path / "damaged.log"
    broken.write_bytes(past)
    mnt = shardfs_mount(broken, log_file=log)
    eio, served = 0, 0
    for d, _, files in os.walk(mnt):
        for f in files:
            try:
                Path(d, f).read_bytes()
                served += 1
            except OSError as e:
                eio += e.errno == errno.EIO
    assert eio > 0 and served > eio, f"eio {eio} served {served}"
    assert any(shard in line and "run past" in line for line in log.read_text().splitlines()), "a log line names it"


def test_a_zip_in_a_bucket_reads_exactly_and_refs_name_the_object(zips, s3_server, shardfs_mount):
    path, arrays = zips["group.zip"]
    s3_server.put("zips")
    s3_server.put("zips/data/group.zip", path.read_bytes())
    url = "s3://zips/data/group.zip"
    mnt = Path(shardfs_mount(url, endpoint_url=s3_server.endpoint))
    for array, want in arrays.items():
        np.testing.assert_array_equal(zarr.open_array(mnt / array, mode="r")[...], want, err_msg=array)
    run = subprocess.run([BINARY, "refs", "--endpoint-url", s3_server.endpoint, url], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-400:]
    ranges = [r for r in json.loads(run.stdout)["refs"].values() if isinstance(r, list)]
    assert ranges and all(r[0] == url for r in ranges), ranges[:2]
