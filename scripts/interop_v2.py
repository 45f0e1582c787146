"""Interop test of the Zarr v2 view: zarr-python 2.18 reads sharded v3 arrays through it.

    target/venv/bin/python scripts/interop_v2.py [path/to/shardfs]

zarr-python 3 and tensorstore write every layout of tests/data/generate.py afresh (gzip, zstd,
crc32c, big-endian data, nested sharding, index at start and end, every key encoding), and
zarr-python 3 also writes a blosc array, a bool array, a float array with a NaN fill value, one
whose inner chunks end in a crc32c, an F-order (transposed) one, unsharded ones (their chunk files
shown at v2 keys) and one with a codec v2 cannot express. shardfs mounts the store with `--zarr-format 2 --read-only`; then
zarr-python 2.18 (target/venv-v2, its own venv) opens every array of the view and must read
exactly what zarr-python 3 reads from the sharded store, the root opens as a v2 group and through
its consolidated `.zmetadata` (zarr.open_consolidated, and xarray opening a group whose arrays
have dimension names), `.zmetadata` follows a document changed in the store, no zarr.json shows, the arrays v2 cannot express are left out, and a chunk whose crc32c does not match reads as EIO. GDAL 3.6 from Debian (which reads
no Zarr v3) reads 2-D arrays of the view, and a 3-D one slice by slice, exactly. Then zarr-python
2.18 writes through a writable v2 view (regions of sharded and unsharded arrays with and without
a crc32c, a chunk file deleted, attributes with dimension names, resizes), a new array is refused,
and zarr-python 3 and tensorstore read exactly what it wrote from the sharded store.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import generate  # noqa: E402
from checks import Checks  # noqa: E402

warnings.filterwarnings("ignore", message="Consolidated metadata")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
V2_PYTHON = os.path.join(ROOT, "target", "venv-v2", "bin", "python")

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


def extra_arrays(root):
    """Arrays beyond generate.py's, each with the codecs a v2 view must map (or refuse)."""
    rng = np.random.default_rng(7)
    made = {}

    def make(path, data, **kwargs):
        arr = zarr.create_array(store=os.path.join(root, path), shape=data.shape, dtype=data.dtype, **kwargs)
        arr[...] = data
        made[path] = data

    floats = rng.random((12, 10)).astype("float32")
    floats[3:5, :] = np.nan
    make("v2/blosc", rng.integers(0, 1000, (16, 12)).astype("int32"), chunks=(4, 4), shards=(8, 12),
         compressors=BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"))
    make("v2/bool", rng.random((10, 10)) > 0.5, chunks=(5, 5), shards=(10, 10), compressors=None, fill_value=False)
    make("v2/nan_fill", floats, chunks=(4, 5), shards=(8, 10), compressors=GzipCodec(level=1), fill_value=np.nan)
    make("v2/crc", rng.integers(0, 100, (9, 8)).astype("uint16"), chunks=(3, 4), shards=(9, 8),
         serializer=BytesCodec(), compressors=[GzipCodec(level=1), Crc32cCodec()])
    make("v2/forder", rng.integers(0, 100, (6, 4)).astype("int16"), chunks=(3, 2), shards=(6, 4),
         filters=[TransposeCodec(order=(1, 0))], compressors=None)
    make("v2/unsharded", rng.integers(0, 1000, (10,)).astype("int64"), chunks=(4,), compressors=GzipCodec(level=1))
    make("v2/unsharded_crc", rng.integers(0, 100, (7, 9)).astype(">u2"), chunks=(3, 4),
         chunk_key_encoding={"name": "v2", "separator": "/"}, compressors=[GzipCodec(level=1), Crc32cCodec()])
    zarr.open_group(os.path.join(root, "xr"), mode="w")
    make("xr/temperature", rng.random((6, 8)).astype("float32"), chunks=(2, 4), shards=(6, 8),
         compressors=GzipCodec(level=1), dimension_names=("time", "lat"))
    make("xr/lat", np.linspace(-80, 80, 8), chunks=(4,), dimension_names=("lat",))
    left_out = {"v2/two_compressors": dict(chunks=(2,), shards=(4,),
                                           compressors=[GzipCodec(level=1), GzipCodec(level=2)])}
    for path, kwargs in left_out.items():
        zarr.create_array(store=os.path.join(root, path), shape=(8,), dtype="uint8", **kwargs)[...] = np.arange(8, dtype="uint8")
    return made, sorted(left_out)


def gdal_translate(source, out):
    """The raster at `source` as a NumPy array, through gdal_translate to ENVI (raw, native order)."""
    subprocess.run(["gdal_translate", "-q", "-of", "ENVI", source, out], check=True)
    with open(os.path.splitext(out)[0] + ".hdr") as f:
        header = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in f if "=" in line)}
    types = {"1": "u1", "2": "i2", "3": "i4", "4": "f4", "5": "f8", "12": "u2", "13": "u4", "14": "i8", "15": "u8"}
    order = ">" if header.get("byte order") == "1" else "<"
    data = np.fromfile(out, dtype=order + types[header["data type"]])
    return data.reshape(int(header["lines"]), int(header["samples"]))


def gdal_reads(mnt, expected, work, check):
    """GDAL 3.6 from Debian (no Zarr v3 at all) reads 2-D arrays of the view, and a 3-D one slice by
    slice, exactly."""
    def want(path):
        return np.load(os.path.join(expected, path.replace("/", "_") + ".npy"))
    for path in ["zp/gzip_crc_end", "ts/zstd_crc", "zp/big_endian_index", "v2/blosc", "v2/crc", "v2/nan_fill"]:
        got = gdal_translate(os.path.join(mnt, path), os.path.join(work, path.replace("/", "_") + ".envi"))
        check(f"{path}: GDAL 3.6 reads the v2 view exactly", np.array_equal(got, want(path), equal_nan=True))
    cube = want("zp/zstd_start")
    slices = [gdal_translate(f'ZARR:"{mnt}/zp/zstd_start":/zstd_start:{i}', os.path.join(work, f"slice{i}.envi"))
              for i in range(cube.shape[0])]
    check("zp/zstd_start: GDAL 3.6 reads the 3-D array of the v2 view exactly, slice by slice",
          np.array_equal(np.stack(slices), cube))


def writes_through_the_view(binary, sharded, mnt, work, log, check):
    """zarr-python 2.18 writes through a writable v2 view; then zarr-python 3 and tensorstore read
    exactly that from the sharded store."""
    import tensorstore as ts
    written = os.path.join(work, "written")
    os.mkdir(written)
    subprocess.run([binary, "mount", "--zarr-format", "2", "--shard-new", "2", "--log-file", log, sharded, mnt],
                   check=True)
    try:
        run = subprocess.run([V2_PYTHON, "-c", WRITER, mnt, written], capture_output=True, text=True)
        result = json.loads(run.stdout) if run.returncode == 0 else {}
        check("zarr-python 2.18 writes through the v2 view", run.returncode == 0, run.stderr[-800:])
        check("a new array with a filter (no v3 form here) is refused", result.get("new array", "created") != "created",
              str(result.get("new array")))
        check("a chunk-key directory made in the v2 view outlives the kernel's caches", result.get("made dir") is True)
        check(".zmetadata written by zarr.consolidate_metadata is dropped; the view's follows the next write at once",
              result.get("zmetadata current") == {"after": 1}, str(result.get("zmetadata current")))
        check("_ARRAY_DIMENSIONS of the wrong length is refused", result.get("bad dims") not in (None, "stored"),
              str(result.get("bad dims")))
        check("writing zarr.json into the v2 view is refused (EINVAL)", result.get("zarr.json") == 22,
              str(result.get("zarr.json")))
    finally:
        subprocess.run([binary, "unmount", mnt], check=False)
    names = ["v2/crc", "v2/blosc", "v2/unsharded_crc", "v2/bool", "v2/nan_fill", "xr/temperature", "v2/unsharded",
             "v2/made/new"]
    for name in names:
        want = np.load(os.path.join(written, name.replace("/", "_") + ".npy"))
        got = zarr.open_array(os.path.join(sharded, name), mode="r")[...]
        check(f"{name}: zarr-python 3 reads what zarr-python 2 wrote through the v2 view",
              got.shape == want.shape and np.array_equal(got, want, equal_nan=True), f"{got.shape} {want.shape}")
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(sharded, name)}}
        got = ts.open(spec, open=True, read=True).result().read().result()
        check(f"{name}: tensorstore reads it too", np.array_equal(got, want, equal_nan=True))
    meta = zarr.open_array(os.path.join(sharded, "v2/nan_fill"), mode="r").metadata
    check("v2/nan_fill: .zattrs stored as attributes and dimension names",
          meta.attributes == {"units": "K"} and tuple(meta.dimension_names or ()) == ("y", "x"),
          f"{meta.attributes} {meta.dimension_names}")
    made = zarr.open_array(os.path.join(sharded, "v2/made/new"), mode="r").metadata
    check("v2/made/new: made through the v2 view, stored as a sharded v3 array with its dimension names",
          "ShardingCodec(" in str(made.codecs) and "BloscCodec(" in str(made.codecs)
          and tuple(made.dimension_names or ()) == ("y", "x"), str(made.codecs)[:300])
    check("v2/made: a group made through the v2 view is a v3 group",
          json.load(open(os.path.join(sharded, "v2/made/zarr.json"))).get("node_type") == "group")
    codecs = str(zarr.open_array(os.path.join(sharded, "v2/crc"), mode="r").metadata.codecs)
    check("v2/crc: still sharded with its crc32c after the writes", "ShardingCodec(" in codecs and "GzipCodec(level=1), Crc32cCodec()" in codecs, codecs)
    stray = [os.path.join(d, n) for d, _, names in os.walk(sharded) for n in names
             if n.endswith(".partial") or n in (".zarray", ".zattrs", ".zgroup", ".zmetadata")]
    crc_doc = json.load(open(os.path.join(sharded, "v2/crc/zarr.json")))
    check("v2/crc: its stored zarr.json is intact", crc_doc.get("node_type") == "array" and
          "dimension_names" not in crc_doc, str(crc_doc)[:200])
    check("no v2 file or temporary file left in the store", not stray, str(stray[:5]))
    result = subprocess.run([binary, "check", sharded], capture_output=True, text=True)
    check("shardfs check passes after the writes", result.returncode == 0, result.stdout[-500:])


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-interop-v2.") as work:
        generate.generate(work)
        sharded, mnt, expected = (os.path.join(work, d) for d in ("sharded", "mnt", "expected"))
        zarr.open_group(os.path.join(sharded, "v2"), mode="w")
        made, left_out = extra_arrays(sharded)
        os.makedirs(expected)
        arrays = [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()] + sorted(made)
        for path in arrays:
            np.save(os.path.join(expected, path.replace("/", "_") + ".npy"),
                    zarr.open_array(os.path.join(sharded, path), mode="r")[...])
        with open(os.path.join(expected, "arrays.json"), "w") as f:
            json.dump(arrays, f)
        os.mkdir(mnt)
        log = os.path.join(work, "shardfs.log")
        subprocess.run([binary, "mount", "--zarr-format", "2", "--read-only", "--log-file", log, sharded, mnt], check=True)
        try:
            run = subprocess.run([V2_PYTHON, "-c", READER, mnt, expected], capture_output=True, text=True)
            result = json.loads(run.stdout) if run.returncode == 0 else {}
            check("zarr-python 2.18 runs over the view", run.returncode == 0, run.stderr[-800:])
            for path in arrays:
                check(f"{path}: zarr-python 2.18 reads the v2 view exactly", result.get(path) is True, str(result.get(path)))
            check("the root is a v2 group with the store's groups", result.get("/") == ["ts", "v2", "xr", "zp"], str(result.get("/")))
            check("zarr.open_consolidated reads every array exactly through .zmetadata",
                  result.get("consolidated") == [], str(result.get("consolidated")))
            check("xarray (zarr-python 2) opens a group through .zmetadata, dimensions from _ARRAY_DIMENSIONS",
                  result.get("xarray") == {"temperature": [["time", "lat"], True], "lat": [["lat"], True]},
                  str(result.get("xarray")))
            zmetadata = json.load(open(os.path.join(mnt, ".zmetadata")))["metadata"]
            want_keys = {f"{p}/{n}" for p in arrays for n in (".zarray", ".zattrs")} | {".zgroup", "v2/.zgroup"}
            check(".zmetadata lists every array's .zarray and .zattrs, and the groups, and no zarr.json",
                  want_keys <= set(zmetadata) and not [k for k in zmetadata if "zarr.json" in k]
                  and not [k for p in left_out for k in zmetadata if k.startswith(p + "/")],
                  str(sorted(want_keys - set(zmetadata))))
            check(".zmetadata is listed at the root", ".zmetadata" in os.listdir(mnt))
            # A document changed in the store shows in .zmetadata (built once, kept until then)
            # within the watcher's pass, as any change underneath the mount does.
            zarr.open_array(os.path.join(sharded, "v2/bool"), mode="r+").attrs["changed"] = "yes"
            deadline = time.time() + 5
            while True:
                attrs = json.load(open(os.path.join(mnt, ".zmetadata")))["metadata"]["v2/bool/.zattrs"]
                if attrs.get("changed") == "yes" or time.time() > deadline:
                    break
                time.sleep(0.1)
            check(".zmetadata follows a document changed in the store", attrs.get("changed") == "yes", str(attrs))
            shown = [os.path.join(d, n) for d, _, names in os.walk(mnt) for n in names]
            check("no zarr.json in the v2 view", not [p for p in shown if p.endswith("zarr.json")])
            for path in left_out:
                check(f"{path}: left out of the v2 view (no .zarray)", not os.path.exists(os.path.join(mnt, path, ".zarray")))
            with open(os.path.join(mnt, "v2/crc/.zarray")) as f:
                zarray = json.load(f)
            check("v2/crc: the crc32c codec is not in .zarray (the view strips it)",
                  zarray["compressor"] == {"id": "gzip", "level": 1} and zarray["filters"] is None, str(zarray))
            check("v2/forder: shown as order F", json.load(open(os.path.join(mnt, "v2/forder/.zarray")))["order"] == "F")
            gdal_reads(mnt, expected, work, check)
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        # A chunk whose crc32c does not match: EIO, and the rest is still served.
        crc_shard = os.path.join(sharded, "v2", "crc", "c", "0", "0")
        with open(crc_shard, "r+b") as f:
            f.seek(0)
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
        subprocess.run([binary, "mount", "--zarr-format", "2", "--read-only", "--log-file", log, sharded, mnt], check=True)
        try:
            top = os.path.join(mnt, "v2", "crc")
            chunks = sorted(os.path.relpath(os.path.join(d, n), top) for d, _, names in os.walk(top)
                            for n in names if not n.startswith("."))
            errors = []
            for name in chunks:
                try:
                    with open(os.path.join(top, name), "rb") as f:
                        f.read()
                except OSError as e:
                    errors.append(e.errno)
            check("v2/crc: the chunk with a bad crc32c reads as EIO, the others are served",
                  errors == [5], f"{errors} of {chunks}")
        finally:
            subprocess.run([binary, "unmount", mnt], check=False)
        with open(crc_shard, "r+b") as f:
            f.write(first)
        writes_through_the_view(binary, sharded, mnt, work, log, check)
        with open(log) as f:
            text = f.read()
        check("the log names each array left out and why",
              "v2/two_compressors" in text and "more than one compressor" in text
              and "crc32c mismatch" in text, text[-600:])
    return check.summary("interop-v2")


if __name__ == "__main__":
    sys.exit(main())
