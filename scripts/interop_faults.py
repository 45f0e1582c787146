"""Interop test of object-store faults: shardfs mounts a bucket of a local S3 server (moto) through
a fault-injecting proxy of our own (scripts/fault_proxy.py) and must never serve or store a wrong
byte, nor lose an fsync'd write.

    target/venv/bin/python scripts/interop_faults.py [path/to/shardfs]

zarr-python 3 writes a sharded array straight into the bucket; every chunk's bytes, read from the
shard objects and their indexes directly, are the oracle. For each fault (5xx, 503 SlowDown,
resets mid-body, short and long bodies, Range ignored, wrong and missing ETags, lost PUT
responses) a fresh mount through the proxy:
- reads every chunk file: each read is exactly the oracle's bytes or EIO (ESTALE where a reply's
  wrong ETag made the version read seem replaced), never anything else,
  and most succeed (the daemon tries again);
- writes: zarr-python 3 writes a region through the mount, and chunk files are written as
  zarr-python 3.4 does (a temporary file renamed over the chunk's name), then fsync;
- after unmount, zarr-python reads the bucket directly (obstore, not through the proxy) and finds
  exactly what was written, and every chunk object decodes.
And with one GET in five running long and each read fetched alone (`--read-ahead-size 0`), on
three fresh mounts, every read of every chunk file succeeds, exactly. Then: with one shard's GET
stalled for 30 s, a read of a chunk of another shard takes < 1 s and the
stalled read is served, tried again, within 10 s; and while another client PUTs new versions of
the shards every 50 ms, every read through a read-only mount is one version's chunk, whole.
"""

import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import json
import errno

import boto3
import numpy as np
import zarr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402
from interop_s3 import BUCKET, CREDENTIALS, Mounts, daemon_pid, free_port, zarr_store  # noqa: E402


HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE, CHUNKS, SHARDS = (64, 256), (16, 16), (32, 64)
GRID = (SHAPE[0] // CHUNKS[0], SHAPE[1] // CHUNKS[1])
PER_SHARD = (SHARDS[0] // CHUNKS[0], SHARDS[1] // CHUNKS[1])
EMPTY = 2**64 - 1


class Endpoint:
    def __init__(self, endpoint):
        self.endpoint = endpoint


class Moto:
    """moto_server in a process of its own, as scripts/test.sh runs it."""

    def __init__(self, work):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        self.log = open(os.path.join(work, "moto.log"), "w")
        self.process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                        stderr=subprocess.STDOUT)
        wait_for_port(self.port)

    def stop(self):
        self.process.terminate()
        self.process.wait(10)
        self.log.close()


class Proxy:
    """scripts/fault_proxy.py in a process of its own, in front of `upstream`."""

    def __init__(self, upstream):
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "fault_proxy.py"), "--upstream", upstream],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        self.port = int(line.split()[-1])
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def control(self, rules=None):
        data = None if rules is None else json.dumps({"rules": rules}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/__faults", data=data,
                                                           method="GET" if data is None else "POST")) as r:
            return json.loads(r.read())

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


def wait_for_port(port):
    import socket
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def chunk_name(i, j):
    return os.path.join("c", str(i), str(j))


def oracle(s3, prefix):
    """Every chunk's stored bytes, from the shard objects and their indexes (end, crc32c)."""
    n = PER_SHARD[0] * PER_SHARD[1]
    chunks = {}
    for si in range(GRID[0] // PER_SHARD[0]):
        for sj in range(GRID[1] // PER_SHARD[1]):
            body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/c/{si}/{sj}")["Body"].read()
            chunks.update(chunks_of_shard(body, si, sj, n))
    return chunks


def chunks_of_shard(body, si, sj, n):
    index = body[len(body) - (16 * n + 4):-4]
    found = {}
    for k in range(n):
        offset, length = struct.unpack_from("<QQ", index, 16 * k)
        if offset != EMPTY:
            p, q = divmod(k, PER_SHARD[1])
            found[(si * PER_SHARD[0] + p, sj * PER_SHARD[1] + q)] = body[offset:offset + length]
    return found


def chunks_of_shard_all(version, n):
    found = {}
    for key, body in version.items():
        if key.startswith("c/"):
            _, a, b = key.split("/")
            found.update(chunks_of_shard(body, int(a), int(b), n))
    return found


def read_chunk(mnt, i, j):
    """A chunk file's bytes, or the errno of the failure."""
    try:
        with open(os.path.join(mnt, chunk_name(i, j)), "rb") as f:
            return f.read()
    except OSError as e:
        return e.errno


def read_every_chunk(mnt, expected, name, check, every=False):
    wrong, failed = [], []
    for (i, j), want in expected.items():
        got = read_chunk(mnt, i, j)
        if isinstance(got, int):
            failed.append((i, j, errno.errorcode.get(got, got)))
        elif got != want:
            wrong.append((i, j, len(got), len(want)))
    check(f"{name}: reads of {len(expected)} chunk files serve 0 wrong bytes (exact bytes or an error)", not wrong,
          f"wrong {wrong[:5]}")
    if every:
        check(f"{name}: every read succeeds ({len(expected) - len(failed)} of {len(expected)})", not failed,
              f"failed {failed[:5]}")
        return
    check(f"{name}: most reads succeed ({len(expected) - len(failed)} of {len(expected)})",
          len(failed) <= len(expected) // 10 and all(e[2] in ("EIO", "ESTALE") for e in failed), f"failed {failed[:5]}")


def write_through(mnt, model, rng, name, check):
    """zarr-python writes a region through the mount, and chunk files are written as zarr-python
    3.4 does (temporary file, rename); then everything is fsync'd. Updates `model` with what the
    bucket must hold; where a write failed, `either` gets what the bucket may hold instead (a
    failed write may have been applied in part, never as anything but what was written)."""
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
    except Exception as e:  # noqa: BLE001 (any failure of the client is the check's to report)
        errors.append(f"zarr write: {e!r}")
    for _ in range(3):
        (si, sj), (ti, tj) = rng.choice(list(np.ndindex(GRID))), rng.choice(list(np.ndindex(GRID)))
        try:
            with open(os.path.join(mnt, chunk_name(si, sj)), "rb") as f:
                data = f.read()
            tmp = os.path.join(mnt, "c", str(ti), f".{tj}.tmp{rng.randrange(1 << 20)}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, os.path.join(mnt, chunk_name(ti, tj)))
            source = np.s_[si * CHUNKS[0]:(si + 1) * CHUNKS[0], sj * CHUNKS[1]:(sj + 1) * CHUNKS[1]]
            target = np.s_[ti * CHUNKS[0]:(ti + 1) * CHUNKS[0], tj * CHUNKS[1]:(tj + 1) * CHUNKS[1]]
            # The chunk read holds what the bucket may hold: after a failed zarr write, either.
            either[target], model[target] = either[source].copy(), model[source].copy()
        except OSError as e:
            # Not applied, as far as the writer knows: the model stays, and the check below
            # finds out whether the bucket agrees.
            errors.append(f"chunk copy {si}/{sj} -> {ti}/{tj}: {e!r}")
    try:
        fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        errors.append(f"fsync: {e!r}")
    # A failed write is allowed (an error, not a wrong byte); most must succeed.
    check(f"{name}: writes through the mount and fsync ({len(errors)} of 5 failed)", len(errors) <= 1,
          "; ".join(errors[:3]))
    return either if errors else None


FAULTS = [
    ("500 Internal Error", [{"method": "GET", "fault": "status", "status": 500, "every": 3}]),
    ("503 SlowDown", [{"fault": "status", "status": 503, "every": 2}]),
    ("reset mid-body", [{"method": "GET", "fault": "reset", "every": 3}]),
    ("short bodies", [{"method": "GET", "fault": "short", "every": 3}]),
    ("long bodies (64 extra bytes)", [{"method": "GET", "fault": "long", "every": 3}]),
    ("Range ignored (whole object, 200)", [{"method": "GET", "range": True, "fault": "ignore_range", "every": 2}]),
    ("wrong ETags", [{"method": "GET", "fault": "wrong_etag", "every": 3},
                     {"method": "HEAD", "fault": "wrong_etag", "every": 3}]),
    ("missing ETags", [{"method": "GET", "fault": "missing_etag", "every": 3},
                       {"method": "HEAD", "fault": "missing_etag", "every": 3}]),
    ("lost PUT responses", [{"method": "PUT", "fault": "lost_put", "every": 2}]),
]

# Faults a read must get past every time: (name, rules, mount flags). Each read its own GET (no
# bytes kept ahead), one GET in five running long: asked again, never served, never EIO.
EVERY_READ = [
    ("long bodies on one GET in five, each read its own GET",
     [{"method": "GET", "fault": "long", "every": 5}], ["--read-ahead-size", "0"]),
]


def unmount_and_wait(mounts, mnt):
    """Unmounts, and waits for the daemon to end: a lazy unmount (the mount busy) returns before
    its last commits, which the next oracle must not miss."""
    pid = daemon_pid(mnt)
    mounts.unmount(mnt)
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def print_warnings(log):
    """The daemon's warnings and errors of a failed scenario: its log goes with the work directory."""
    with open(log, errors="replace") as f:
        lines = [line.rstrip() for line in f if " WARN " in line or " ERROR " in line]
    for line in lines[-30:]:
        print(f"     daemon: {line}")


def each_fault(binary, moto, proxy, s3, work, check):
    rng = random.Random(22)
    model = zarr.open_array(zarr_store(moto, "data"), mode="r")[...]
    mounts = Mounts(binary, proxy)
    try:
        for n, (name, rules) in enumerate(FAULTS):
            expected = oracle(s3, "data")
            proxy.control(rules)
            mnt = os.path.join(work, f"mnt-{n}")
            log = os.path.join(work, f"daemon-{n}.log")
            failed_before = check.failed
            try:
                mounts.mount(f"s3://{BUCKET}/data", mnt, "--log-file", log, "-v")
            except subprocess.CalledProcessError as e:
                check(f"{name}: mounts through the proxy", False, str(e))
                proxy.control([])
                continue
            either = None
            try:
                read_every_chunk(mnt, expected, name, check)
                either = write_through(mnt, model, rng, name, check)
            finally:
                applied = proxy.control()["applied"]
                proxy.control([])
                unmount_and_wait(mounts, mnt)
            check(f"{name}: the proxy injected the fault ({applied})", sum(applied) > 0)
            stored = zarr.open_array(zarr_store(moto, "data"), mode="r")[...]
            differ = np.argwhere((stored != model) & (True if either is None else stored != either))
            check(f"{name}: the bucket holds exactly what was written and fsync'd", len(differ) == 0,
                  f"{len(differ)} values differ, first at {differ[:3].tolist()}")
            if check.failed > failed_before:
                print_warnings(log)
            model = stored
    finally:
        mounts.close()


def every_read(binary, proxy, s3, work, check, rounds=3):
    """Reads of every chunk file on fresh mounts, `rounds` times, through faults each read must
    get past: all of them exact."""
    mounts = Mounts(binary, proxy)
    try:
        for name, rules, flags in EVERY_READ:
            expected = oracle(s3, "data")
            for n in range(rounds):
                proxy.control(rules)
                mnt = os.path.join(work, f"mnt-every-{n}")
                mounts.mount(f"s3://{BUCKET}/data", mnt, "--read-only", *flags)
                try:
                    read_every_chunk(mnt, expected, f"{name} (mount {n + 1} of {rounds})", check, every=True)
                finally:
                    applied = proxy.control()["applied"]
                    proxy.control([])
                    unmount_and_wait(mounts, mnt)
                check(f"{name} (mount {n + 1} of {rounds}): the proxy injected the fault ({applied})", sum(applied) > 0)
    finally:
        mounts.close()


def stalled_request(binary, proxy, s3, work, check):
    expected = oracle(s3, "data")
    mounts = Mounts(binary, proxy)
    mnt = mounts.mount(f"s3://{BUCKET}/data", os.path.join(work, "mnt-stall"), "--read-only")
    try:
        # The view finds a chunk directory by the index of its first shard (the kernel looks each
        # directory up once, and a second lookup of it waits for the first): known beforehand,
        # so that what is stalled is a chunk's first GET, of a shard the lookups did not read
        # (a shard this small is fetched whole at its first read).
        for d in range(GRID[0]):
            os.stat(os.path.join(mnt, "c", str(d)))
        stalled_chunk = (0, 2 * PER_SHARD[1])
        proxy.control([{"method": "GET", "key": "/data/c/0/2$", "fault": "stall", "seconds": 30, "times": 1}])
        stalled = {}

        def read_stalled():
            start = time.monotonic()
            stalled["got"] = read_chunk(mnt, *stalled_chunk)
            stalled["took"] = time.monotonic() - start

        thread = threading.Thread(target=read_stalled)
        thread.start()
        time.sleep(0.3)
        # The first chunk of shard c/0/1, in the same directory; one of shard c/1/0, in another.
        for other in [(0, PER_SHARD[1]), (PER_SHARD[0], 0)]:
            start = time.monotonic()
            got = read_chunk(mnt, *other)
            took = time.monotonic() - start
            check(f"one GET stalled for 30 s: a read of chunk {other} of another shard takes < 1 s ({took:.2f} s)",
                  took < 1 and got == expected[other])
        thread.join(40)
        applied = proxy.control()["applied"]
        check(f"the stalled read is tried again and served exactly within 10 s ({stalled.get('took', 0):.1f} s, "
              f"stalls {applied})", stalled.get("got") == expected[stalled_chunk] and stalled["took"] < 10
              and applied == [1])
    finally:
        proxy.control([])
        mounts.close()


def overwrites_during_reads(binary, moto, s3, work, check, seconds=20):
    """Another client PUTs new versions of the shards every 50 ms while the mount reads chunks."""
    versions = []
    for v in range(3):
        data = np.random.default_rng(100 + v).integers(0, 200 * (v + 1), SHAPE, dtype="uint16")
        arr = zarr.create_array(store=zarr_store(moto, f"over{v}"), shape=SHAPE, chunks=CHUNKS, shards=SHARDS,
                                dtype="uint16", fill_value=0, overwrite=True)
        arr[...] = data
        versions.append({k: s3.get_object(Bucket=BUCKET, Key=f"over{v}/{k}")["Body"].read()
                         for k in ["zarr.json"] + [f"c/{a}/{b}" for a in range(2) for b in range(4)]})
    for key, body in versions[0].items():
        s3.put_object(Bucket=BUCKET, Key=f"over/{key}", Body=body)
    n = PER_SHARD[0] * PER_SHARD[1]
    allowed = {}
    for version in versions:
        for key, body in version.items():
            if key.startswith("c/"):
                _, a, b = key.split("/")
                for chunk, bytes_ in chunks_of_shard(body, int(a), int(b), n).items():
                    allowed.setdefault(chunk, set()).add(bytes_)
    mounts = Mounts(binary, Endpoint(moto.endpoint))
    mnt = mounts.mount(f"s3://{BUCKET}/over", os.path.join(work, "mnt-over"), "--read-only")
    stop = threading.Event()
    counts = {"reads": 0, "errors": 0, "puts": 0, "newer": 0}
    first = {chunk: bytes_ for chunk, bytes_ in chunks_of_shard_all(versions[0], n).items()}
    wrong = []
    lock = threading.Lock()

    def writer():
        client = boto3.client("s3", endpoint_url=moto.endpoint)
        rng = random.Random(7)
        while not stop.is_set():
            key = f"c/{rng.randrange(2)}/{rng.randrange(4)}"
            client.put_object(Bucket=BUCKET, Key=f"over/{key}", Body=versions[rng.randrange(3)][key])
            counts["puts"] += 1
            time.sleep(0.05)

    def reader(seed):
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

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(seconds)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        mounts.close()
    check(f"shards overwritten every 50 ms ({counts['puts']} PUTs): {counts['reads']} reads ({counts['newer']} of "
          f"a later version), every one exactly one version's chunk ({counts['errors']} errors)",
          not wrong and counts["reads"] >= 1000 and counts["newer"] > 0,
          f"{len(wrong)} reads mixed versions, e.g. {wrong[:3]}")


def main():
    binary = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    os.environ.update(CREDENTIALS)
    check = Checks()
    with tempfile.TemporaryDirectory(prefix="shardfs-interop-faults.") as work:
        for name, text in (("config", "[default]\nregion = us-east-1\n"),
                           ("credentials", "[default]\naws_access_key_id = test\naws_secret_access_key = test\n")):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        os.environ.update(AWS_CONFIG_FILE=os.path.join(work, "config"),
                          AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "credentials"))
        moto = Moto(work)
        proxy = None
        try:
            proxy = Proxy(moto.endpoint)
            s3 = boto3.client("s3", endpoint_url=moto.endpoint)
            s3.create_bucket(Bucket=BUCKET)
            arr = zarr.create_array(store=zarr_store(moto, "data"), shape=SHAPE, chunks=CHUNKS, shards=SHARDS,
                                    dtype="uint16", fill_value=0)
            arr[...] = np.random.default_rng(22).integers(0, 1000, SHAPE, dtype="uint16")
            each_fault(binary, moto, proxy, s3, work, check)
            every_read(binary, proxy, s3, work, check)
            stalled_request(binary, proxy, s3, work, check)
            overwrites_during_reads(binary, moto, s3, work, check)
        finally:
            if proxy:
                proxy.stop()
            moto.stop()
    return check.summary("interop-faults")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
