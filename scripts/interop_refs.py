"""Interop test of `shardfs refs`: readers without FUSE read the view through a reference file.

    target/venv/bin/python scripts/interop_refs.py [path/to/shardfs]

No mount: this is what machines without FUSE do. zarr-python 3 and tensorstore write every
layout of tests/data/generate.py afresh (gzip, zstd, crc32c, big-endian data, nested sharding,
index at start and end, every key encoding), and zarr-python 3 the extra arrays of
scripts/interop_v2.py (blosc, bool, NaN fill value, inner chunks ending in a crc32c, F order,
unsharded arrays, one ending in a crc32c, and two compressors). `shardfs refs` writes a v3 and a v2 reference file of the
store; then, through fsspec's ReferenceFileSystem,
- zarr-python 3.1.6 (this venv, zarr.storage.FsspecStore) and the newest zarr-python
  (target/venv-newest) read every array of the v3 references exactly as zarr-python 3 reads the
  sharded store;
- zarr-python 2.18 (target/venv-v2) reads every array of the v2 references exactly, the array a
  v2 view leaves out has no .zarray, every array reads the same through the consolidated
  .zmetadata, and each chunk ending in a crc32c (sharded or not) is a range
  4 bytes shorter;
and a damaged shard is refused: exit 1, one line naming it, no JSON document on stdout.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import fsspec
import numpy as np
import zarr
from zarr.storage import FsspecStore
from checks import Checks

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data"))
sys.path.insert(0, HERE)
import generate  # noqa: E402
import interop_v2  # noqa: E402

warnings.filterwarnings("ignore", message="Consolidated metadata")
ROOT = os.path.join(HERE, "..")
V2_PYTHON = os.path.join(ROOT, "target", "venv-v2", "bin", "python")
NEWEST_PYTHON = os.path.join(ROOT, "target", "venv-newest", "bin", "python")

# Run by another zarr-python 3: reads each array through the v3 references and compares it with
# the .npy beside.
V3_READER = r"""
import json, sys, warnings, numpy as np, zarr, fsspec
from zarr.storage import FsspecStore
warnings.filterwarnings("ignore")
refs, expected_dir = sys.argv[1], sys.argv[2]
store = FsspecStore(fsspec.filesystem("reference", fo=refs, asynchronous=True), read_only=True, path="")
result = {"version": zarr.__version__}
for name in json.load(open(expected_dir + "/arrays.json")):
    want = np.load(f"{expected_dir}/{name.replace('/', '_')}.npy")
    try:
        got = zarr.open_array(store, path=name, mode="r")[...]
        result[name] = bool(got.dtype == want.dtype and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"))
    except Exception as e:
        result[name] = repr(e)
print(json.dumps(result))
"""

# Run by zarr-python 2.18: the same through the v2 references.
V2_READER = r"""
import json, sys, numpy as np, zarr, fsspec
refs, expected_dir = sys.argv[1], sys.argv[2]
mapper = fsspec.get_mapper("reference://", fo=refs)
result = {"version": zarr.__version__}
for name in json.load(open(expected_dir + "/arrays.json")):
    want = np.load(f"{expected_dir}/{name.replace('/', '_')}.npy")
    try:
        got = zarr.open_array(mapper, path=name, mode="r")[...]
        same_type = got.dtype.newbyteorder("=") == want.dtype.newbyteorder("=")
        result[name] = bool(same_type and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"))
    except Exception as e:
        result[name] = repr(e)
result["/"] = sorted(zarr.open_group(mapper, mode="r").group_keys())
# Through the consolidated .zmetadata, as zarr.open_consolidated and xarray read a store.
root, wrong = zarr.open_consolidated(mapper, mode="r"), []
for name in json.load(open(expected_dir + "/arrays.json")):
    want = np.load(f"{expected_dir}/{name.replace('/', '_')}.npy")
    if not np.array_equal(root[name][...], want, equal_nan=want.dtype.kind in "fc"):
        wrong.append(name)
result["consolidated"] = wrong
print(json.dumps(result))
"""


def run_reader(python, program, refs, expected, label, arrays, check):
    run = subprocess.run([python, "-c", program, refs, expected], capture_output=True, text=True)
    result = json.loads(run.stdout) if run.returncode == 0 else {}
    check(f"{label} runs over the references", run.returncode == 0, run.stderr[-800:])
    label = f"{label} {result.get('version', '?')}"
    for path in arrays:
        check(f"{path}: {label} reads the references exactly", result.get(path) is True, str(result.get(path)))
    return result


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-interop-refs.") as work:
        generate.generate(work)
        sharded, expected = os.path.join(work, "sharded"), os.path.join(work, "expected")
        zarr.open_group(os.path.join(sharded, "v2"), mode="w")
        made, left_out = interop_v2.extra_arrays(sharded)
        os.makedirs(expected)
        v2_arrays = [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()] + sorted(made)
        # The v3 view shows the arrays a v2 view leaves out too (unsharded ones as stored).
        v3_arrays = v2_arrays + left_out
        for path in v3_arrays:
            np.save(os.path.join(expected, path.replace("/", "_") + ".npy"),
                    zarr.open_array(os.path.join(sharded, path), mode="r")[...])
        with open(os.path.join(expected, "arrays.json"), "w") as f:
            json.dump(v3_arrays, f)

        refs = {}
        for version in ("3", "2"):
            refs[version] = os.path.join(work, f"refs-v{version}.json")
            started = time.monotonic()
            with open(refs[version], "wb") as out:
                run = subprocess.run([binary, "refs", "--zarr-format", version, sharded], stdout=out,
                                     stderr=subprocess.PIPE, text=False)
            took = time.monotonic() - started
            check(f"shardfs refs --zarr-format {version} succeeds ({took:.2f} s)", run.returncode == 0 and not run.stderr,
                  run.stderr.decode()[-400:])
        with open(refs["3"]) as f:
            v3 = json.load(f)
        chunks = [r for r in v3["refs"].values() if isinstance(r, list) and len(r) == 3]
        check(f"v3 references: version 1, {len(v3['refs'])} keys, {len(chunks)} chunk ranges in shard files",
              v3["version"] == 1 and chunks and all(os.path.isabs(r[0]) and os.path.isfile(r[0]) for r in chunks))
        check("v3 references: no shard file is a key, every zarr.json is inline and unsharded",
              all("sharding_indexed" not in v for k, v in v3["refs"].items() if k.endswith("zarr.json")))

        store = FsspecStore(fsspec.filesystem("reference", fo=refs["3"], asynchronous=True), read_only=True, path="")
        for path in v3_arrays:
            want = np.load(os.path.join(expected, path.replace("/", "_") + ".npy"))
            try:
                got = zarr.open_array(store, path=path, mode="r")[...]
                ok, detail = got.dtype == want.dtype and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), ""
            except Exception as e:  # noqa: BLE001 - the reader's failure is the finding
                ok, detail = False, repr(e)
            check(f"{path}: zarr-python {zarr.__version__} reads the v3 references exactly", ok, detail)
        if os.path.exists(NEWEST_PYTHON):
            run_reader(NEWEST_PYTHON, V3_READER, refs["3"], expected, "the newest zarr-python", v3_arrays, check)
        elif os.environ.get("SHARDFS_REQUIRE_NEWEST") == "1":
            check("the newest zarr-python reads the v3 references (SHARDFS_REQUIRE_NEWEST=1)", False,
                  f"{NEWEST_PYTHON} is missing: no Python 3.12 or newer")
        else:
            print(f"*** SKIPPED (no Python 3.12 or newer for {NEWEST_PYTHON}): the newest zarr-python's read "
                  "of the v3 references ***", file=sys.stderr)

        with open(os.path.join(expected, "arrays.json"), "w") as f:
            json.dump(v2_arrays, f)
        result = run_reader(V2_PYTHON, V2_READER, refs["2"], expected, "zarr-python", v2_arrays, check)
        check("v2 references: the root is a v2 group with the store's groups", result.get("/") == ["ts", "v2", "xr", "zp"],
              str(result.get("/")))
        with open(refs["2"]) as f:
            v2 = json.load(f)["refs"]
        check("v2 references: zarr-python 2.18 reads every array through the consolidated .zmetadata",
              result.get("consolidated") == [], str(result.get("consolidated")))
        check("v2 references: no zarr.json", not [k for k in v2 if k.endswith("zarr.json")])
        for path in left_out:
            check(f"{path}: left out of the v2 references (no .zarray)", f"{path}/.zarray" not in v2)
        crc = json.loads(v2["v2/crc/.zarray"])
        crc_chunks = [k for k in v2 if k.startswith("v2/crc/") and not k.split("/")[-1].startswith(".")]
        check("v2/crc: the crc32c is not in .zarray and each chunk range leaves it out",
              crc["compressor"] == {"id": "gzip", "level": 1} and crc_chunks
              and all(v2[k][2] + 4 == v3["refs"][k.replace("v2/crc/", "v2/crc/c/")][2] for k in crc_chunks),
              str(crc))

        whole = [k for k in v2 if k.startswith("v2/unsharded_crc/") and not k.split("/")[-1].startswith(".")]
        check("v2/unsharded_crc: each chunk file is a range of all of it but its crc32c",
              whole and all(v2[k][1] == 0 and v2[k][2] + 4 == os.path.getsize(v2[k][0]) for k in whole),
              str([v2[k] for k in whole[:3]]))

        # A damaged shard: refused with one line naming it, and nothing that parses as JSON.
        shard = os.path.join(sharded, "zp", "gzip_crc_end", "c", "1", "0")
        with open(shard, "r+b") as f:
            f.seek(-8, os.SEEK_END)
            f.write(b"\xff")
        run = subprocess.run([binary, "refs", sharded], capture_output=True, text=True)
        lines = run.stderr.strip().splitlines()
        try:
            json.loads(run.stdout)
            parses = True
        except ValueError:
            parses = False
        check("a damaged shard: refused, exit 1, one line naming it, no JSON document",
              run.returncode == 1 and len(lines) == 1 and shard in lines[0] and not parses, run.stderr[-400:])
    return check.summary("interop-refs")


if __name__ == "__main__":
    sys.exit(main())
