"""zarr-python's own store conformance suite inside a mount: zarr.testing.store.StoreTests (and
zarr-python's directory move, exclusive creates and listings, tests/interop/store_suite/) run with
the newest zarr-python for a LocalStore rooted in a plain directory (the control, which must pass
whole) and in writable shardfs mounts of a sharded store (on which only the refusals listed in
REFUSED may fail): a local store, the same with --shard-new, and a bucket of a local S3 server
(moto). After unmount, the sharded array beside the suite's files reads back exactly.

Runs in target/venv-newest; one mount alone:
``target/venv-newest/bin/python -m pytest tests/interop/test_store_suite.py -k s3``.
"""

import os
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import obstore
import pytest
import shardfs
import zarr
from conftest import BINARY

SUITE = Path(__file__).parent / "store_suite"

# Tests that store bytes which are not a Zarr document under a metadata name (`zarr.json`): the
# view refuses them (EINVAL, the stored document unchanged), as docs/semantics.md says.
REFUSED = {
    "test_set[-zarr.json]",
    r"test_set[\x01\x02\x03\x04-zarr.json]",
    "test_set_many",
    "test_get_partial_values[key_ranges1]",
    "test_get_partial_values[key_ranges2]",
    "test_exists",
    "test_delete",
    "test_delete_dir",
    "test_list",
    "test_list_prefix",
    "test_list_empty_path",
    "test_list_dir",
}


def run_suite(root, report):
    """Runs the suite with its stores below `root`: {test id: passed, failed or skipped}."""
    env = dict(os.environ, SHARDFS_SUITE_ROOT=str(root))
    # --noconftest: this directory's conftest.py is for the suite around it, not the one inside.
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                    "-o", "asyncio_mode=auto", "--junitxml", report, SUITE], env=env, check=False, capture_output=True)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        results[case.get("name")] = outcome
    return results


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    work = tmp_path_factory.mktemp("control")
    (work / "plain").mkdir()
    return run_suite(work / "plain", work / "control.xml")


def test_the_suite_passes_on_a_plain_directory(control):
    assert control and not [name for name, outcome in control.items() if outcome == "failed"]


@pytest.mark.parametrize("kind", ["local", "local --shard-new 2", "s3"])
def test_the_suite_in_a_writable_mount_passes_but_for_the_documented_refusals(kind, control, tmp_path, request):
    if kind == "s3":
        s3 = request.getfixturevalue("s3_server")
        urllib.request.urlopen(urllib.request.Request(f"{s3.endpoint}/suite", method="PUT")).close()
        bucket = obstore.store.S3Store("suite", prefix="store", endpoint=s3.endpoint,
                                       client_options={"allow_http": True})
        # A bucket: directories are renamed by copying (EXDEV), links are copies.
        store, source, options = zarr.storage.ObjectStore(bucket), "s3://suite/store", {"endpoint_url": s3.endpoint}
    else:
        store = source = tmp_path / "store"
        options = {"shard_new": 2} if "shard-new" in kind else {}
    zarr.open_group(store, mode="w")
    data = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
    zarr.create_array(store, name="sharded", data=data, chunks=(8, 8), shards=(32, 32),
                      compressors=zarr.codecs.GzipCodec(level=1))
    with shardfs.mount(source, log_file=tmp_path / "mount.log", **options) as mnt:
        mounted = run_suite(mnt, tmp_path / "mounted.xml")
        np.testing.assert_array_equal(zarr.open_array(Path(mnt) / "sharded", mode="r")[...], data)
    assert set(mounted) == set(control), "every test the control ran ran"
    unlike = {name: outcome for name, outcome in mounted.items()
              if outcome != ("failed" if name in REFUSED else control[name])}
    assert unlike == {}, "refused as documented, and otherwise as on a plain directory"
    np.testing.assert_array_equal(zarr.open_array(store, path="sharded", mode="r")[...], data)
    flags = ["--endpoint-url", options["endpoint_url"]] if kind == "s3" else []
    checked = subprocess.run([BINARY, "check", source, *flags], capture_output=True, text=True)
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-800:]
