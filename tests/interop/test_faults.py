"""Object-store faults: shardfs mounts a bucket of a local S3 server (moto) through a
fault-injecting proxy of our own (scripts/fault_proxy.py) and must never serve or store a wrong
byte, nor lose an fsync'd write.

zarr-python 3 writes a sharded array straight into the bucket; every chunk's bytes, read from the
shard objects and their indexes directly, are the oracle. For each fault (5xx, 503 SlowDown,
resets mid-body, short and long bodies, Range ignored, wrong and missing ETags, lost PUT
responses) a fresh mount through the proxy:
- reads every chunk file: each read is exactly the oracle's bytes or EIO (ESTALE where a reply's
  wrong ETag made the version read seem replaced), never anything else, and most succeed (the
  daemon tries again);
- writes: zarr-python 3 writes a region through the mount, and chunk files are written as
  zarr-python 3.4 does (a temporary file renamed over the chunk's name), then fsync;
- after unmount, zarr-python reads the bucket directly (not through the proxy) and finds exactly
  what was written.
With one GET in five running long and each read fetched alone (`--read-ahead-size 0`), every read
of every chunk file on three fresh mounts succeeds, exactly. With one shard's GET stalled for
30 s, a read of a chunk of another shard takes < 1 s and the stalled read is served, tried again,
within 10 s; so does a read of another shard in the stalled shard's own chunk directory, on a fresh
mount that reads nothing ahead (the directory's lookup does not wait for the stalled index). While another client PUTs new versions of the shards every 50 ms, every read through
a read-only mount is one version's chunk, whole. With every listing stalled while the daemon's
watcher waits on one, `shardfs unmount` returns within seconds. A 16 MiB shard whose multipart completion's
answer is lost, and whose upload is gone when it is sent again, is found stored by its parts'
ETags, every byte.

Runs in ``target/venv``. One fault alone:
``target/venv/bin/python -m pytest tests/interop/test_faults.py -k "lost PUT"``.
"""

import errno
import os
import random
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import numpy as np
import pytest
import shardfs
import zarr
from zarr.storage import ObjectStore

from object_stores import BUCKET, s3_objects
from proxies import FaultProxy

SHAPE, CHUNKS, SHARDS = (64, 256), (16, 16), (32, 64)
GRID = (SHAPE[0] // CHUNKS[0], SHAPE[1] // CHUNKS[1])
PER_SHARD = (SHARDS[0] // CHUNKS[0], SHARDS[1] // CHUNKS[1])
EMPTY = 2**64 - 1


@pytest.fixture(scope="module")
def bucket(s3_server):
    """The bucket with the array at ``data/``, and the proxy in front of its server."""
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    arr = zarr.create_array(store=ObjectStore(s3_objects(s3_server.endpoint, "data")), shape=SHAPE, chunks=CHUNKS,
                            shards=SHARDS, dtype="uint16", fill_value=0)
    arr[...] = np.random.default_rng(22).integers(0, 1000, SHAPE, dtype="uint16")
    proxy = FaultProxy(s3_server.endpoint)
    try:
        yield SimpleNamespace(endpoint=s3_server.endpoint, s3=s3, proxy=proxy)
    finally:
        proxy.stop()


@pytest.fixture
def faults(bucket):
    """The proxy, its rules cleared however the case ends."""
    try:
        yield bucket.proxy
    finally:
        bucket.proxy.control([])


def stored(bucket, prefix="data"):
    return zarr.open_array(ObjectStore(s3_objects(bucket.endpoint, prefix)), mode="r")[...]


def chunk_name(i, j):
    return os.path.join("c", str(i), str(j))


def chunks_of_shard(body, si, sj):
    """Chunk (row, column) -> its stored bytes, from a shard object and its index (end, crc32c)."""
    n = PER_SHARD[0] * PER_SHARD[1]
    index = body[len(body) - (16 * n + 4):-4]
    found = {}
    for k in range(n):
        offset, length = struct.unpack_from("<QQ", index, 16 * k)
        if offset != EMPTY:
            p, q = divmod(k, PER_SHARD[1])
            found[(si * PER_SHARD[0] + p, sj * PER_SHARD[1] + q)] = body[offset:offset + length]
    return found


def chunks_of_version(version):
    """Every chunk's stored bytes in `version` (key -> object)."""
    found = {}
    for key, body in version.items():
        if key.startswith("c/"):
            _, a, b = key.split("/")
            found.update(chunks_of_shard(body, int(a), int(b)))
    return found


def oracle(bucket, prefix="data"):
    """Every chunk's stored bytes, read from the bucket directly."""
    keys = [f"c/{si}/{sj}" for si in range(GRID[0] // PER_SHARD[0]) for sj in range(GRID[1] // PER_SHARD[1])]
    return chunks_of_version({k: bucket.s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{k}")["Body"].read() for k in keys})


def read_chunk(mnt, i, j):
    """A chunk file's bytes, or the errno of the failure."""
    try:
        return (Path(mnt) / chunk_name(i, j)).read_bytes()
    except OSError as e:
        return e.errno


def read_every_chunk(mnt, expected):
    """Reads every chunk file: those read wrong, and those that failed (with their errno's name)."""
    wrong, failed = [], []
    for (i, j), want in expected.items():
        got = read_chunk(mnt, i, j)
        if isinstance(got, int):
            failed.append((i, j, errno.errorcode.get(got, got)))
        elif got != want:
            wrong.append((i, j, len(got), len(want)))
    return wrong, failed


def write_through(mnt, model, rng):
    """zarr-python writes a region through the mount, and chunk files are written as zarr-python
    3.4 does (temporary file, rename); then everything is fsync'd. Updates `model` with what the
    bucket must hold; returns the writes that failed and, where one did, what the bucket may hold
    instead (`either`: a failed write may have been applied in part, never as anything but what
    was written)."""
    errors = []
    either = model.copy()
    try:
        arr = zarr.open_array(mnt, mode="r+")
        r0 = rng.randrange(0, SHAPE[0] - 20)
        c0 = rng.randrange(0, SHAPE[1] - 40)
        values = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 1000, (20, 40), dtype="uint16")
        either[r0:r0 + 20, c0:c0 + 40] = values
        arr[r0:r0 + 20, c0:c0 + 40] = values
        model[r0:r0 + 20, c0:c0 + 40] = values
    except Exception as e:  # noqa: BLE001 (any failure of the client is the case's to count)
        errors.append(f"zarr write: {e!r}")
    for _ in range(3):
        (si, sj), (ti, tj) = rng.choice(list(np.ndindex(GRID))), rng.choice(list(np.ndindex(GRID)))
        try:
            data = (Path(mnt) / chunk_name(si, sj)).read_bytes()
            tmp = Path(mnt) / "c" / str(ti) / f".{tj}.tmp{rng.randrange(1 << 20)}"
            tmp.write_bytes(data)
            os.rename(tmp, Path(mnt) / chunk_name(ti, tj))
            source = np.s_[si * CHUNKS[0]:(si + 1) * CHUNKS[0], sj * CHUNKS[1]:(sj + 1) * CHUNKS[1]]
            target = np.s_[ti * CHUNKS[0]:(ti + 1) * CHUNKS[0], tj * CHUNKS[1]:(tj + 1) * CHUNKS[1]]
            # The chunk read holds what the bucket may hold: after a failed zarr write, either.
            either[target], model[target] = either[source].copy(), model[source].copy()
        except OSError as e:
            # Not applied, as far as the writer knows: the model stays, and the check of the
            # bucket finds out whether it agrees.
            errors.append(f"chunk copy {si}/{sj} -> {ti}/{tj}: {e!r}")
    try:
        fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        errors.append(f"fsync: {e!r}")
    return errors, either


def daemon_warnings(log):
    """The daemon's last warnings and errors, for a failed case's report."""
    lines = [line.rstrip() for line in Path(log).read_text(errors="replace").splitlines()
             if " WARN " in line or " ERROR " in line]
    return "\n".join(f"daemon: {line}" for line in lines[-30:])


FAULTS = {
    "500 Internal Error": [{"method": "GET", "fault": "status", "status": 500, "every": 3}],
    "503 SlowDown": [{"fault": "status", "status": 503, "every": 2}],
    "reset mid-body": [{"method": "GET", "fault": "reset", "every": 3}],
    "short bodies": [{"method": "GET", "fault": "short", "every": 3}],
    "long bodies (64 extra bytes)": [{"method": "GET", "fault": "long", "every": 3}],
    "Range ignored (whole object, 200)": [{"method": "GET", "range": True, "fault": "ignore_range", "every": 2}],
    "wrong ETags": [{"method": "GET", "fault": "wrong_etag", "every": 3},
                    {"method": "HEAD", "fault": "wrong_etag", "every": 3}],
    "missing ETags": [{"method": "GET", "fault": "missing_etag", "every": 3},
                      {"method": "HEAD", "fault": "missing_etag", "every": 3}],
    "lost PUT responses": [{"method": "PUT", "fault": "lost_put", "every": 2}],
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_serves_no_wrong_byte_and_loses_no_fsynced_write(bucket, faults, fault, tmp_path):
    rng = random.Random(sorted(FAULTS).index(fault))
    model, expected = stored(bucket), oracle(bucket)
    log = tmp_path / "daemon.log"
    (tmp_path / "mnt").mkdir()
    try:
        faults.control(FAULTS[fault])
        with shardfs.mount(f"s3://{BUCKET}/data", tmp_path / "mnt", endpoint_url=faults.endpoint, log_file=log,
                           verbose=True) as mnt:
            try:
                wrong, failed = read_every_chunk(mnt, expected)
                errors, either = write_through(mnt, model, rng)
            finally:
                # The unmount commits what is pending: without faults, so that what is checked
                # is what the writes did.
                applied = faults.control()["applied"]
                faults.control([])
        assert not wrong, f"{len(wrong)} of {len(expected)} chunk files read wrong bytes: {wrong[:5]}"
        # The daemon tries again: most reads succeed, and those that fail say so.
        assert len(failed) <= len(expected) // 10 and all(e[2] in ("EIO", "ESTALE") for e in failed), failed[:5]
        # A failed write is allowed (an error, not a wrong byte); most must succeed.
        assert len(errors) <= 1, f"{len(errors)} of 5 writes failed: {errors[:3]}"
        assert sum(applied) > 0, "the proxy injected no fault"
        now = stored(bucket)
        differ = np.argwhere((now != model) & (True if not errors else now != either))
        assert len(differ) == 0, f"the bucket differs from what was written in {len(differ)} values: {differ[:3]}"
    except AssertionError as e:
        raise AssertionError(f"{e}\n{daemon_warnings(log)}") from None


@pytest.mark.parametrize("mount", [1, 2, 3])
def test_every_read_gets_past_one_long_get_in_five_when_each_read_is_its_own_get(bucket, faults, mount, tmp_path):
    """Each read its own GET (no bytes kept ahead), one GET in five running long: asked again,
    never served, never EIO."""
    expected = oracle(bucket)
    faults.control([{"method": "GET", "fault": "long", "every": 5}])
    with shardfs.mount(f"s3://{BUCKET}/data", tmp_path, endpoint_url=faults.endpoint, read_only=True,
                       read_ahead_size=0) as mnt:
        try:
            wrong, failed = read_every_chunk(mnt, expected)
        finally:
            applied = faults.control()["applied"]
            faults.control([])
    assert not wrong and not failed, f"wrong {wrong[:5]}, failed {failed[:5]}"
    assert sum(applied) > 0, "the proxy injected no fault"


def read_beside_a_stall(mnt, expected, stalled_chunk, others, after):
    """Reads `stalled_chunk` in a thread of its own (its GET stalled by the proxy's rule), and
    `after` seconds later each of `others`: the stalled read's bytes and time, and each other's
    exactness and time. The stalled read ends before this returns (it would keep the mount busy)."""
    stalled, beside = {}, {}

    def read_stalled():
        start = time.monotonic()
        stalled["got"] = read_chunk(mnt, *stalled_chunk)
        stalled["took"] = time.monotonic() - start

    thread = threading.Thread(target=read_stalled)
    thread.start()
    try:
        time.sleep(after)
        for other in others:
            start = time.monotonic()
            got = read_chunk(mnt, *other)
            beside[other] = (got == expected[other], time.monotonic() - start)
    finally:
        thread.join(40)
    return stalled, beside


def test_a_stalled_get_holds_up_no_read_of_another_shard(bucket, faults, tmp_path):
    expected = oracle(bucket)
    with shardfs.mount(f"s3://{BUCKET}/data", tmp_path, endpoint_url=faults.endpoint, read_only=True) as mnt:
        # The view finds a chunk directory by the index of its first shard (the kernel looks each
        # directory up once, and a second lookup of it waits for the first): known beforehand,
        # so that what is stalled is a chunk's first GET, of a shard the lookups did not read
        # (a shard this small is fetched whole at its first read).
        for d in range(GRID[0]):
            os.stat(os.path.join(mnt, "c", str(d)))
        stalled_chunk = (0, 2 * PER_SHARD[1])
        faults.control([{"method": "GET", "key": "/data/c/0/2$", "fault": "stall", "seconds": 30, "times": 1}])
        # The first chunk of shard c/0/1, in the same directory; one of shard c/1/0, in another.
        stalled, others = read_beside_a_stall(mnt, expected, stalled_chunk, [(0, PER_SHARD[1]), (PER_SHARD[0], 0)], 0.3)
        applied = faults.control()["applied"]
        faults.control([])
    for other, (exact, took) in others.items():
        assert exact and took < 1, f"chunk {other} of another shard: {took:.2f} s"
    # Tried again, and served exactly.
    assert stalled.get("got") == expected[stalled_chunk]
    assert stalled["took"] < 10 and applied == [1], f"{stalled['took']:.1f} s, stalls {applied}"


def test_a_stalled_get_of_a_shard_delays_no_read_that_does_not_need_its_bytes(bucket, faults, tmp_path):
    """Issue 50's case: one ranged GET of shard c/0/0 stalled 30 s on a mount that reads nothing
    ahead, while a reader waits on it; a second later, chunks of another shard in the same
    directory, of another shard elsewhere, and of the stalled shard in another directory."""
    expected = oracle(bucket)
    with shardfs.mount(f"s3://{BUCKET}/data", tmp_path, endpoint_url=faults.endpoint, read_only=True,
                       read_ahead_size=0) as mnt:
        faults.control([{"method": "GET", "key": "/data/c/0/0$", "range": True, "fault": "stall", "seconds": 30,
                         "times": 1}])
        stalled_chunk = (0, 0)
        stalled, others = read_beside_a_stall(mnt, expected, stalled_chunk, [(0, 5), (GRID[0] - 1, GRID[1] - 1), (1, 1)], 1)
        applied = faults.control()["applied"]
        faults.control([])
    assert applied == [1], f"stalls {applied}"
    for other, (exact, took) in others.items():
        assert exact and took < 1, f"chunk {other}: {took:.2f} s"
    assert stalled.get("got") == expected[stalled_chunk]
    assert stalled["took"] < 10, f"{stalled['took']:.1f} s"


def test_an_unmount_waits_for_no_listing_the_server_never_answers(bucket, faults, tmp_path):
    """Every listing stalled (a network gone quiet) while the daemon's watcher looks whether what
    the kernel holds changed: `shardfs unmount` returns within seconds and the daemon is gone,
    where the daemon waited out the listing's tries (80 s) and the unmount failed after 60 s."""
    with shardfs.mount(f"s3://{BUCKET}/data", tmp_path, endpoint_url=faults.endpoint, read_only=True) as mnt:
        # A directory the kernel holds, which the watcher looks at again every pass.
        assert os.listdir(os.path.join(mnt, "c"))
        faults.control([{"method": "GET", "query": "list-type", "fault": "stall", "seconds": 300}])
        faults.wait_applied(0, timeout=20)
        start = time.monotonic()
    took = time.monotonic() - start
    faults.control([])
    assert took < 10, f"unmounted in {took:.1f} s"


def test_every_read_while_shards_are_overwritten_every_50_ms_is_one_versions_chunk(bucket, tmp_path, seconds=20):
    """Another client PUTs new versions of the shards every 50 ms while the mount reads chunks."""
    versions = []
    for v in range(3):
        data = np.random.default_rng(100 + v).integers(0, 200 * (v + 1), SHAPE, dtype="uint16")
        arr = zarr.create_array(store=ObjectStore(s3_objects(bucket.endpoint, f"over{v}")), shape=SHAPE, chunks=CHUNKS,
                                shards=SHARDS, dtype="uint16", fill_value=0, overwrite=True)
        arr[...] = data
        versions.append({k: bucket.s3.get_object(Bucket=BUCKET, Key=f"over{v}/{k}")["Body"].read()
                         for k in ["zarr.json"] + [f"c/{a}/{b}" for a in range(2) for b in range(4)]})
    for key, body in versions[0].items():
        bucket.s3.put_object(Bucket=BUCKET, Key=f"over/{key}", Body=body)
    allowed = {}
    for version in versions:
        for chunk, bytes_ in chunks_of_version(version).items():
            allowed.setdefault(chunk, set()).add(bytes_)
    first = chunks_of_version(versions[0])
    stop = threading.Event()
    counts = {"reads": 0, "errors": 0, "puts": 0, "newer": 0}
    wrong = []
    lock = threading.Lock()

    def writer():
        client = boto3.client("s3", endpoint_url=bucket.endpoint)
        rng = random.Random(7)
        while not stop.is_set():
            key = f"c/{rng.randrange(2)}/{rng.randrange(4)}"
            client.put_object(Bucket=BUCKET, Key=f"over/{key}", Body=versions[rng.randrange(3)][key])
            counts["puts"] += 1
            time.sleep(0.05)

    def reader(mnt, seed):
        rng = random.Random(seed)
        chunks = list(allowed)
        while not stop.is_set():
            chunk = rng.choice(chunks)
            got = read_chunk(mnt, *chunk)
            with lock:
                counts["reads"] += 1
                if isinstance(got, int):
                    counts["errors"] += 1
                elif got not in allowed[chunk]:
                    # Old pages under a new size: the start of another version, as long as one.
                    prefix = any(b.startswith(got) for b in allowed[chunk])
                    wrong.append((chunk, len(got), sorted(len(b) for b in allowed[chunk]), prefix))
                elif got != first[chunk]:
                    counts["newer"] += 1

    with shardfs.mount(f"s3://{BUCKET}/over", tmp_path, endpoint_url=bucket.endpoint, read_only=True) as mnt:
        threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(mnt, s))
                                                        for s in range(4)]
        try:
            for t in threads:
                t.start()
            time.sleep(seconds)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    assert not wrong, f"{len(wrong)} of {counts['reads']} reads mixed versions, e.g. {wrong[:3]}"
    assert counts["reads"] >= 1000 and counts["newer"] > 0, counts
    print(f"{counts['puts']} PUTs, {counts['reads']} reads ({counts['newer']} of a later version, "
          f"{counts['errors']} errors)")


def test_a_shard_whose_completion_answer_is_lost_is_known_stored_by_its_parts_etags(bucket, faults, tmp_path):
    """A 16 MiB shard goes up in parts; the answer to its CompleteMultipartUpload is lost. Sent
    again, the upload is gone (S3 forgets a completed upload after a while; moto would answer
    again, so the proxy says NoSuchUpload): the object is taken for this upload's because its ETag
    is the one the parts' ETags make, and the commit succeeds with every byte in the bucket."""
    chunk = 1 << 20
    arr = zarr.create_array(store=ObjectStore(s3_objects(bucket.endpoint, "large")), shape=(4 * chunk,),
                            chunks=(chunk,), shards=(4 * chunk,), dtype="float32", compressors=None, fill_value=0)
    data = np.random.default_rng(7).random(4 * chunk, dtype="float32")
    log = tmp_path / "daemon.log"
    (tmp_path / "mnt").mkdir()
    try:
        with shardfs.mount(f"s3://{BUCKET}/large", tmp_path / "mnt", endpoint_url=faults.endpoint, log_file=log,
                           verbose=True) as mnt:
            faults.control([{"method": "POST", "query": "uploadId=", "fault": "lost_put", "times": 1},
                            {"method": "POST", "query": "uploadId=", "fault": "status", "status": 404,
                             "code": "NoSuchUpload", "times": 1}])
            os.makedirs(os.path.join(mnt, "c"), exist_ok=True)
            for i in range(4):
                with open(os.path.join(mnt, "c", str(i)), "wb") as f:
                    f.write(data[i * chunk:(i + 1) * chunk].tobytes())
                    if i == 3:
                        os.fsync(f.fileno())
            applied = faults.control()["applied"]
            faults.control([])
        assert applied == [1, 1], f"lost completion answers, and NoSuchUpload: {applied}"
        e_tag = bucket.s3.head_object(Bucket=BUCKET, Key="large/c/0")["ETag"]
        assert e_tag.strip('"').endswith("-4"), f"not four parts: {e_tag}"
        assert np.array_equal(arr[...], data)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{daemon_warnings(log)}") from None
