"""Many machines writing one dataset: daemons mounting the same prefix of a bucket, each as
another machine would (a process of its own, nothing shared but the server), write disjoint
chunks of the same shards at once. Servers whose conditional writes are atomic per key: s3s-fs
(patched, scripts/s3s_fs.sh) and Azurite. moto's are not (it checks the condition, then stores),
so it is not used here.

- eight daemons write the chunks of four shards, every shard written by all eight, and unmount at
  once: every unmount succeeds, the bucket read directly holds every chunk, and nothing of the
  turn-taking (`__shardfs/exchange/`) is left but a takeover's `doubt-` markers;
- kill -9 (s3s-fs, one daemon through scripts/fault_proxy.py, the fault placing it where it is
  killed): the lease holder between its shard's PUT and its removal of the deltas it folded; the
  holder before its PUT; and a holder whose PUT stalls past its lease and then goes through.
  Every chunk another daemon fsync'd is in the bucket, and the others' fsyncs all return.
- the S3 server itself serves a GET racing a PUT of the same key whole, body and checksum of one
  version, as S3 does (what Icechunk's reader checks in test_icechunk_writes).

Runs in ``target/venv``. One case alone:
``target/venv/bin/python -m pytest tests/interop/test_many_writers.py -k "azure and eight"``.
"""

import concurrent.futures
import contextlib
import os
import signal
import threading
import time

import boto3
import botocore.config
import botocore.exceptions
import obstore
import pytest
import shardfs
import zarr

from object_stores import BUCKET, Azure, S3sFs, daemon_pid, serving, url, zarr_store
from proxies import FaultProxy

SERVICES = {"s3s": S3sFs, "azure": Azure}
SHAPE, CHUNKS, SHARDS = (64, 64), (4, 4), (32, 32)
GRID = (SHAPE[0] // CHUNKS[0], SHAPE[1] // CHUNKS[1])
# Longer than the lease's timeout (shared_commit::LEASE_TIMEOUT, 10 s) plus a holder's fold.
TAKEOVER = 40


@pytest.fixture(scope="module", params=list(SERVICES))
def service(request, tmp_path_factory):
    server = SERVICES[request.param]()
    with serving(server, tmp_path_factory.mktemp(f"{server.name}-env")):
        yield server


def make_array(service, prefix):
    zarr.create_array(store=zarr_store(service, prefix), shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint8",
                      compressors=None, fill_value=0)


def value(writer, i, j):
    return (writer * 37 + i * 7 + j) % 255 + 1


def write_chunk(mnt, writer, i, j, sync=False):
    os.makedirs(os.path.join(mnt, "c", str(i)), exist_ok=True)
    with open(os.path.join(mnt, "c", str(i), str(j)), "wb") as f:
        f.write(bytes([value(writer, i, j)]) * (CHUNKS[0] * CHUNKS[1]))
        if sync:
            f.flush()
            os.fsync(f.fileno())


def missing(service, prefix, written):
    """The chunks of `written` ((i, j) -> writer) the bucket, read directly, does not hold."""
    got = zarr.open_array(zarr_store(service, prefix), mode="r")[...]
    return sorted(k for k, w in written.items() if got[k[0] * CHUNKS[0], k[1] * CHUNKS[1]] != value(w, *k))


def exchange_left(service, prefix):
    """What the turn-taking left, but the `doubt-` markers a takeover leaves for a delta's lifetime."""
    listed = obstore.list(service.objects(), prefix=f"{prefix}/__shardfs/")
    return [m["path"] for batch in listed for m in batch if "/doubt-" not in m["path"]]


def test_eight_daemons_writing_the_same_shards_at_once_lose_nothing_and_every_unmount_succeeds(service, tmp_path):
    make_array(service, "eight")
    writers = 8
    written = {(i, j): (i * GRID[1] + j) % writers for i in range(GRID[0]) for j in range(GRID[1])}
    ready = threading.Barrier(writers)

    def machine(writer):
        mnt = tmp_path / f"m{writer}"
        mnt.mkdir()
        with shardfs.mount(url(service, "eight"), mnt, endpoint_url=service.endpoint,
                           log_file=tmp_path / f"m{writer}.log", verbose=True) as view:
            for (i, j), w in written.items():
                if w == writer:
                    write_chunk(view, writer, i, j)
            # Every daemon commits at its unmount, all at once.
            ready.wait(timeout=120)

    with concurrent.futures.ThreadPoolExecutor(writers) as pool:
        for done in [pool.submit(machine, w) for w in range(writers)]:
            done.result(timeout=300)
    assert missing(service, "eight", written) == []
    assert exchange_left(service, "eight") == []


def fsync_in_background(mnt, writer, i, j):
    """Writes and fsyncs a chunk in a thread of its own: the future, which may fail (a killed
    daemon)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(write_chunk, mnt, writer, i, j, True)
    pool.shutdown(wait=False)
    return future


# Each case: the fault rules for the proxied daemon (A), which rule marks the moment to kill it
# (None: it is not killed), and whether A's own chunk must be in the bucket at the end.
SHARD = r"/eight-\w+/c/0/0$"
KILLS = {
    # A's note read stalled so that the others' deltas are waiting when it lists them; its first
    # removal of a folded delta (object_store deletes with S3's POST ?delete) stalled, and A
    # killed there.
    "holder killed between its PUT and its removals": (
        [{"method": "HEAD", "key": SHARD, "fault": "stall", "seconds": 2, "times": 2},
         {"method": "POST", "fault": "stall", "seconds": 300}], 1, True),
    "holder killed before its PUT": (
        [{"method": "PUT", "key": SHARD, "fault": "stall", "seconds": 300}], 0, False),
    "holder stalled past its lease": (
        [{"method": "PUT", "key": SHARD, "fault": "stall", "seconds": 14, "times": 1}], None, True),
}


@pytest.mark.parametrize("case", list(KILLS))
def test_a_lease_holder_killed_or_stalled_anywhere_loses_no_fsynced_chunk(service, tmp_path, case):
    if service.name != "s3s":
        pytest.skip("the fault proxy speaks S3")
    rules, kill_at, own_kept = KILLS[case]
    prefix = f"eight-{list(KILLS).index(case)}"
    make_array(service, prefix)
    proxy = FaultProxy(service.endpoint)
    others = 3
    written = {}
    try:
        with contextlib.ExitStack() as stack:
            mounts = []
            for n in range(1 + others):
                (tmp_path / f"m{n}").mkdir()
                endpoint = proxy.endpoint if n == 0 else service.endpoint
                mounts.append(stack.enter_context(shardfs.mount(url(service, prefix), tmp_path / f"m{n}",
                                                                endpoint_url=endpoint, commit_idle_ms=600000,
                                                                log_file=tmp_path / f"m{n}.log", verbose=True)))
            # Every daemon's chunks of shard c/0/0, held until fsync.
            for n, mnt in enumerate(mounts):
                for j in range(4):
                    write_chunk(mnt, n, n, j)
            proxy.control(rules)
            holder = fsync_in_background(mounts[0], 0, 0, 0)
            time.sleep(0.5)
            waiters = [fsync_in_background(mounts[n], n, n, 1) for n in range(1, 1 + others)]
            if kill_at is not None:
                proxy.wait_applied(kill_at)
                os.kill(daemon_pid(mounts[0]), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    holder.result(timeout=30)
            for waiter in waiters:
                waiter.result(timeout=TAKEOVER)
            for n in range(1, 1 + others):
                written.update({(n, j): n for j in range(4)})
            if kill_at is None:
                holder.result(timeout=TAKEOVER)
                written.update({(0, j): 0 for j in range(4)})
            elif own_kept:
                # A's PUT went through before it was killed: its chunks are in the shard.
                written.update({(0, j): 0 for j in range(4)})
    finally:
        proxy.stop()
    assert missing(service, prefix, written) == []
    assert [k for k in exchange_left(service, prefix) if "/delta-" in k] == []


@pytest.mark.parametrize("service", ["s3s"], indirect=True)
def test_the_s3_server_serves_a_get_racing_a_put_whole(service):
    """One thread PUTs two bodies in turn at one key, three GET it with checksums checked, for 3 s:
    every GET is one version's body with that version's checksum. Unpatched, s3s-fs paired the old
    body with the new checksum in about one GET in seven, which failed a case of
    test_icechunk_writes polling Icechunk's reader while the mount committed."""
    config = botocore.config.Config(response_checksum_validation="when_supported",
                                    request_checksum_calculation="when_supported")
    client = boto3.client("s3", endpoint_url=service.endpoint, aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1", config=config)
    bodies = [os.urandom(200_000), os.urandom(300_000)]
    client.put_object(Bucket=BUCKET, Key="race", Body=bodies[0], ChecksumAlgorithm="CRC32")
    stop, failures, gets = time.monotonic() + 3, [], [0]

    def write():
        n = 0
        while time.monotonic() < stop:
            n += 1
            client.put_object(Bucket=BUCKET, Key="race", Body=bodies[n % 2], ChecksumAlgorithm="CRC32")

    def read():
        while time.monotonic() < stop:
            try:
                body = client.get_object(Bucket=BUCKET, Key="race", ChecksumMode="ENABLED")["Body"].read()
                gets[0] += 1
                if body not in bodies:
                    failures.append("a body of neither version")
            except Exception as e:  # the client's checksum check fails the read
                failures.append(repr(e))

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gets[0] > 100 and not failures, f"{len(failures)} of {gets[0] + len(failures)} GETs failed: {failures[:2]}"


@pytest.mark.parametrize("service", ["s3s"], indirect=True)
def test_the_s3_server_removes_only_the_version_a_conditional_delete_names(service):
    """A DELETE with If-Match (how a holder gives its commit lease up, never one another machine
    took over) is refused with 412 at another version and removes the one named. Unpatched,
    s3s-fs removed whatever was there."""
    client = boto3.client("s3", endpoint_url=service.endpoint, aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1")
    first = client.put_object(Bucket=BUCKET, Key="lease", Body=b"holder-a")["ETag"]
    second = client.put_object(Bucket=BUCKET, Key="lease", Body=b"holder-b")["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        client.delete_object(Bucket=BUCKET, Key="lease", IfMatch=first)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=BUCKET, Key="lease")["Body"].read() == b"holder-b"
    client.delete_object(Bucket=BUCKET, Key="lease", IfMatch=second)
    with pytest.raises(botocore.exceptions.ClientError):
        client.head_object(Bucket=BUCKET, Key="lease")
