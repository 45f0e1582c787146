"""Web servers: shardfs mounts http://HOST/PATH URLs served by nginx.

zarr-python 3 and tensorstore write every layout of tests/data/generate.py (sharded, with
consolidated metadata), plus a group without consolidated metadata, into the directory the
session's nginx serves three ways (conftest.py): with WebDAV listings, without (a plain static
server), and with neither listings nor ETags (reads are pinned to Last-Modified). For each server:
- a mount of http://127.0.0.1:PORT/sharded beside a read-only mount of the same directory as a
  local store: every chunk file of the two views is byte for byte the same, `ls -R` is the same
  (without WebDAV the groups' children come from consolidated metadata), and zarr-python and
  tensorstore read every array of the web mount exactly as of the local one;
- a group without consolidated metadata lists its children with WebDAV, only its zarr.json
  without, and its array is read by name all the same;
- every write fails with EROFS; `shardfs check`, `info` and `refs` take the URL;
- a shard replaced on the server while a view file of it is open never yields a mix of versions:
  the reader gets the old bytes, the new ones, or an error.
And, before mounting: an unreachable server and a URL with no zarr.json are one-line errors naming
the URL, with exit status 1.

Runs in ``target/venv``; one server alone: ``pytest tests/interop/test_http.py -k WebDAV``.
"""

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import BINARY, ROOT

from peers import chunk_files, walk
from ports import free_port

sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata")
ARRAYS = [path for path, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]
# Each server: nginx's port attribute, and whether it lists directories.
SERVERS = {"WebDAV": ("dav", True), "plain": ("plain", False), "no ETag": ("no_etag", False)}


@pytest.fixture(scope="module")
def served(nginx):
    """What nginx serves: the generated stores, a big shard, and an unconsolidated group."""
    data = nginx.root
    generate.generate(str(data))
    sharded = data / "sharded"
    # One big uncompressed shard of one inner chunk of 1 MiB, for the replacement check.
    big = zarr.create_array(store=str(sharded / "big"), shape=(2 << 20,), dtype="uint8", chunks=(2 << 20,),
                            shards=(2 << 20,), compressors=None, fill_value=0)
    big[...] = np.arange(2 << 20, dtype="uint64").astype("uint8")
    plain = zarr.open_group(str(data / "unconsolidated"), mode="w")
    plain.create_array("arr", shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="int32")[...] = \
        np.arange(64, dtype="int32").reshape(8, 8)
    zarr.consolidate_metadata(str(sharded))
    return sharded


@pytest.fixture(scope="module")
def local(served):
    with shardfs.mount(served, read_only=True) as mnt:
        yield Path(mnt)


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request, nginx, served):
    port_of, listed = SERVERS[request.param]
    return SimpleNamespace(name=request.param, url=f"http://127.0.0.1:{getattr(nginx, port_of)}", listed=listed)


@pytest.fixture(scope="module")
def web(server):
    """The server's mount of the sharded store, nothing fetched ahead: each read asks the server
    for its own bytes, so that the read after a replacement meets the new version."""
    with shardfs.mount(f"{server.url}/sharded", read_ahead_size=0) as mnt:
        yield Path(mnt)


@pytest.mark.parametrize("what", ["unreachable", "dav", "plain"])
def test_a_mount_refused_is_one_line_naming_the_url_and_the_cause(nginx, served, tmp_path, what):
    url, needle = {
        "unreachable": (f"http://127.0.0.1:{free_port()}/sharded", "cannot reach the server"),
        "dav": (f"http://127.0.0.1:{nginx.dav}/nothing-here", "zarr.json"),
        "plain": (f"http://127.0.0.1:{nginx.plain}/nothing-here", "zarr.json"),
    }[what]
    result = subprocess.run([BINARY, "mount", url, tmp_path], capture_output=True, text=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and url in lines[0] and needle in lines[0], result.stderr
    assert not os.path.ismount(tmp_path)


def test_every_chunk_file_is_the_local_mounts(web, local):
    differ = sorted(chunk_files(web) ^ chunk_files(local))
    same = chunk_files(web) & chunk_files(local)
    differ += [f for f in sorted(same) if (web / f).read_bytes() != (local / f).read_bytes()]
    assert not differ and len(same) > 100, differ[:5]


def test_ls_r_is_the_local_mounts(web, local):
    got, want = walk(web), walk(local)
    assert got == want, {d: (got.get(d), want.get(d)) for d in set(got) | set(want) if got.get(d) != want.get(d)}


@pytest.mark.parametrize("path", ARRAYS)
def test_both_peers_read_each_array_as_from_the_local_mount(web, local, path):
    want = zarr.open_array(local / path, mode="r")[...]
    assert np.array_equal(zarr.open_array(web / path, mode="r")[...], want), "zarr-python"
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(web / path)}}
    assert np.array_equal(ts.open(spec, open=True, read=True).result().read().result(), want), "tensorstore"


WRITES = {
    "create a file": lambda mnt: open(mnt / "new", "wb").close(),
    "overwrite zarr.json": lambda mnt: open(mnt / "zarr.json", "r+b").close(),
    "mkdir": lambda mnt: os.mkdir(mnt / "d"),
    "rm a chunk": lambda mnt: os.remove(mnt / "zp/raw_nocrc/c/5"),
}


@pytest.mark.parametrize("what", list(WRITES))
def test_every_write_fails_with_erofs(web, what):
    with pytest.raises(OSError) as failed:
        WRITES[what](web)
    assert failed.value.errno == errno.EROFS


def test_a_shard_replaced_while_a_file_of_it_is_open_is_never_read_mixed(web, local, served):
    array = zarr.open_array(str(served / "big"), mode="r+")
    # From the local mount: a read through the web one would put the old version in the page cache.
    old = (local / "big/c/0").read_bytes()
    try:
        with open(web / "big/c/0", "rb", buffering=0) as f:
            head = f.read(4096)
            array[...] = array[...] + 1
            # nginx's ETag is the file's mtime (to the second) and size: a replacement of the same
            # size in the same second would be the same version to it.
            later = time.time() + 10
            for name in os.listdir(served / "big/c"):
                os.utime(served / "big/c" / name, (later, later))
            try:
                outcome = "old" if head + f.read() == old else "mixed"
            except OSError as e:
                outcome = f"error {errno.errorcode.get(e.errno)}"
        # Both mounts show the new version once their watchers have seen it (a pass a second,
        # after the web mount's one-second metadata TTL): waited for, within a bound, never timed.
        # Until then a read of a version gone from the server fails with ESTALE (docs/semantics.md,
        # "Consistency"). An error is a right answer here; a mix of versions never is.
        deadline, stale = time.monotonic() + 20, 0
        while True:
            try:
                new, old_again = (web / "big/c/0").read_bytes(), (local / "big/c/0").read_bytes()
            except OSError as e:
                if e.errno != errno.ESTALE or time.monotonic() > deadline:
                    raise
                stale += 1
                time.sleep(0.2)
                continue
            if new == old_again != old or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(f"the new version shown after {stale} reads ESTALE")
        assert outcome != "mixed", outcome
        assert new == old_again != old, "both mounts show the new version"
    finally:
        array[...] = array[...] - 1


def test_a_group_without_consolidated_metadata_lists_what_the_server_lists(server, shardfs_mount):
    mnt = Path(shardfs_mount(f"{server.url}/unconsolidated"))
    want = ["arr", "zarr.json"] if server.listed else ["zarr.json"]
    assert sorted(os.listdir(mnt)) == want
    assert np.array_equal(zarr.open_array(mnt / "arr", mode="r")[...], np.arange(64, dtype="int32").reshape(8, 8))


@pytest.mark.parametrize("command", [["check"], ["check", "--data"], ["info"]])
def test_commands_take_the_url(server, command):
    result = subprocess.run([BINARY, *command, f"{server.url}/sharded"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-300:]


def test_refs_names_every_shard_by_its_url(server):
    url = f"{server.url}/sharded"
    result = subprocess.run([BINARY, "refs", url], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-300:]
    shards = {v[0] for v in json.loads(result.stdout)["refs"].values() if isinstance(v, list)}
    assert shards and all(s.startswith(url + "/") for s in shards)
