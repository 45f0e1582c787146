"""What every interop test shares: the shardfs binary under test (``SHARDFS_BINARY``, else
``target/debug/shardfs``) found by the project's own ``shardfs_mount`` fixture, the FUSE check
(every case but those marked ``no_fuse`` skipped loudly without ``/dev/fuse``, failed with
``SHARDFS_REQUIRE_FUSE=1``), and the servers (moto,
nginx), each started once per session and stopped however the run ends.

Run by ``scripts/test.sh`` in the venv each peer needs; one case alone:
``target/venv-kerchunk/bin/python -m pytest tests/interop/test_kerchunk.py -k parquet``.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from ports import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
pytest_plugins = ["shardfs.pytest_plugin"]
# zarr-python's store suite, which test_store_suite.py runs inside mounts, not as it stands.
collect_ignore = ["store_suite"]

BINARY = Path(os.environ.get("SHARDFS_BINARY", ROOT / "target/debug/shardfs")).resolve()
os.environ["PATH"] = f"{BINARY.parent}{os.pathsep}{os.environ['PATH']}"


def fuse_usable() -> bool:
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
        return True
    except OSError:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "no_fuse: the case mounts nothing (shardfs refs), and runs without FUSE")


def pytest_collection_modifyitems(config, items):
    if fuse_usable():
        return
    if os.environ.get("SHARDFS_REQUIRE_FUSE") == "1":
        raise pytest.UsageError("SHARDFS_REQUIRE_FUSE=1 but /dev/fuse cannot be opened")
    print("\n*** SKIPPING the mount tests: /dev/fuse cannot be opened on this machine ***", file=sys.stderr)
    # Every other case mounts, through the fixture or shardfs.mount.
    skip = pytest.mark.skip(reason="/dev/fuse cannot be opened")
    for item in items:
        if item.get_closest_marker("no_fuse") is None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_mount_left(tmp_path):
    """Whatever a case left mounted in its temporary directory is unmounted, lazily, and its
    daemon with it, however the case ends: an unmount that fails (writes that could not be
    committed) leaves the mount to its caller, and a mount left busy breaks later runs."""
    yield
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(str(tmp_path)):
            subprocess.run(["fusermount3", "-uz", point], capture_output=True)


class S3Server:
    """A local S3 server (moto) that takes unsigned requests, as moto does."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def put(self, path: str, data: bytes = b"") -> None:
        # Not urllib's default form type, which the server would parse as a form.
        request = urllib.request.Request(f"{self.endpoint}/{path}", data=data, method="PUT",
                                         headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto, from ``SHARDFS_MOTO`` (default ``target/venv/bin/moto_server``), with test
    credentials in the environment for the daemons the tests start."""
    moto = os.environ.get("SHARDFS_MOTO", str(ROOT / "target/venv/bin/moto_server"))
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, "moto")
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


DAV_EXT = "/usr/lib/nginx/modules/ngx_http_dav_ext_module.so"


class Nginx:
    """nginx (Debian's, installed by scripts/setup.sh) serving `root` on three loopback ports:
    `dav` lists with WebDAV's PROPFIND (the dav_ext module), `plain` does not (it answers PROPFIND
    405), and `no_etag` neither lists nor gives ETags (only Last-Modified)."""

    def __init__(self, root: Path, work: Path):
        self.root = root
        self.dav, self.plain, self.no_etag = free_port(), free_port(), free_port()
        conf = work / "nginx.conf"
        temp = "\n".join(f"  {kind}_temp_path {work}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # Workers of a root master would run as nobody, which cannot read the temporary directory.
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(f"""daemon off;
{user}
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
load_module {DAV_EXT};
events {{}}
http {{
  access_log off;
{temp}
  server {{ listen 127.0.0.1:{self.dav}; root {root}; dav_ext_methods PROPFIND OPTIONS; }}
  server {{ listen 127.0.0.1:{self.plain}; root {root}; }}
  server {{ listen 127.0.0.1:{self.no_etag}; root {root}; etag off; }}
}}
""")
        self.process = subprocess.Popen(["nginx", "-c", conf, "-e", f"{work}/nginx-error.log"])
        deadline = time.monotonic() + 10
        while not all(self.listening(p) for p in (self.dav, self.plain, self.no_etag)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"nginx did not start: {(work / 'nginx-error.log').read_text()}")
            time.sleep(0.05)

    @staticmethod
    def listening(port):
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    """nginx serving the directory ``nginx.root`` (empty at first: tests put what they serve
    there), stopped however the run ends."""
    work = tmp_path_factory.mktemp("nginx")
    (work / "root").mkdir()
    server = Nginx(work / "root", work)
    try:
        yield server
    finally:
        server.stop()


def read_errno(path):
    """The error number reading the file at `path` fails with, or None when it reads."""
    try:
        Path(path).read_bytes()
    except OSError as e:
        return e.errno
    return None


V2_PYTHON = ROOT / "target/venv-v2/bin/python"

# Run by zarr-python 2.18: each array of argv[1] against the .npy files in argv[2].
V2_READER = r"""
import json, sys, numpy as np, zarr
mnt, expected = sys.argv[1], sys.argv[2]
result = {}
for n, path in enumerate(json.load(open(expected + "/arrays.json"))):
    want = np.load(f"{expected}/{n}.npy")
    try:
        result[path] = bool(np.array_equal(zarr.open_array(f"{mnt}/{path}", mode="r")[...], want))
    except Exception as e:
        result[path] = repr(e)
print(json.dumps(result))
"""


def zarr2_reads(view, arrays, work):
    """Which of `arrays` (path -> what it holds) zarr-python 2.18 (target/venv-v2) reads exactly
    from the Zarr v2 store at `view`: path -> True, or the reader's error. `work`: a directory
    for the expected arrays."""
    work = Path(work)
    for n, data in enumerate(arrays.values()):
        np.save(work / f"{n}.npy", data)
    (work / "arrays.json").write_text(json.dumps(list(arrays)))
    run = subprocess.run([V2_PYTHON, "-c", V2_READER, view, work], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-800:]
    return json.loads(run.stdout)
