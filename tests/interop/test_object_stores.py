"""shardfs mounts a bucket of a real local server of each object-store service (object_stores.py):
S3 (moto), Azure Blob Storage (Azurite) and GCS (fake-gcs-server, read-only: it takes no XML PUT).
Every case runs on each service it applies to, named by it: ``-k "azure and refs"``.

zarr-python 3 (through obstore) writes every layout of tests/data/generate.py into the bucket, and
tensorstore its layouts (through its s3 kvstore, or where it has none for the service through a
local directory then uploaded); their unsharded twins go to a local directory. Then:
- a mount that cannot serve (no such bucket, no zarr.json, no server) is refused in one line;
- zarr-python and tensorstore read every array of the view exactly, and the view's chunk files,
  `cp -r` of it included, are the twin's;
- both peers write through the view; after unmount both read the bucket directly and get exactly
  that data, and no stray object is left; `shardfs check`, `info` and `compact` take the URL;
- `shardfs refs URL` names every chunk as [URL of its shard, offset, length], which resolved with
  ranged GETs is a store zarr-python reads every array of exactly;
- credentials as the service's own tools read them;
- (S3) a mount read once and then left idle asks the server nothing, and then reads the bucket
  as it is now;
- two mounts (as two machines) write interleaved chunks of the same shards with fsync after
  each: nothing is lost; kill -9 of a writing daemon loses no fsync'd chunk and tears no shard;
  the server stopped during commits: fsync fails while it is gone, and nothing is lost;
- damaged objects are EIO for their chunks, and everything else is served.

Runs in ``target/venv``. One case alone:
``target/venv/bin/python -m pytest tests/interop/test_object_stores.py -k "gcs and damaged"``.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import google_crc32c
import numpy as np
import obstore
import pytest
import shardfs
import tensorstore as ts
import zarr
from conftest import BINARY, ROOT

from object_stores import (BUCKET, SERVICES, daemon_pid, keys_below, serving, ts_spec, url, write_fixtures,
                           writing_store, zarr_store)
from peers import chunk_files, peers_write_regions
from ports import free_port, wait_for_port

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata")

sys.path.insert(0, str(ROOT / "tests/data"))
import generate  # noqa: E402

ARRAYS = [path for path, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]
ALL = list(SERVICES)
WRITABLE = [name for name, service in SERVICES.items() if service.takes_writes]


def on(names):
    """The case runs once on each of the services `names`."""
    return pytest.mark.parametrize("service", names, indirect=True)


@pytest.fixture(scope="module")
def service(request, tmp_path_factory):
    """The service's server, started with a bucket and its credentials in the environment."""
    server = SERVICES[request.param]()
    with serving(server, tmp_path_factory.mktemp(f"{server.name}-env")):
        yield server


def copy_prefix(service, source, target):
    """Every object below `source/`, copied below `target/` (object_store's server-side copy)."""
    objects = service.objects()
    for key in keys_below(service, source):
        obstore.copy(objects, key, target + key[len(source):])


class IdleMount:
    """A read-only mount through scripts/latency_proxy.py (no added latency), which logs every
    request: read once, then left alone while the other cases run. Once the kernel would ask
    again before using what it was told of the files (`fuse::CACHE_TTL`, 60 s), the mount asks
    the server nothing (it used to list the files it had shown, five times a second, for as long
    as the kernel held them)."""

    KERNEL_TTL = 60

    def __init__(self, service, work, prefix, stack):
        self.log, port = work / "idle-requests.log", free_port()
        upstream = urllib.parse.urlsplit(service.endpoint)
        proxy = subprocess.Popen([sys.executable, ROOT / "scripts/latency_proxy.py", "--upstream",
                                  f"127.0.0.1:{upstream.port}", "--rtt-ms", "0", "--port", str(port), "--log", self.log],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(proxy.wait)
        stack.callback(proxy.terminate)
        wait_for_port(port, "the request-logging proxy", proxy)
        endpoint = service.endpoint.replace(f":{upstream.port}", f":{port}", 1)
        # The array's own prefix: a pass over a prefix of more than 1,000 objects lists it at most
        # once a minute, which a few seconds' watch would miss.
        (work / "idle").mkdir()
        self.mnt = Path(stack.enter_context(shardfs.mount(url(service, prefix), work / "idle", read_only=True,
                                                          endpoint_url=endpoint)))
        self.asked_by_mounting = self.requests()
        zarr.open_array(self.mnt, mode="r")[...]
        subprocess.run(["ls", "-lR", self.mnt], check=True, capture_output=True)
        self.read_at = time.monotonic()

    def requests(self):
        return self.log.read_text().splitlines()


@pytest.fixture(scope="module")
def bucket(service, tmp_path_factory):
    """Every layout written into the bucket below ``sharded/``, with the unsharded twins. On S3,
    also the idle mount, made now so that the other cases' time is its idle time (the watcher is
    the same for every service: one idle mount is enough)."""
    work = tmp_path_factory.mktemp(service.name)
    twin = work / "unsharded"
    arrays = write_fixtures(service, "sharded", str(twin))
    with contextlib.ExitStack() as stack:
        idle = None
        if service.name == "s3":
            copy_prefix(service, f"sharded/{arrays[0]}", "idle")
            idle = IdleMount(service, work, "idle", stack)
        yield SimpleNamespace(service=service, work=work, twin=twin, arrays=arrays, idle=idle)


@pytest.fixture(scope="module")
def view(bucket):
    """The bucket's ``sharded/`` mounted: writable where the server takes writes."""
    service = bucket.service
    mnt = bucket.work / "view"
    mnt.mkdir()
    with shardfs.mount(url(service, "sharded"), mnt, endpoint_url=service.endpoint,
                       read_only=not service.takes_writes) as path:
        yield Path(path)


def in_bucket(service, path, prefix="sharded"):
    return zarr.open_array(zarr_store(service, prefix), path=path, mode="r")[...]


def shardfs_run(*args, env=None):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, env=env, timeout=120)


def refused_in_one_line(result, *needles):
    lines = result.stderr.strip().splitlines()
    return result.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles)


@on(ALL)
@pytest.mark.parametrize("cause", ["no such bucket", "no zarr.json at the prefix", "endpoint unreachable"])
def test_a_mount_that_cannot_serve_is_refused_in_one_line_naming_the_url(service, cause, tmp_path):
    where, endpoint, needle = {
        "no such bucket": (url(service, "x", "no-such-bucket"), service.endpoint, service.missing_bucket),
        "no zarr.json at the prefix": (url(service, "nothing-here"), service.endpoint, "zarr.json"),
        "endpoint unreachable": (url(service, "sharded"), service.endpoint.replace(str(service.port), str(free_port())),
                                 "error sending request"),
    }[cause]
    result = shardfs_run("mount", where, tmp_path, "--endpoint-url", endpoint)
    assert refused_in_one_line(result, where, needle), result.stderr
    assert not os.path.ismount(tmp_path)


@on([name for name in ALL if name not in WRITABLE])
def test_a_server_that_takes_no_writes_refuses_a_writable_mount_in_one_line(service, bucket, tmp_path):
    result = shardfs_run("mount", url(service, "sharded"), tmp_path, "--endpoint-url", service.endpoint)
    assert refused_in_one_line(result, "--read-only"), result.stderr
    assert not os.path.ismount(tmp_path)


@on(ALL)
@pytest.mark.parametrize("path", ARRAYS)
def test_zarr_python_reads_the_view(service, bucket, view, path):
    got = zarr.open_array(view / path, mode="r")
    assert "sharding_indexed" not in str(got.metadata.codecs)
    np.testing.assert_array_equal(got[...], in_bucket(service, path))


@on(ALL)
@pytest.mark.parametrize("path", ARRAYS)
def test_tensorstore_reads_the_view(service, bucket, view, path):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(view / path)}}
    np.testing.assert_array_equal(ts.open(spec, open=True, read=True).result().read().result(),
                                  in_bucket(service, path))


@on(ALL)
@pytest.mark.parametrize("path", ARRAYS)
def test_the_views_chunk_files_are_the_twins(service, bucket, view, path):
    got, want = chunk_files(view / path), chunk_files(bucket.twin / path)
    assert got == want, f"extra {sorted(got - want)[:5]} missing {sorted(want - got)[:5]}"


@on(ALL)
def test_cp_r_of_the_mounted_bucket_is_byte_for_byte_the_twin(service, bucket, view, tmp_path):
    copied = tmp_path / "copied"
    subprocess.run(["cp", "-r", view, copied], check=True)
    twin = bucket.twin
    assert chunk_files(copied) == chunk_files(twin)
    differ = [f for f in chunk_files(twin) if (twin / f).read_bytes() != (copied / f).read_bytes()]
    assert not differ


@on(ALL)
def test_tar_archives_the_mounted_bucket(service, bucket, view):
    result = subprocess.run(["tar", "-C", view, "-cf", "-", "."], capture_output=True)
    assert result.returncode == 0, result.stderr[-400:]


@on(WRITABLE)
def test_peers_write_through_the_view_into_the_bucket(service, bucket, tmp_path):
    """On a copy of the layouts (``written/``), so that the other cases see them as written."""
    copy_prefix(service, "sharded", "written")
    with shardfs.mount(url(service, "written"), tmp_path, endpoint_url=service.endpoint) as mnt:
        expected = peers_write_regions(mnt, ["zp/gzip_crc_end", "zp/zstd_start", "zp/keys/v2_dot", "zp/nested"],
                                       ["ts/zstd_crc", "ts/gzip_start_nocrc"])
    for path, data in expected.items():
        np.testing.assert_array_equal(in_bucket(service, path, "written"), data, err_msg=f"{path}: zarr-python")
        if ts_spec(service, path):
            got = ts.open(ts_spec(service, f"written/{path}"), open=True, read=True).result().read().result()
            np.testing.assert_array_equal(got, data, err_msg=f"{path}: tensorstore")
    # Temporary files, the journal: nothing but documents and shards.
    stray = [k for k in keys_below(service, "written") if not re.fullmatch(r"zarr\.json|c?[.\d]*\d", k.split("/")[-1])]
    assert not stray
    every_shard_decodes(service, "written")


@on(ALL)
def test_shardfs_check_takes_the_url(service, bucket):
    result = shardfs_run("check", url(service, "sharded"), "--endpoint-url", service.endpoint)
    assert result.returncode == 0, result.stdout[-400:] + result.stderr


@on(ALL)
def test_shardfs_info_takes_the_url(service, bucket):
    result = shardfs_run("info", url(service, "sharded"), "--endpoint-url", service.endpoint)
    assert result.returncode == 0 and "zp/nested" in result.stdout, result.stdout[-400:] + result.stderr


@on(ALL)
def test_shardfs_compact_takes_the_url(service, bucket):
    result = shardfs_run("compact", url(service, "sharded"), "--endpoint-url", service.endpoint)
    if service.takes_writes:
        # Object shards hold no unused bytes: nothing to free.
        assert result.returncode == 0, result.stdout[-400:] + result.stderr
    else:
        assert refused_in_one_line(result, "--read-only"), result.stderr


@on(ALL)
def test_refs_of_a_bucket_resolve_to_every_array_exactly(service, bucket):
    """`shardfs refs` of a bucket: every chunk a range of an object of that bucket, and what the
    references resolve to (ranged GETs) is a store zarr-python reads every array of exactly."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    where, root = url(service, "sharded"), url(service, "")
    run = shardfs_run("refs", where, "--endpoint-url", service.endpoint)
    assert run.returncode == 0 and not run.stderr, run.stderr[-400:]
    refs = json.loads(run.stdout)["refs"]
    objects = set(keys_below(service, "sharded"))
    ranges = [r for r in refs.values() if isinstance(r, list) and len(r) == 3]
    assert ranges and all(r[0].startswith(where + "/") and r[0][len(root):] in objects for r in ranges)
    resolved = {}
    for key, ref in refs.items():
        if isinstance(ref, str):
            data = ref.encode()
        elif len(ref) == 3:
            data = bytes(obstore.get_range(service.objects(), ref[0][len(root):], start=ref[1], length=ref[2]))
        else:
            data = bytes(obstore.get(service.objects(), ref[0][len(root):]).bytes())
        resolved[key] = default_buffer_prototype().buffer.from_bytes(data)
    store = MemoryStore(resolved)
    for path in bucket.arrays:
        got = zarr.open_array(store, path=path, mode="r")
        assert "sharding_indexed" not in str(got.metadata.codecs)
        np.testing.assert_array_equal(got[...], in_bucket(service, path), err_msg=path)


def without(prefix, **extra):
    """This environment without the variables starting with `prefix`, plus `extra`."""
    return dict({k: v for k, v in os.environ.items() if not k.startswith(prefix)}, **extra)


@pytest.fixture
def aws_home(tmp_path):
    """A home directory with an empty ~/.aws, and an environment with no AWS variables."""
    (tmp_path / ".aws").mkdir()
    return tmp_path


@on(["s3"])
def test_s3_without_credentials_anywhere_is_refused_in_one_line(service, bucket, aws_home):
    result = shardfs_run("info", url(service, "sharded"), "--endpoint-url", service.endpoint,
                         env=without("AWS_", HOME=str(aws_home)))
    assert refused_in_one_line(result, "no AWS credentials"), result.stderr


@on(["s3"])
def test_s3_takes_the_aws_profiles_keys_and_region_from_the_aws_files(service, bucket, aws_home):
    (aws_home / ".aws/credentials").write_text(
        "[default]\naws_access_key_id = wrong\n[lab]\naws_access_key_id = test\naws_secret_access_key = test\n")
    (aws_home / ".aws/config").write_text("[profile lab]\nregion = us-east-1\n")
    result = shardfs_run("info", url(service, "sharded"), "--endpoint-url", service.endpoint,
                         env=without("AWS_", HOME=str(aws_home), AWS_PROFILE="lab"))
    assert result.returncode == 0, result.stderr


@on(["s3"])
def test_s3_no_sign_request_reads_a_public_bucket_without_credentials(service, bucket, aws_home):
    import boto3

    s3 = boto3.client("s3", endpoint_url=service.endpoint)
    s3.create_bucket(Bucket="public", ACL="public-read")
    for key in keys_below(service, "sharded/zp/raw_nocrc"):
        s3.put_object(Bucket="public", Key=key, Body=bytes(obstore.get(service.objects(), key).bytes()),
                      ACL="public-read")
    result = shardfs_run("info", "s3://public/sharded/zp/raw_nocrc", "--endpoint-url", service.endpoint,
                         "--no-sign-request", env=without("AWS_", HOME=str(aws_home)))
    assert result.returncode == 0, result.stderr


def azure_info(service, env, *flags):
    return shardfs_run("info", url(service, "sharded/zp/raw_nocrc"), *flags, env=without("AZURE_", **env))


@on(["azure"])
def test_azure_without_the_account_key_is_refused_in_one_line(service, bucket):
    result = azure_info(service, {"AZURE_STORAGE_ACCOUNT_NAME": service.ACCOUNT}, "--endpoint-url", service.endpoint)
    assert refused_in_one_line(result, "no Azure credentials"), result.stderr


@on(["azure"])
def test_azure_storage_sas_token_reads_the_container(service, bucket):
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(service.ACCOUNT, BUCKET, account_key=service.KEY,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    result = azure_info(service, {"AZURE_STORAGE_ACCOUNT_NAME": service.ACCOUNT, "AZURE_STORAGE_SAS_TOKEN": sas},
                        "--endpoint-url", service.endpoint)
    assert result.returncode == 0, result.stderr


@on(["azure"])
def test_azure_storage_use_emulator_with_azurite_blob_storage_url_needs_no_key(service, bucket):
    result = azure_info(service, {"AZURE_STORAGE_USE_EMULATOR": "true",
                                  "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{service.port}"})
    assert result.returncode == 0, result.stderr


@on(["azure"])
def test_azure_storage_use_emulator_with_endpoint_url_needs_no_key(service, bucket):
    result = azure_info(service, {"AZURE_STORAGE_USE_EMULATOR": "true"}, "--endpoint-url", service.endpoint)
    assert result.returncode == 0, result.stderr


@on(["azure"])
def test_azure_https_account_url_names_the_same_store(service, bucket):
    https = f"https://{service.ACCOUNT}.blob.core.windows.net/{BUCKET}/sharded/zp/raw_nocrc"
    result = shardfs_run("info", https, "--endpoint-url", service.endpoint)
    assert result.returncode == 0, result.stderr


@on(["gcs"])
def test_gcs_google_service_account_names_the_account_file_and_its_base_url(service, bucket, tmp_path):
    """As object_store reads it: no --endpoint-url needed. Its key must be a real one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    account = tmp_path / "service-account.json"
    account.write_text(json.dumps(dict(service.account(), private_key=key.decode(), client_email="test@example.com")))
    result = shardfs_run("info", url(service, "sharded/zp/raw_nocrc"),
                         env=without("GOOGLE_", GOOGLE_SERVICE_ACCOUNT=str(account)))
    assert result.returncode == 0, result.stderr


@on(["s3"])
def test_mounting_asks_the_server_once_what_the_root_holds_and_reads_its_zarr_json(service, bucket):
    """Mounting lists the root once and reads its zarr.json: what the root holds (an Icechunk
    repository's files or not, zarr.json's version) comes from that listing, and the store is
    opened in the daemon alone (it was opened in the command too: 14 requests before any chunk)."""
    asked = bucket.idle.asked_by_mounting
    assert len(asked) == 2, asked
    assert "list-type=2" in asked[0] and "zarr.json" in asked[1], asked


@on(["s3"])
def test_a_mount_left_idle_asks_the_server_nothing_and_then_reads_the_bucket_as_it_is(service, bucket):
    idle = bucket.idle
    # The watcher's passes come a second or more apart (more when a pass takes long: it paces
    # itself), so the last one may come a few seconds past the kernel's 60 s.
    time.sleep(max(0.0, idle.read_at + idle.KERNEL_TTL + 15 - time.monotonic()))
    before = len(idle.requests())
    time.sleep(5)
    asked = idle.requests()[before:]
    assert not asked, f"{len(asked)} requests in 5 s: {asked[:5]}"
    array = zarr.open_array(zarr_store(service, "idle"), mode="r+")
    array[...] = array[...] + 1
    np.testing.assert_array_equal(zarr.open_array(idle.mnt, mode="r")[...], array[...])
    assert len(idle.requests()) > before


def make_raw_array(service, prefix):
    """uint8, no compression: a chunk file is its 16 raw bytes. 2 shards of 16 chunks each."""
    return zarr.create_array(store=zarr_store(service, prefix), shape=(16, 32), chunks=(4, 4), shards=(16, 16),
                             dtype="uint8", compressors=None, fill_value=0)


def write_chunk(mnt, i, j, data, sync):
    """Writes chunk (i, j) as a writer of per-chunk files does: directory first, then the file."""
    os.makedirs(os.path.join(mnt, "c", str(i)), exist_ok=True)
    f = open(os.path.join(mnt, "c", str(i), str(j)), "wb")
    f.write(data)
    if sync:
        f.flush()
        os.fsync(f.fileno())
    return f


def chunk_bytes(writer, i, j):
    return bytes([(writer * 64 + i * 8 + j) % 256]) * 16


def lost_chunks(service, prefix, written):
    got = zarr.open_array(zarr_store(service, prefix), mode="r")[...]
    return [k for k, v in written.items() if got[k[0] * 4, k[1] * 4] != v[0]]


def every_shard_decodes(service, prefix):
    result = shardfs_run("check", url(service, prefix), "--endpoint-url", service.endpoint)
    assert result.returncode == 0, result.stdout + result.stderr


@on(WRITABLE)
def test_two_mounts_writing_interleaved_chunks_of_the_same_shards_lose_nothing(service, bucket, tmp_path):
    make_raw_array(service, "two")
    written = {}
    with contextlib.ExitStack() as stack:
        mounts = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            mounts.append(stack.enter_context(shardfs.mount(url(service, "two"), tmp_path / name,
                                                            endpoint_url=service.endpoint)))
        for i in range(4):
            for j in range(8):
                who = (i + j) % 2
                write_chunk(mounts[who], i, j, chunk_bytes(who, i, j), sync=True).close()
                written[(i, j)] = chunk_bytes(who, i, j)
    assert not lost_chunks(service, "two", written)


@on(WRITABLE)
def test_kill_9_of_a_writing_daemon_loses_no_fsynced_chunk_and_tears_no_shard(service, bucket, tmp_path):
    make_raw_array(service, "killed")
    synced = {}
    with shardfs.mount(url(service, "killed"), tmp_path, endpoint_url=service.endpoint) as mnt:
        pid = daemon_pid(mnt)
        for n in range(32):
            i, j = divmod(n, 8)
            write_chunk(mnt, i, j, chunk_bytes(1, i, j), sync=n % 3 == 0).close()
            if n % 3 == 0:
                synced[(i, j)] = chunk_bytes(1, i, j)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    assert not lost_chunks(service, "killed", synced)
    every_shard_decodes(service, "killed")


@on(WRITABLE)
def test_the_server_gone_during_commits_fails_fsync_and_loses_nothing(service, bucket, tmp_path):
    make_raw_array(service, "outage")
    written = {(0, j): chunk_bytes(2, 0, j) for j in range(8)}
    with shardfs.mount(url(service, "outage"), tmp_path, endpoint_url=service.endpoint,
                       commit_idle_ms=600000) as mnt:
        files = [write_chunk(mnt, i, j, data, sync=False) for (i, j), data in written.items()]
        service.stop()
        failed = 0
        try:
            for f in files:
                try:
                    f.flush()
                    os.fsync(f.fileno())
                except OSError:
                    failed += 1
        finally:
            service.start()
            # Closed before anything can fail: an open file would keep the mount busy.
            for f in files:
                with contextlib.suppress(OSError):
                    f.close()
        write_chunk(mnt, 3, 7, chunk_bytes(2, 3, 7), sync=True).close()
        written[(3, 7)] = chunk_bytes(2, 3, 7)
    # Rather than claim durability.
    assert failed > 0, f"none of {len(files)} fsyncs failed with the server gone"
    # Back: the writes made while it was gone are committed.
    assert not lost_chunks(service, "outage", written)
    every_shard_decodes(service, "outage")


@on(ALL)
def test_damaged_objects_are_eio_for_their_chunks_and_the_rest_is_served(service, bucket, tmp_path):
    with writing_store(service, "damaged") as store:
        arr = zarr.create_array(store=store, shape=(16, 64), chunks=(4, 4), shards=(16, 16), dtype="uint8",
                                compressors=None, fill_value=0)
        arr[...] = 9
    objects = service.objects()

    def shard(j):
        return bytearray(obstore.get(objects, f"damaged/c/0/{j}").bytes())

    truncated = shard(0)
    service.put("damaged/c/0/0", bytes(truncated[: len(truncated) // 2]))  # the index is gone
    bad_crc = shard(1)
    bad_crc[-1] ^= 0xFF
    service.put("damaged/c/0/1", bytes(bad_crc))
    past = shard(2)
    index = len(past) - (16 * 16 + 4)
    past[index:index + 8] = (10**9).to_bytes(8, "little")  # entry 0 starts past the end
    past[-4:] = google_crc32c.value(bytes(past[index:-4])).to_bytes(4, "little")  # with a valid checksum
    service.put("damaged/c/0/2", bytes(past))
    results = {}
    with shardfs.mount(url(service, "damaged"), tmp_path, endpoint_url=service.endpoint, read_only=True) as mnt:
        for j in range(4):
            try:
                results[j] = (Path(mnt) / "c/0" / str(4 * j)).read_bytes()
            except OSError as e:
                results[j] = e.errno
    assert [results[0], results[1], results[2]] == [5, 5, 5], results
    assert results[3] == bytes([9]) * 16
