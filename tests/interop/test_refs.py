"""`shardfs refs`: readers without FUSE read the view through a reference file.

No mount: this is what machines without FUSE do. zarr-python 3 and tensorstore write every layout
of tests/data/generate.py afresh (gzip, zstd, crc32c, big-endian data, nested sharding, index at
start and end, every key encoding), and zarr-python 3 the extra arrays of v2_arrays.py
(blosc, bool, NaN fill value, inner chunks ending in a crc32c, F order, unsharded arrays, one
ending in a crc32c, and two compressors). `shardfs refs` writes a v3 and a v2 reference file of the
store; then, through fsspec's ReferenceFileSystem,
- zarr-python 3.1.6 (this venv, zarr.storage.FsspecStore) and the newest zarr-python
  (target/venv-newest) read every array of the v3 references exactly as zarr-python 3 reads the
  sharded store;
- zarr-python 2.18 (target/venv-v2) reads every array of the v2 references exactly, the array a
  v2 view leaves out has no .zarray, every array reads the same through the consolidated
  .zmetadata, and each chunk ending in a crc32c (sharded or not) is a range 4 bytes shorter;
and a damaged shard is refused: exit 1, one line naming it, no JSON document on stdout.

Runs in target/venv; needs no FUSE. One part alone:
``target/venv/bin/python -m pytest tests/interop/test_refs.py -k v2``.
"""

import json
import os
import subprocess
import warnings

import fsspec
import numpy as np
import pytest
import zarr
from conftest import BINARY, ROOT, V2_PYTHON
from v2_arrays import write_store
from zarr.storage import FsspecStore

warnings.filterwarnings("ignore", message="Consolidated metadata")
NEWEST_PYTHON = ROOT / "target/venv-newest/bin/python"
pytestmark = pytest.mark.no_fuse

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


class Store:
    """The sharded store, what its arrays hold (as .npy files, with arrays.json naming them for
    the v3 references and arrays-v2.json for the v2 ones), and its two reference files."""

    def __init__(self, work):
        self.sharded, self.v2_arrays, self.left_out = write_store(work)
        self.expected = work / "expected"
        self.expected.mkdir()
        # The v3 view shows the arrays a v2 view leaves out too (unsharded ones as stored).
        self.v3_arrays = self.v2_arrays + self.left_out
        for path in self.v3_arrays:
            np.save(self.npy(path), zarr.open_array(self.sharded / path, mode="r")[...])
        self.v3_dir, self.v2_dir = work / "expected", work / "expected-v2"
        (self.v3_dir / "arrays.json").write_text(json.dumps(self.v3_arrays))
        self.v2_dir.mkdir()
        for path in self.v2_arrays:
            os.link(self.npy(path), self.v2_dir / self.npy(path).name)
        (self.v2_dir / "arrays.json").write_text(json.dumps(self.v2_arrays))
        self.refs = {}
        for version in ("3", "2"):
            self.refs[version] = work / f"refs-v{version}.json"
            with open(self.refs[version], "wb") as out:
                run = subprocess.run([BINARY, "refs", "--zarr-format", version, self.sharded], stdout=out,
                                     stderr=subprocess.PIPE)
            assert run.returncode == 0 and not run.stderr, f"shardfs refs --zarr-format {version}: {run.stderr[-400:]}"

    def npy(self, path):
        return self.expected / (path.replace("/", "_") + ".npy")

    def refs_of(self, version):
        return json.loads(self.refs[version].read_text())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("refs"))


def run_reader(python, program, refs, expected):
    run = subprocess.run([python, "-c", program, refs, expected], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-800:]
    return json.loads(run.stdout)


def test_v3_references_are_chunk_ranges_and_unsharded_documents(store):
    v3 = store.refs_of("3")
    chunks = [r for r in v3["refs"].values() if isinstance(r, list) and len(r) == 3]
    assert v3["version"] == 1 and chunks and all(os.path.isabs(r[0]) and os.path.isfile(r[0]) for r in chunks)
    assert all("sharding_indexed" not in v for k, v in v3["refs"].items() if k.endswith("zarr.json"))


def test_zarr_python_3_reads_the_v3_references_exactly(store):
    refs = FsspecStore(fsspec.filesystem("reference", fo=str(store.refs["3"]), asynchronous=True), read_only=True,
                       path="")
    wrong = {}
    for path in store.v3_arrays:
        want = np.load(store.npy(path))
        try:
            got = zarr.open_array(refs, path=path, mode="r")[...]
            if not (got.dtype == want.dtype and np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")):
                wrong[path] = "differs"
        except Exception as e:  # noqa: BLE001 - the reader's failure is the finding
            wrong[path] = repr(e)
    assert not wrong, wrong


def test_the_newest_zarr_python_reads_the_v3_references_exactly(store):
    if not NEWEST_PYTHON.exists():
        if os.environ.get("SHARDFS_REQUIRE_NEWEST") == "1":
            pytest.fail(f"SHARDFS_REQUIRE_NEWEST=1 but {NEWEST_PYTHON} is missing: no Python 3.12 or newer")
        pytest.skip(f"no Python 3.12 or newer for {NEWEST_PYTHON}")
    result = run_reader(NEWEST_PYTHON, V3_READER, store.refs["3"], store.v3_dir)
    assert {path: result.get(path) for path in store.v3_arrays if result.get(path) is not True} == {}


def test_zarr_python_2_reads_the_v2_references_exactly(store):
    result = run_reader(V2_PYTHON, V2_READER, store.refs["2"], store.v2_dir)
    assert {path: result.get(path) for path in store.v2_arrays if result.get(path) is not True} == {}
    assert result["/"] == ["ts", "v2", "xr", "zp"], "the root is a v2 group with the store's groups"
    assert result["consolidated"] == [], "every array reads the same through the consolidated .zmetadata"


def test_v2_references_leave_out_what_a_v2_view_does_and_every_crc32c(store):
    v2, v3 = store.refs_of("2")["refs"], store.refs_of("3")["refs"]
    assert not [k for k in v2 if k.endswith("zarr.json")]
    for path in store.left_out:
        assert f"{path}/.zarray" not in v2, f"{path}: left out of the v2 references"
    crc = json.loads(v2["v2/crc/.zarray"])
    crc_chunks = [k for k in v2 if k.startswith("v2/crc/") and not k.split("/")[-1].startswith(".")]
    assert crc["compressor"] == {"id": "gzip", "level": 1} and crc_chunks
    assert all(v2[k][2] + 4 == v3[k.replace("v2/crc/", "v2/crc/c/")][2] for k in crc_chunks)
    whole = [k for k in v2 if k.startswith("v2/unsharded_crc/") and not k.split("/")[-1].startswith(".")]
    assert whole and all(v2[k][1] == 0 and v2[k][2] + 4 == os.path.getsize(v2[k][0]) for k in whole)


def test_a_damaged_shard_is_refused_in_one_line_with_no_json(tmp_path):
    damaged = Store(tmp_path)
    shard = damaged.sharded / "zp/gzip_crc_end/c/1/0"
    with open(shard, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff")
    run = subprocess.run([BINARY, "refs", damaged.sharded], capture_output=True, text=True)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and str(shard) in lines[0], run.stderr[-400:]
    with pytest.raises(ValueError):
        json.loads(run.stdout)
