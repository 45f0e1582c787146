"""zarr-python's own store conformance suite inside a mount: zarr.testing.store.StoreTests (and
zarr-python's directory move, exclusive creates and listings, scripts/store_suite/) run with the
newest zarr-python for a LocalStore rooted in a plain directory (the control, which must pass
whole) and in writable shardfs mounts of a sharded store (on which only the refusals listed in
REFUSED may fail): a local store, the same with --shard-new, and a bucket of a local S3 server
(moto, from target/venv). After unmount, the sharded array beside the suite's files reads back
exactly.

    target/venv-newest/bin/python scripts/interop_store_suite.py [path/to/shardfs]
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET

import numpy as np
import obstore
import zarr
from checks import Checks

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests that store bytes which are not a Zarr document under a metadata name (`zarr.json`): the
# view refuses them (EINVAL, the stored document unchanged), as README's "Writing zarr.json" says.
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


class Moto:
    """A local S3 server (moto, from target/venv) for the length of a `with` block."""

    def __init__(self, work):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.log = open(os.path.join(work, "moto.log"), "w")
        moto = os.path.join(HERE, "..", "target", "venv", "bin", "moto_server")
        self.process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def __enter__(self):
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return f"http://127.0.0.1:{self.port}"
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto did not start")

    def __exit__(self, *_):
        self.process.terminate()
        self.process.wait(10)
        self.log.close()


def run_suite(root, report):
    """Runs the suite with its stores below `root`; returns {test id: passed?}."""
    env = dict(os.environ, SHARDFS_SUITE_ROOT=root)
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "--junitxml", report, os.path.join(HERE, "store_suite")],
        env=env, check=False)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        results[name] = outcome
    return results


def in_mount(binary, work, store, source, store_flags, flags, label, control, check):
    """The suite in a writable mount of `source` (a sharded store that zarr-python writes to
    through `store`, a directory or a zarr Store), mounted with `store_flags` and `flags`."""
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    zarr.open_group(store, mode="w")
    data = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
    zarr.create_array(store, name="sharded", data=data, chunks=(8, 8), shards=(32, 32),
                      compressors=zarr.codecs.GzipCodec(level=1))
    subprocess.run([binary, "mount", source, mnt, *store_flags, *flags, "--log-file", os.path.join(work, "mount.log")],
                   check=True)
    try:
        mounted = run_suite(mnt, os.path.join(work, "mounted.xml"))
        check(f"{label}: every test the control ran ran", set(mounted) == set(control),
              sorted(set(control) ^ set(mounted)))
        for name in sorted(mounted):
            outcome = mounted[name]
            if name in REFUSED:
                check(f"{label}: {name}: refused as documented", outcome == "failed", outcome)
            else:
                check(f"{label}: {name}: as on a plain directory", outcome == control.get(name), outcome)
        check(f"{label}: the sharded array reads exactly through the mount",
              np.array_equal(zarr.open_array(os.path.join(mnt, "sharded"), mode="r")[...], data))
    finally:
        subprocess.run([binary, "unmount", mnt], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)
    check(f"{label}: the sharded array reads exactly from the store after unmount",
          np.array_equal(zarr.open_array(store, path="sharded", mode="r")[...], data))
    checked = subprocess.run([binary, "check", source, *store_flags], capture_output=True, text=True)
    check(f"{label}: shardfs check: the store is healthy", checked.returncode == 0,
          (checked.stdout + checked.stderr)[-800:])


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()
    with tempfile.TemporaryDirectory(prefix="shardfs-suite-") as work:
        plain = os.path.join(work, "plain")
        os.makedirs(plain)
        control = run_suite(plain, os.path.join(work, "control.xml"))
        failed = sorted(n for n, o in control.items() if o == "failed")
        check("control: the suite passes on a plain directory", control and not failed, failed)

        # As written, and with the suite's arrays stored sharded (the view then shows them unsharded).
        for label, flags in (("mount", []), ("mount --shard-new 2", ["--shard-new", "2"])):
            sub = os.path.join(work, label.replace(" ", "_"))
            os.makedirs(sub)
            store = os.path.join(sub, "store")
            in_mount(binary, sub, store, store, [], flags, label, control, check)
        # A bucket: directories are renamed by copying (EXDEV), links are copies.
        sub = os.path.join(work, "s3")
        os.makedirs(sub)
        with Moto(sub) as endpoint:
            os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/suite", method="PUT")).close()
            bucket = obstore.store.S3Store("suite", prefix="store", endpoint=endpoint, client_options={"allow_http": True})
            in_mount(binary, sub, zarr.storage.ObjectStore(bucket), "s3://suite/store",
                     ["--endpoint-url", endpoint], [], "s3 mount", control, check)
    return check.summary("store suite")


if __name__ == "__main__":
    sys.exit(main())
