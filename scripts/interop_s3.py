"""Interop test for object stores: shardfs mounts a bucket of a real local S3 server (moto).

    target/venv/bin/python scripts/interop_s3.py [path/to/shardfs]

A moto server on a free loopback port (in this process, so that it can be stopped and started
again with its data) holds a bucket into which zarr-python 3 (through obstore) and tensorstore
(its s3 kvstore) write every layout of tests/data/generate.py; their unsharded twins are written
to a local directory. Then:
- errors before mounting (no such bucket, no zarr.json, no server) are one line and exit 1;
- shardfs mounts s3://BUCKET/PREFIX; zarr-python and tensorstore read every array of the view
  exactly, and the view's chunk files are the twin's;
- both peers write through the view; after unmount both read the bucket directly and get exactly
  that data, no stray object is left, and `shardfs check`, `info` and `compact` take the URL;
- `shardfs refs s3://...` names every chunk as [s3://BUCKET/KEY of its shard, offset, length]:
  resolved with ranged GETs (boto3; s3fs, fsspec's S3 client, is not installed: its aiobotocore
  pins botocore, which moto needs at its own version), they are a store zarr-python reads every
  array of exactly;
- two mounts of one prefix (two daemons: as two machines) write interleaved chunks of the same
  shards with fsync after each: nothing is lost;
- kill -9 of a daemon while it writes: every fsync'd chunk is in the bucket, and every shard
  decodes (`shardfs check`);
- the server stopped during commits and started again: fsync fails while it is gone, nothing is
  lost, no shard is torn;
- damaged objects (truncated, bad index checksum, entries past the end): EIO for those chunks,
  everything else served.
"""

import contextlib
import gzip
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from unittest import mock

import boto3
import google_crc32c
import numpy as np
import tensorstore as ts
import zarr
from moto.server import ThreadedMotoServer
from obstore.store import S3Store
from zarr.storage import ObjectStore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import generate  # noqa: E402
from interop import chunk_files, peers_write_regions  # noqa: E402
from checks import Checks

warnings.filterwarnings("ignore", message="Consolidated metadata")
logging.getLogger("werkzeug").setLevel(logging.ERROR)
BUCKET = "interop"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A moto S3 server on loopback; its data outlives stop() and start()."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.moto = None

    def start(self):
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.moto.start()

    def stop(self):
        if self.moto:
            self.moto.stop()
            self.moto = None


def zarr_store(server, prefix):
    s3 = S3Store(BUCKET, prefix=prefix, endpoint=server.endpoint, region="us-east-1", access_key_id="test",
                 secret_access_key="test", client_options={"allow_http": True})
    return ObjectStore(s3)


def ts_spec(server, path):
    return {"driver": "zarr3", "kvstore": {"driver": "s3", "bucket": BUCKET, "path": path.rstrip("/") + "/",
                                           "endpoint": server.endpoint, "aws_region": "us-east-1",
                                           "aws_credentials": {"type": "environment"}}}


def write_fixtures(server, prefix, twin):
    """Every layout of generate.py: sharded into the bucket, the unsharded twins into `twin`."""
    # numcodecs' gzip stamps each chunk with the current second; the two copies, written one
    # after the other, must not differ by a second boundary falling between them.
    with mock.patch.object(gzip, "time", FixedClock):
        return write_both(server, prefix, twin)


class FixedClock:
    @staticmethod
    def time():
        return 1_700_000_000.0


def write_both(server, prefix, twin):
    store = zarr_store(server, prefix)
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
    for path, sharded, unsharded, data in generate.tensorstore_arrays():
        spec = dict(ts_spec(server, f"{prefix}/{path}"), metadata=dict(sharded, attributes={"written_by": "tensorstore"}))
        ts.open(spec, create=True, delete_existing=True).result()[...].write(data).result()
        generate.write_tensorstore(twin, path, unsharded, data)
    zarr.consolidate_metadata(store)
    return [p for p, *_ in generate.zarr_python_arrays() + generate.tensorstore_arrays()]


class Mounts:
    """Mounts made during the test, each unmounted however the test ends."""

    def __init__(self, binary, server):
        self.binary, self.server, self.points = binary, server, []

    def mount(self, url, mnt, *flags):
        os.makedirs(mnt, exist_ok=True)
        subprocess.run([self.binary, "mount", url, mnt, "--endpoint-url", self.server.endpoint, *flags], check=True)
        self.points.append(mnt)
        return mnt

    def unmount(self, mnt):
        subprocess.run([self.binary, "unmount", mnt], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)
        self.points.remove(mnt)

    def close(self):
        for mnt in list(self.points):
            self.unmount(mnt)


def daemon_pid(mnt):
    out = subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt} "], capture_output=True, text=True).stdout.split()
    out += subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt}$"], capture_output=True, text=True).stdout.split()
    return int(out[0])


def errors_before_mounting(binary, server, work, check):
    mnt = os.path.join(work, "never")
    os.makedirs(mnt)
    for what, url, endpoint, needle in [
        ("no such bucket", "s3://no-such-bucket/x", server.endpoint, "no such bucket"),
        ("no zarr.json at the prefix", f"s3://{BUCKET}/nothing-here", server.endpoint, "zarr.json"),
        ("endpoint unreachable", f"s3://{BUCKET}/sharded", f"http://127.0.0.1:{free_port()}", "error sending request"),
    ]:
        result = subprocess.run([binary, "mount", url, mnt, "--endpoint-url", endpoint], capture_output=True, text=True)
        lines = result.stderr.strip().splitlines()
        check(f"mount refused: {what}: exit 1, one line naming the URL and the cause",
              result.returncode == 1 and len(lines) == 1 and url in lines[0] and needle in lines[0] and not os.path.ismount(mnt),
              result.stderr)


def read_and_write_through_the_view(mounts, server, work, arrays, check):
    twin, mnt = os.path.join(work, "unsharded"), os.path.join(work, "mnt")
    mounts.mount(f"s3://{BUCKET}/sharded", mnt)
    for path in arrays:
        expected = zarr.open_array(zarr_store(server, "sharded"), path=path, mode="r")[...]
        view = zarr.open_array(os.path.join(mnt, path), mode="r")
        check(f"{path}: zarr-python reads the view of the bucket",
              "sharding_indexed" not in str(view.metadata.codecs) and np.array_equal(view[...], expected, equal_nan=True))
        local = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}}
        got = ts.open(local, open=True, read=True).result().read().result()
        check(f"{path}: tensorstore reads the view of the bucket", np.array_equal(got, expected, equal_nan=True))
        got, want = chunk_files(os.path.join(mnt, path)), chunk_files(os.path.join(twin, path))
        check(f"{path}: chunk files are the twin's", got == want, f"extra {sorted(got - want)[:5]} missing {sorted(want - got)[:5]}")
    copied = os.path.join(work, "copied")
    subprocess.run(["cp", "-r", mnt, copied], check=True)
    differ = [f for f in chunk_files(twin) ^ chunk_files(copied)]
    differ += [f for f in chunk_files(twin) & chunk_files(copied)
               if open(os.path.join(twin, f), "rb").read() != open(os.path.join(copied, f), "rb").read()]
    check("cp -r of the mounted bucket: the chunk files are byte for byte the twin's", not differ, str(differ[:5]))
    listing = subprocess.run(["tar", "-C", mnt, "-cf", "-", "."], capture_output=True).returncode
    check("tar of the mounted bucket", listing == 0)
    expected = peers_write_regions(mnt, ["zp/gzip_crc_end", "zp/zstd_start", "zp/keys/v2_dot", "zp/nested"],
                                   ["ts/zstd_crc", "ts/gzip_start_nocrc"], check)
    mounts.unmount(mnt)
    for path, data in expected.items():
        got = zarr.open_array(zarr_store(server, "sharded"), path=path, mode="r")[...]
        check(f"{path}: zarr-python reads the written data from the bucket", np.array_equal(got, data, equal_nan=True))
        got = ts.open(ts_spec(server, f"sharded/{path}"), open=True, read=True).result().read().result()
        check(f"{path}: tensorstore reads the written data from the bucket", np.array_equal(got, data, equal_nan=True))
    s3 = boto3.client("s3", endpoint_url=server.endpoint)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="sharded/")
            for o in page.get("Contents", [])]
    stray = [k for k in keys if not re.fullmatch(r"zarr\.json|c?[.\d]*\d", k.split("/")[-1])]
    check("no stray objects are left in the bucket (temporary files, journal)", not stray, str(stray[:5]))


def commands_take_urls(binary, server, check):
    url, flags = f"s3://{BUCKET}/sharded", ["--endpoint-url", server.endpoint]
    result = subprocess.run([binary, "check", url, *flags], capture_output=True, text=True)
    check("shardfs check s3://... passes", result.returncode == 0, result.stdout[-400:] + result.stderr)
    result = subprocess.run([binary, "info", url, *flags], capture_output=True, text=True)
    check("shardfs info s3://... lists the arrays", result.returncode == 0 and "zp/nested" in result.stdout,
          result.stdout[-400:] + result.stderr)
    result = subprocess.run([binary, "compact", url, *flags], capture_output=True, text=True)
    check("shardfs compact s3://... has nothing to free (object shards hold no unused bytes)", result.returncode == 0,
          result.stdout[-400:] + result.stderr)


def references_of_a_bucket(binary, server, arrays, check):
    """`shardfs refs` of a bucket: every chunk a range of an object of that bucket, and what the
    references resolve to is a store zarr-python reads every array of exactly."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    url = f"s3://{BUCKET}/sharded"
    run = subprocess.run([binary, "refs", url, "--endpoint-url", server.endpoint], capture_output=True, text=True)
    check("shardfs refs s3://... succeeds", run.returncode == 0 and not run.stderr, run.stderr[-400:])
    if run.returncode != 0:
        return
    refs = json.loads(run.stdout)["refs"]
    s3 = boto3.client("s3", endpoint_url=server.endpoint)
    objects = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="sharded/")
               for o in page.get("Contents", [])}
    ranges = [r for r in refs.values() if isinstance(r, list) and len(r) == 3]
    check(f"refs of a bucket: {len(ranges)} chunk ranges, each in an object of s3://{BUCKET}/sharded/",
          ranges and all(r[0].startswith(url + "/") and r[0][len(f"s3://{BUCKET}/"):] in objects for r in ranges))
    resolved = {}
    for key, ref in refs.items():
        if isinstance(ref, str):
            data = ref.encode()
        else:
            get = {"Bucket": BUCKET, "Key": ref[0][len(f"s3://{BUCKET}/"):]}
            if len(ref) == 3:
                get["Range"] = f"bytes={ref[1]}-{ref[1] + ref[2] - 1}"
            data = s3.get_object(**get)["Body"].read()
        resolved[key] = default_buffer_prototype().buffer.from_bytes(data)
    store = MemoryStore(resolved)
    for path in arrays:
        want = zarr.open_array(zarr_store(server, "sharded"), path=path, mode="r")[...]
        got = zarr.open_array(store, path=path, mode="r")
        check(f"{path}: zarr-python reads the bucket's references exactly",
              "sharding_indexed" not in str(got.metadata.codecs) and np.array_equal(got[...], want, equal_nan=True))


def credentials_as_the_aws_cli_reads_them(binary, server, work, check):
    """Without keys in the environment: the profile's static keys and region, or unsigned requests."""
    url = f"s3://{BUCKET}/sharded"
    bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    bare["HOME"] = os.path.join(work, "home")
    os.makedirs(os.path.join(bare["HOME"], ".aws"), exist_ok=True)
    info = lambda env, *flags: subprocess.run([binary, "info", url, "--endpoint-url", server.endpoint, *flags],  # noqa: E731
                                              capture_output=True, text=True, env=env, timeout=60)
    result = info(bare)
    check("no credentials anywhere: refused with one line that says so",
          result.returncode == 1 and len(result.stderr.splitlines()) == 1 and "no AWS credentials" in result.stderr,
          result.stderr)
    with open(os.path.join(bare["HOME"], ".aws", "credentials"), "w") as f:
        f.write("[default]\naws_access_key_id = wrong\n[lab]\naws_access_key_id = test\naws_secret_access_key = test\n")
    with open(os.path.join(bare["HOME"], ".aws", "config"), "w") as f:
        f.write("[profile lab]\nregion = us-east-1\n")
    result = info(dict(bare, AWS_PROFILE="lab"))
    check("AWS_PROFILE's keys and region from ~/.aws/credentials and ~/.aws/config", result.returncode == 0, result.stderr)
    s3 = boto3.client("s3", endpoint_url=server.endpoint)
    s3.create_bucket(Bucket="public", ACL="public-read")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="sharded/zp/raw_nocrc/"):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            s3.put_object(Bucket="public", Key=o["Key"], Body=body, ACL="public-read")
    public = [binary, "info", "s3://public/sharded/zp/raw_nocrc", "--endpoint-url", server.endpoint]
    result = subprocess.run(public + ["--no-sign-request"], capture_output=True, text=True, env=bare, timeout=60)
    check("--no-sign-request reads a public bucket without credentials", result.returncode == 0, result.stderr)


def make_raw_array(server, prefix):
    """uint8, no compression: a chunk file is its 16 raw bytes. 2 shards of 16 chunks each."""
    return zarr.create_array(store=zarr_store(server, prefix), shape=(16, 32), chunks=(4, 4), shards=(16, 16),
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


def two_mounts_write_one_shard(mounts, server, work, check):
    make_raw_array(server, "two")
    a = mounts.mount(f"s3://{BUCKET}/two", os.path.join(work, "mnt-a"))
    b = mounts.mount(f"s3://{BUCKET}/two", os.path.join(work, "mnt-b"))
    written = {}
    for i in range(4):
        for j in range(8):
            who = (i + j) % 2
            write_chunk((a, b)[who], i, j, chunk_bytes(who, i, j), sync=True).close()
            written[(i, j)] = chunk_bytes(who, i, j)
    mounts.unmount(a)
    mounts.unmount(b)
    got = zarr.open_array(zarr_store(server, "two"), mode="r")[...]
    lost = [k for k, v in written.items() if got[k[0] * 4, k[1] * 4] != v[0]]
    check("two mounts writing interleaved chunks of the same shards, fsync after each: nothing lost",
          not lost, f"lost {lost[:8]}")


def kill_a_writing_daemon(mounts, binary, server, work, check):
    make_raw_array(server, "killed")
    mnt = mounts.mount(f"s3://{BUCKET}/killed", os.path.join(work, "mnt-killed"))
    pid = daemon_pid(mnt)
    synced = {}
    for n in range(32):
        i, j = divmod(n, 8)
        write_chunk(mnt, i, j, chunk_bytes(1, i, j), sync=n % 3 == 0).close()
        if n % 3 == 0:
            synced[(i, j)] = chunk_bytes(1, i, j)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    mounts.unmount(mnt)
    got = zarr.open_array(zarr_store(server, "killed"), mode="r")[...]
    lost = [k for k, v in synced.items() if got[k[0] * 4, k[1] * 4] != v[0]]
    check("kill -9 of a writing daemon: every fsync'd chunk is in the bucket", not lost, f"lost {lost}")
    result = subprocess.run([binary, "check", f"s3://{BUCKET}/killed", "--endpoint-url", server.endpoint],
                            capture_output=True, text=True)
    check("kill -9 of a writing daemon: every shard decodes", result.returncode == 0, result.stdout + result.stderr)


def server_gone_during_commits(mounts, binary, server, work, check):
    make_raw_array(server, "outage")
    mnt = mounts.mount(f"s3://{BUCKET}/outage", os.path.join(work, "mnt-outage"), "--commit-idle-ms", "600000")
    files = []
    for j in range(8):
        files.append(write_chunk(mnt, 0, j, chunk_bytes(2, 0, j), sync=False))
    server.stop()
    failed = 0
    try:
        for f in files:
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                failed += 1
    finally:
        server.start()
    check("server gone: fsync fails rather than claim durability", failed > 0, f"{failed} of {len(files)} failed")
    for f in files:
        with contextlib.suppress(OSError):
            f.close()
    write_chunk(mnt, 3, 7, chunk_bytes(2, 3, 7), sync=True).close()
    mounts.unmount(mnt)
    got = zarr.open_array(zarr_store(server, "outage"), mode="r")[...]
    lost = [j for j in range(8) if got[0, j * 4] != chunk_bytes(2, 0, j)[0]] + ([] if got[12, 28] == chunk_bytes(2, 3, 7)[0] else ["3/7"])
    check("server back: the writes made while it was gone are committed, nothing lost", not lost, f"lost {lost}")
    result = subprocess.run([binary, "check", f"s3://{BUCKET}/outage", "--endpoint-url", server.endpoint],
                            capture_output=True, text=True)
    check("server back: no torn shard", result.returncode == 0, result.stdout + result.stderr)


def damaged_objects(mounts, server, work, check):
    arr = zarr.create_array(store=zarr_store(server, "damaged"), shape=(16, 64), chunks=(4, 4), shards=(16, 16),
                            dtype="uint8", compressors=None, fill_value=0)
    arr[...] = 9
    s3 = boto3.client("s3", endpoint_url=server.endpoint)
    key = lambda j: f"damaged/c/0/{j}"  # noqa: E731
    whole = s3.get_object(Bucket=BUCKET, Key=key(0))["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=key(0), Body=whole[: len(whole) // 2])  # truncated: the index is gone
    bad_crc = bytearray(s3.get_object(Bucket=BUCKET, Key=key(1))["Body"].read())
    bad_crc[-1] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=key(1), Body=bytes(bad_crc))
    past = bytearray(s3.get_object(Bucket=BUCKET, Key=key(2))["Body"].read())
    index = len(past) - (16 * 16 + 4)
    past[index:index + 8] = (10**9).to_bytes(8, "little")  # entry 0 starts past the end
    past[-4:] = google_crc32c.value(bytes(past[index:-4])).to_bytes(4, "little")  # with a valid checksum
    s3.put_object(Bucket=BUCKET, Key=key(2), Body=bytes(past))
    mnt = mounts.mount(f"s3://{BUCKET}/damaged", os.path.join(work, "mnt-damaged"), "--read-only")
    results = {}
    for j in range(4):
        try:
            with open(os.path.join(mnt, "c", "0", str(4 * j)), "rb") as f:
                results[j] = f.read()
        except OSError as e:
            results[j] = e.errno
    mounts.unmount(mnt)
    check("damaged objects: each damaged shard's chunks read as EIO", results[0] == 5 and results[1] == 5 and results[2] == 5,
          str(results))
    check("damaged objects: the healthy shard is served", results[3] == bytes([9]) * 16, str(results[3]))


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    os.environ.update(CREDENTIALS)
    # Shared AWS files of the test's own: the peers' AWS SDKs complain of missing ones on every open.
    aws_files = tempfile.mkdtemp(prefix="shardfs-aws.")
    for name, text in (("config", "[default]\nregion = us-east-1\n"),
                       ("credentials", "[default]\naws_access_key_id = test\naws_secret_access_key = test\n")):
        with open(os.path.join(aws_files, name), "w") as f:
            f.write(text)
    os.environ.update(AWS_CONFIG_FILE=os.path.join(aws_files, "config"),
                      AWS_SHARED_CREDENTIALS_FILE=os.path.join(aws_files, "credentials"))
    check = Checks()

    server = Server()
    server.start()
    mounts = Mounts(binary, server)
    try:
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="shardfs-interop-s3.") as work:
            try:
                arrays = write_fixtures(server, "sharded", os.path.join(work, "unsharded"))
                errors_before_mounting(binary, server, work, check)
                read_and_write_through_the_view(mounts, server, work, arrays, check)
                commands_take_urls(binary, server, check)
                references_of_a_bucket(binary, server, arrays, check)
                credentials_as_the_aws_cli_reads_them(binary, server, work, check)
                two_mounts_write_one_shard(mounts, server, work, check)
                kill_a_writing_daemon(mounts, binary, server, work, check)
                server_gone_during_commits(mounts, binary, server, work, check)
                damaged_objects(mounts, server, work, check)
            finally:
                mounts.close()
    finally:
        mounts.close()
        server.stop()
    return check.summary("interop-s3")


if __name__ == "__main__":
    sys.exit(main())
