"""Interop test of zip stores: zipped Zarr written by the field's own writers, read through a
mount by the field's own readers.

    target/venv/bin/python scripts/interop_zip.py [path/to/shardfs]

Writers: zarr-python 3's `ZipStore` writes a sharded array at the root of one zip and a group of
two sharded arrays (gzip with partial edge shards; zstd with a crc32c index at the start) in
another; ngff-zarr 0.50 (target/venv-ome) writes an OME-Zarr 0.5 image as an RFC-9 `.ozx` (it
shards, stores uncompressed and puts `zarr.json` entries first: checked; ZIP64 records, which a
zip this small does not need, are covered by the unit tests of src/format/zip.rs). What each array holds
is taken from the writer (the arrays given, or zarr-python 3 reading the zip directly). Then,
through read-only mounts of each zip: zarr-python 3 and tensorstore read every array exactly in
the v3 view, zarr-python 2.18 (target/venv-v2) in the v2 view (where the image's metadata is
OME-Zarr 0.4); writes fail with EROFS; `shardfs check` passes each zip, and `shardfs refs`
names ranges of the zip that zarr-python 3 reads every array from exactly (fsspec's
ReferenceFileSystem). A zip with a truncated central directory is refused in one line, and a
shard entry whose range runs past the end reads EIO while the other chunks are served. Last, the
group's zip as an object of a local S3 server (moto) mounted by its s3:// URL reads exactly too.
Every mount is unmounted, whatever fails.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import warnings
import zipfile

import fsspec
import numpy as np
import tensorstore as ts
import zarr
from zarr.storage import FsspecStore, ZipStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

warnings.filterwarnings("ignore", message="Duplicate name")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
V2_PYTHON = os.path.join(ROOT, "target", "venv-v2", "bin", "python")
OME_PYTHON = os.path.join(ROOT, "target", "venv-ome", "bin", "python")

# Run by ngff-zarr 0.50: an OME-Zarr 0.5 image written straight to an .ozx.
OZX_WRITER = r"""
import sys, numpy as np, ngff_zarr as nz
data = (np.arange(2 * 96 * 80, dtype=np.uint16) * 7 % 5003).reshape(2, 96, 80)
image = nz.to_ngff_image(data, dims=["c", "y", "x"], scale={"y": 0.5, "x": 0.5}, name="image")
nz.to_ngff_zarr(sys.argv[1], nz.to_multiscales(image, scale_factors=[2], chunks=16), version="0.5")
"""

# Run by zarr-python 2.18: every array of the v2 view against the .npy beside, and the image's
# group metadata.
V2_READER = r"""
import json, sys, numpy as np, zarr
mnt, expected = sys.argv[1], sys.argv[2]
result = {}
for name in json.load(open(expected + "/arrays.json")):
    want = np.load(f"{expected}/{name.replace('/', '_')}.npy")
    try:
        result[name] = bool(np.array_equal(zarr.open_array(f"{mnt}/{name}", mode="r")[...], want))
    except Exception as e:
        result[name] = repr(e)
print(json.dumps(result))
"""


def label(zip_name, path):
    return f"{zip_name}/{path}" if path else f"{zip_name} (its root array)"


def save_expected(arrays, directory):
    """Writes each array (name -> numpy array) as .npy and the names as arrays.json."""
    os.makedirs(directory, exist_ok=True)
    for name, data in arrays.items():
        np.save(os.path.join(directory, name.replace("/", "_") + ".npy"), data)
    with open(os.path.join(directory, "arrays.json"), "w") as f:
        json.dump(sorted(arrays), f)


def write_zarr_python_zips(work):
    """zarr-python 3's ZipStore: one sharded array at the root, and a group of two; each array
    written once, so that each shard is one entry."""
    arrays = {}
    single = os.path.join(work, "single.zip")
    data = (np.arange(50 * 70, dtype=np.uint16) * 3 % 1009).reshape(50, 70)
    with ZipStore(single, mode="w") as store:
        z = zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(5, 7), shards=(20, 28),
                              compressors=zarr.codecs.GzipCodec(level=5))
        z[...] = data
    group = os.path.join(work, "group.zip")
    temperature = np.linspace(-10, 30, 24 * 33 * 17, dtype=np.float32).reshape(24, 33, 17)
    counts = np.arange(1000, dtype=np.int64)[::-1].copy()
    with ZipStore(group, mode="w") as store:
        root = zarr.create_group(store, attributes={"written_by": "zarr-python ZipStore"})
        t = root.create_array("temperature", shape=temperature.shape, dtype="float32", chunks=(4, 11, 17),
                              shards=(8, 33, 17), compressors=zarr.codecs.ZstdCodec(level=3))
        t[...] = temperature
        sharding = zarr.codecs.ShardingCodec(chunk_shape=(64,), codecs=[zarr.codecs.BytesCodec()],
                                             index_codecs=[zarr.codecs.BytesCodec(), zarr.codecs.Crc32cCodec()],
                                             index_location="start")
        c = root.create_array("nested/counts", shape=counts.shape, dtype="int64", chunks=(256,),
                              serializer=sharding, compressors=None)
        c[...] = counts
    arrays["single"] = {"": data}
    arrays["group"] = {"temperature": temperature, "nested/counts": counts}
    return {single: arrays["single"], group: arrays["group"]}


def write_ozx(work, check):
    """ngff-zarr writes an .ozx; what it holds is read back with zarr-python 3 from the zip."""
    ozx = os.path.join(work, "image.ozx")
    run = subprocess.run([OME_PYTHON, "-c", OZX_WRITER, ozx], capture_output=True, text=True)
    check("ngff-zarr 0.50 writes an OME-Zarr 0.5 image as .ozx", run.returncode == 0, run.stderr[-800:])
    with zipfile.ZipFile(ozx) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    first_data = next((n for n, i in enumerate(infos) if not i.filename.endswith("zarr.json")), len(infos))
    check("the .ozx is RFC-9's shape: stored entries, zarr.json entries first",
          all(i.compress_type == zipfile.ZIP_STORED for i in infos)
          and all(not n.endswith("zarr.json") for n in names[first_data:]), str(names[:8]))
    arrays = {}
    with ZipStore(ozx, mode="r") as store:
        root = zarr.open_group(store, mode="r")
        for path in [d["path"] for d in root.attrs["ome"]["multiscales"][0]["datasets"]]:
            array = zarr.open_array(store, path=path, mode="r")
            sharded = any(isinstance(c, zarr.codecs.ShardingCodec) for c in array.metadata.codecs)
            check(f"image.ozx/{path}: ngff-zarr stored it sharded", sharded)
            arrays[path] = array[...]
    return ozx, arrays


def mount(binary, store, mnt, log, *flags):
    subprocess.run([binary, "mount", *flags, "--log-file", log, store, mnt], check=True)


def unmount(binary, mnt):
    subprocess.run([binary, "unmount", mnt], check=False)


def read_through_mounts(binary, zip_path, arrays, work, check):
    """zarr-python 3 and tensorstore through the v3 view, zarr-python 2.18 through the v2 view."""
    name = os.path.basename(zip_path)
    mnt3, mnt2, log = (os.path.join(work, f"{name}.{n}") for n in ("mnt3", "mnt2", "log"))
    os.mkdir(mnt3)
    os.mkdir(mnt2)
    expected = os.path.join(work, f"{name}.expected")
    save_expected(arrays, expected)
    mount(binary, zip_path, mnt3, log)
    try:
        for path, want in arrays.items():
            got = zarr.open_array(os.path.join(mnt3, path), mode="r")[...]
            check(f"{label(name, path)}: zarr-python 3 reads it exactly through the v3 view", np.array_equal(got, want))
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt3, path)}}
            got = ts.open(spec, open=True, read=True).result().read().result()
            check(f"{label(name, path)}: tensorstore reads it exactly through the v3 view", np.array_equal(got, want))
        try:
            with open(os.path.join(mnt3, "new"), "wb") as f:
                f.write(b"x")
            errno = None
        except OSError as e:
            errno = e.errno
        check(f"{name}: mounted read-only without being asked (EROFS)", errno == 30, str(errno))
    finally:
        unmount(binary, mnt3)
    mount(binary, zip_path, mnt2, log, "--zarr-format", "2")
    try:
        run = subprocess.run([V2_PYTHON, "-c", V2_READER, mnt2, expected], capture_output=True, text=True)
        result = json.loads(run.stdout) if run.returncode == 0 else {}
        for path in arrays:
            check(f"{label(name, path)}: zarr-python 2.18 reads it exactly through the v2 view",
                  result.get(path) is True, str(result.get(path))[:300] + run.stderr[-300:])
        if name.endswith(".ozx"):
            attrs = json.load(open(os.path.join(mnt2, ".zattrs")))
            check(f"{name}: the v2 view shows the image's metadata as OME-Zarr 0.4",
                  attrs.get("multiscales", [{}])[0].get("version") == "0.4", str(attrs)[:300])
    finally:
        unmount(binary, mnt2)


def check_and_refs(binary, zip_path, arrays, check):
    name = os.path.basename(zip_path)
    run = subprocess.run([binary, "check", zip_path], capture_output=True, text=True)
    check(f"{name}: shardfs check passes it", run.returncode == 0, run.stdout[-400:] + run.stderr[-400:])
    run = subprocess.run([binary, "refs", zip_path], capture_output=True, text=True)
    check(f"{name}: shardfs refs writes references", run.returncode == 0, run.stderr[-400:])
    if run.returncode != 0:
        return
    refs = json.loads(run.stdout)
    ranges = [r for r in refs["refs"].values() if isinstance(r, list)]
    check(f"{name}: every reference is a range of the zip file",
          ranges and all(len(r) == 3 and r[0] == os.path.abspath(zip_path) for r in ranges), str(ranges[:3]))
    store = FsspecStore(fsspec.filesystem("reference", fo=refs, asynchronous=True), read_only=True, path="")
    for path, want in arrays.items():
        got = zarr.open_array(store, path=path, mode="r")[...]
        check(f"{label(name, path)}: zarr-python 3 reads it exactly through the references", np.array_equal(got, want))


def damaged(binary, zip_path, arrays, work, check):
    """A truncated central directory, and one shard entry running past the end."""
    data = open(zip_path, "rb").read()
    end = data.rindex(b"PK\x05\x06")
    truncated = os.path.join(work, "truncated.zip")
    with open(truncated, "wb") as f:
        f.write(data[:end - 100] + data[end:])
    mnt = os.path.join(work, "mnt-damaged")
    os.mkdir(mnt)
    run = subprocess.run([binary, "mount", truncated, mnt], capture_output=True, text=True)
    lines = run.stderr.strip().splitlines()
    check("a truncated central directory: the mount is refused with one line naming the zip",
          run.returncode == 1 and len(lines) == 1 and truncated in lines[0] and "truncated" in lines[0], run.stderr)
    # The first shard entry's sizes in the central directory made to run past the end.
    with zipfile.ZipFile(zip_path) as z:
        at = z.start_dir
        shard = next(i.filename for i in z.infolist() if "/c/" in i.filename or i.filename.startswith("c/"))
    past = bytearray(data)
    while True:
        name_len, extra_len, comment_len = struct.unpack("<HHH", past[at + 28:at + 34])
        if past[at + 46:at + 46 + name_len].decode() == shard:
            past[at + 20:at + 28] = struct.pack("<II", len(data), len(data))
            break
        at += 46 + name_len + extra_len + comment_len
    broken = os.path.join(work, "past-the-end.zip")
    with open(broken, "wb") as f:
        f.write(past)
    mount(binary, broken, mnt, os.path.join(work, "damaged.log"))
    try:
        eio, served = 0, 0
        for d, _, files in os.walk(mnt):
            for f in files:
                try:
                    with open(os.path.join(d, f), "rb") as chunk:
                        chunk.read()
                    served += 1
                except OSError as e:
                    eio += e.errno == 5
        check(f"an entry ({shard}) past the end: its chunks read EIO, the others are served",
              eio > 0 and served > eio, f"eio {eio} served {served}")
    finally:
        unmount(binary, mnt)
    with open(os.path.join(work, "damaged.log")) as f:
        lines = [line for line in f if shard in line and "run past" in line]
    check("an entry past the end: a log line names it", len(lines) >= 1, str(lines)[:400])


def from_a_bucket(binary, zip_path, arrays, work, check):
    """The zip as an object of a local S3 server (moto): mounted by its s3:// URL, zarr-python 3
    reads every array exactly, and refs name ranges of the object."""
    import logging
    import socket
    import boto3
    from moto.server import ThreadedMotoServer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    mnt = os.path.join(work, "mnt-s3")
    os.mkdir(mnt)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="zips")
        url = "s3://zips/data/" + os.path.basename(zip_path)
        s3.upload_file(zip_path, "zips", url[len("s3://zips/"):])
        mount(binary, url, mnt, os.path.join(work, "s3.log"), "--endpoint-url", endpoint)
        try:
            for path, want in arrays.items():
                got = zarr.open_array(os.path.join(mnt, path), mode="r")[...]
                check(f"{url}/{path}: zarr-python 3 reads it exactly through a mount of the object",
                      np.array_equal(got, want))
        finally:
            unmount(binary, mnt)
        run = subprocess.run([binary, "refs", "--endpoint-url", endpoint, url], capture_output=True, text=True)
        refs = json.loads(run.stdout)["refs"] if run.returncode == 0 else {}
        ranges = [r for r in refs.values() if isinstance(r, list)]
        check(f"{url}: shardfs refs names ranges of the object", ranges and all(r[0] == url for r in ranges),
              run.stderr[-400:] + str(ranges[:2]))
    finally:
        server.stop()


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/shardfs"))
    check = Checks()
    with tempfile.TemporaryDirectory(prefix="shardfs-zip-") as work:
        zips = write_zarr_python_zips(work)
        ozx, image = write_ozx(work, check)
        zips[ozx] = image
        for zip_path, arrays in zips.items():
            read_through_mounts(binary, zip_path, arrays, work, check)
            check_and_refs(binary, zip_path, arrays, check)
        damaged(binary, next(iter(zips)), zips[next(iter(zips))], work, check)
        group = next(z for z in zips if z.endswith("group.zip"))
        from_a_bucket(binary, group, zips[group], work, check)
    return check.summary("interop_zip")


if __name__ == "__main__":
    sys.exit(main())
