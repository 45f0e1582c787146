"""The wan-write profile of scripts/bench.sh: zarr-python writing sharded arrays to an object store at
cloud latency, through a shardfs mount against writing the bucket directly and against the other
mounts, all in one run.

    target/venv-newest/bin/python scripts/bench_wan_write.py [--rtts 0,20,local] [--runs R] [--scale S]
                                    [--writers direct,shardfs,rclone,s3fs,mountpoint] [--workloads ...]
                                    [--binary SHARDFS] [--mount-args ARGS] [--connection-mbs MBS]
                                    [--quick] [--out FILE]

One s3s-fs server (scripts/s3s_fs.sh) behind scripts/latency_proxy.py, one proxy per round trip,
each connection paced (20 MB/s each way unless told; 0: unpaced), requests and bytes sent to the
server counted by the proxy; and `local`, a directory on the local disk (zarr-python writing it
directly has its files fsync'd before the clock stops, as a commit through the mount is). Workloads (issue 40's), each verified by reading the whole array back
from the bucket directly and comparing it with what was written:

- bulk: a new S x 256 MiB float32 array, 4 MiB chunks, 64 MiB shards, `arr[:] = x`;
- tiles: a new 4096x4096 uint8 array of random bytes, 256x256 zstd chunks, 2048x2048 shards;
- append: 64 appends of 1M float32 to a sharded array made empty (1M chunks, 16M shards);
- region: the 256 tiles of an existing `tiles` array rewritten in random order by 8 threads
  (zarr-python on the bucket directly writes a tile by rewriting its shard, so its threads take
  turns per shard: two rewrites of one shard at once would lose a tile);
- eight: eight mounts of the bucket (eight daemons) writing the 256 tiles of an existing array at
  once, tile i through mount i % 8 (every shard written by all eight), against `region`'s one
  mount; direct: eight clients;
- sixteen: the same through sixteen mounts;
- wide: a new 6144x6144 uint16 array of 576 tiles of random values (256x256 zstd chunks of about
  128 KiB, 2048x2048 shards: 9 shards of 64 chunks, 8 MiB each) written through one mount;
- wide8: the same tiles through eight mounts at once, each writing one eighth of every shard (row
  i % 8 of each shard's tiles through mount i % 8), against `wide`'s one mount;
- wide16: the same through sixteen mounts, each half a row of every shard.

Writers: zarr-python 3 on the bucket directly (obstore; it writes shards, so a tile rewritten is a
shard read and rewritten); zarr-python through a writable shardfs mount of the same sharded
arrays (release build); zarr-python writing the same arrays unsharded through `rclone mount
--vfs-cache-mode writes` and s3fs-fuse. Each array's documents are made before the clock starts
(zarr-python 3.4 makes them exclusively with link(2), which neither rclone nor s3fs-fuse can do).
And mountpoint-s3 (scripts/mountpoint_s3.sh), which writes new files only, each in one go, and
renames nothing: zarr-python 3.4's LocalStore writes a temporary file and renames it, so through
mountpoint-s3 each chunk file is written in place (`InPlaceStore`, the same bytes); bulk and
tiles only (the other workloads rewrite files, which it refuses).
And, on the local disk only, zarr-python writing the same arrays unsharded as plain chunk files
(fsync'd), and the same in memory (`memory`: a tmpfs, /dev/shm, nothing synced): what writing
one file per chunk costs zarr-python itself, on a disk and on a filesystem that costs nothing, the
floors of any view that shows chunks as files. A mount's time includes
its unmount, which for shardfs and rclone is when the last bytes reach the bucket. For shardfs the
daemon's peak RSS (VmHWM) is given too. Median of R runs, each on a fresh mount and a fresh prefix.
Not a test: nothing here asserts a speed.
"""

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numcodecs
import numpy as np
import zarr
from bench_net import (BUCKET, KEYS, Proxy, mount_s3_binary,
                        free_port, publish, remove_unless_mounted, shardfs_binary, start_s3s_fs)
from obstore.store import S3Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, ObjectStore

MIB = 1 << 20
# What each peer mount can write: mountpoint-s3 makes new files only.
NEW_FILES_ONLY = {"mountpoint": ("bulk", "tiles")}


class InPlaceStore(LocalStore):
    """zarr-python's LocalStore writing each file in place, in one write, not through a temporary
    file renamed over it: what a mount that renames nothing (mountpoint-s3) takes."""

    async def set(self, key, value):
        path = os.path.join(str(self.root), key)

        def write():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(value.to_bytes())

        await asyncio.to_thread(write)


def direct_store(endpoint, prefix):
    return ObjectStore(S3Store(BUCKET, prefix=prefix, endpoint=endpoint, region="us-east-1",
                               client_options={"allow_http": True}, **KEYS))


class Bucket:
    """Prefixes of the s3s-fs bucket, written through a latency proxy."""

    def __init__(self, proxy, endpoint):
        self.proxy, self.endpoint = proxy, endpoint
        self.label = f"{proxy.rtt:g} ms"

    def store(self, prefix, proxied=True):
        return direct_store(self.proxy.endpoint if proxied else self.endpoint, prefix)

    def source(self, prefix):
        """What `shardfs mount` takes."""
        return [f"s3://{BUCKET}/{prefix}", "--endpoint-url", self.proxy.endpoint]

    def counts(self):
        return self.proxy.counts()

    def sync(self, prefix):
        """Nothing: an object written is durable when its PUT returns."""


class Local:
    """Directories on the local disk (no proxy, no peers but shardfs)."""

    label = "local"

    def __init__(self, root):
        self.root = root

    def store(self, prefix, proxied=True):
        return LocalStore(os.path.join(self.root, prefix))

    def source(self, prefix):
        return [os.path.join(self.root, prefix)]

    def counts(self):
        return {"requests": 0, "bytes_up": 0, "bytes_down": 0}

    def sync(self, prefix):
        """fsync of every file and directory, as a commit of the mount is durable."""
        for dirpath, _, files in os.walk(os.path.join(self.root, prefix)):
            for name in files + ["."]:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)


class Mount:
    """One writable mount of a place's prefix, by shardfs, rclone or s3fs."""

    def __init__(self, tool, work, binary, place, prefix, extra=()):
        self.tool, self.pid, self.peak = tool, None, 0
        self.path = tempfile.mkdtemp(prefix=f"mnt-{tool}-", dir=work)
        endpoint = getattr(place, "proxy", None) and place.proxy.endpoint
        if tool == "mountpoint":
            mount_s3 = mount_s3_binary()
            self.process = subprocess.Popen([mount_s3, BUCKET, self.path, "--prefix", f"{prefix}/", "--endpoint-url",
                                             endpoint, "--force-path-style"],
                                            env=dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test"),
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif tool == "shardfs":
            # SHARDFS_BENCH_LOG=FILE keeps the daemons' logs (RUST_LOG says how much).
            log = os.environ.get("SHARDFS_BENCH_LOG")
            stderr = open(log, "a") if log else subprocess.DEVNULL
            self.process = subprocess.Popen([binary, "mount", "-f", place.source(prefix)[0], self.path,
                                             *place.source(prefix)[1:], *extra], stderr=stderr)
            self.binary = binary
        elif tool == "s3fs":
            passwd = os.path.join(work, "passwd-s3fs")
            with open(passwd, "w") as f:
                f.write("test:test\n")
            os.chmod(passwd, 0o600)
            self.process = subprocess.Popen(["s3fs", f"{BUCKET}:/{prefix}", self.path, "-f", "-o", f"url={endpoint}",
                                             "-o", "use_path_request_style", "-o", f"passwd_file={passwd}"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
            env.update(RCLONE_CONFIG_WAN_TYPE="s3", RCLONE_CONFIG_WAN_PROVIDER="Other",
                       RCLONE_CONFIG_WAN_ENDPOINT=endpoint, RCLONE_CONFIG_WAN_ACCESS_KEY_ID="test",
                       RCLONE_CONFIG_WAN_SECRET_ACCESS_KEY="test", RCLONE_CONFIG_WAN_FORCE_PATH_STYLE="true",
                       RCLONE_CONFIG="/dev/null")
            # Uploads start 100 ms after a file is closed (not 5 s: at once, an upload races the rename of a
            # temporary file and lands under its name), and its remote control says when
            # they are done, which unmounting does not wait for.
            self.rc = f"127.0.0.1:{free_port()}"
            self.process = subprocess.Popen(["rclone", "mount", f"wan:{BUCKET}/{prefix}", self.path,
                                             "--vfs-cache-mode", "writes", "--vfs-write-back", "100ms", "--ignore-checksum",
                                             "--cache-dir", self.path + "-cache", "--rc", "--rc-no-auth",
                                             "--rc-addr", self.rc],
                                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            if os.path.ismount(self.path):
                break
            if self.process.poll() is not None:
                raise RuntimeError(f"{tool} exited with {self.process.returncode}")
            time.sleep(0.025)
        else:
            raise RuntimeError(f"{tool} did not mount {self.path}")
        self.sampling = threading.Event()
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()

    def sample(self):
        """Keeps the daemon's peak resident memory (the kernel's VmHWM) until it exits."""
        while not self.sampling.is_set():
            try:
                with open(f"/proc/{self.process.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.05)

    def unmount(self):
        """Unmounts and waits for the daemon to exit: for shardfs and rclone, the last upload."""
        if self.tool == "shardfs":
            subprocess.run([self.binary, "unmount", self.path], check=True)
        elif self.tool == "rclone":
            # A file is queued a moment after its close: idle means idle for a while.
            idle_since = None
            while idle_since is None or time.perf_counter() - idle_since < 0.3:
                out = subprocess.run(["rclone", "rc", "--url", f"http://{self.rc}/", "vfs/stats"],
                                     capture_output=True, text=True, check=True).stdout
                cache = json.loads(out).get("diskCache", {})
                if cache.get("uploadsInProgress", 0) or cache.get("uploadsQueued", 0):
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.perf_counter()
                time.sleep(0.02)
            subprocess.run(["fusermount3", "-u", self.path], check=False)
        elif subprocess.run(["fusermount3", "-u", self.path], check=False).returncode != 0:
            subprocess.run(["umount", "-l", self.path], check=False)  # busy after a failed workload
        try:
            self.process.wait(timeout=600 if self.tool == "shardfs" else 60)
        except subprocess.TimeoutExpired:
            if self.tool == "shardfs":
                raise
            self.process.kill()
        finally:
            self.sampling.set()
            if os.path.ismount(self.path):
                subprocess.run(["umount", "-l", self.path], check=False)


def tile_slices(i, j):
    return slice(i * 256, (i + 1) * 256), slice(j * 256, (j + 1) * 256)


TILES = [(i, j) for i in range(16) for j in range(16)]
# The wide workloads' tiles: 24x24 (9 shards of 8x8 tiles).
WIDE_TILES = [(i, j) for i in range(24) for j in range(24)]
# The workloads of many mounts at once, and how many; each is compared with the one-mount workload
# that writes the same tiles.
MANY = {"eight": 8, "sixteen": 16, "wide8": 8, "wide16": 16}
ONE_MOUNT = {"eight": "region", "sixteen": "region", "wide8": "wide", "wide16": "wide"}
WIDE = ("wide", "wide8", "wide16")


def wide_writer(tile, mounts):
    """Which of `mounts` writes `tile` in the wide workloads: an equal share of every shard's rows."""
    i, j = tile
    return (i % 8) * mounts // 8 + (j % 8) * max(mounts // 8, 1) // 8


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rtts", default="0,20,local",
                        help="round trips to add, ms, comma-separated; `local`: a local directory instead")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="bulk is SCALE x 256 MiB")
    parser.add_argument("--writers", default="direct,shardfs,rclone,s3fs,mountpoint,plain,memory")
    parser.add_argument("--workloads", default="bulk,tiles,append,region,eight,sixteen,wide,wide8,wide16")
    parser.add_argument("--binary", help="the shardfs to measure (default: a release build of this tree)")
    parser.add_argument("--mount-args", default="", help="more flags for the shardfs mounts, one string")
    parser.add_argument("--connection-mbs", type=float, default=20.0,
                        help="pace each connection to this many MB/s each way (default 20; 0: unpaced)")
    parser.add_argument("--quick", action="store_true",
                        help="--scale 0.25 --runs 1, and no append by the direct writer (minutes at 20 ms)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.scale, args.runs = 0.25, 1
    rtts = args.rtts.split(",")
    writers = args.writers.split(",")
    workloads = args.workloads.split(",")
    for tool in ("rclone", "s3fs"):
        if tool in writers and not shutil.which(tool):
            print(f"bench wan-write: {tool} is not installed; left out", file=sys.stderr)
            writers.remove(tool)
    binary = shardfs_binary(args.binary)
    work = tempfile.mkdtemp(prefix="shardfs-bench-wan-write.")
    # Made only where it is written, and each array removed once read back (tmpfs is RAM).
    memory = Local(tempfile.mkdtemp(prefix="shardfs-bench-wan-write.", dir="/dev/shm")) \
        if "memory" in writers and "local" in rtts else None
    server, port = start_s3s_fs(work)
    endpoint = f"http://127.0.0.1:{port}"
    mount_args = args.mount_args.split()
    proxies, live = {}, []
    rng = np.random.default_rng(40)
    n = int(args.scale * (256 << 20) / 4)
    bulk = np.arange(n, dtype="float32")
    tiles = rng.integers(0, 256, size=(4096, 4096), dtype="uint8")
    rewritten = rng.integers(0, 256, size=(4096, 4096), dtype="uint8")
    wide = rng.integers(0, 65536, size=(6144, 6144), dtype="uint16")
    per_append = 1 << 20
    appends = np.arange(64 * per_append, dtype="float32") * 0.5
    order = TILES[:]
    random.Random(40).shuffle(order)
    wide_order = WIDE_TILES[:]
    random.Random(40).shuffle(wide_order)
    prefixes = iter(range(1_000_000))

    def new_prefix(name):
        return f"{name}-{next(prefixes)}"

    def create(store, kind, sharded_here):
        """The empty array a workload writes (not timed: zarr-python 3.4 creates documents
        exclusively with link(2), which neither rclone nor s3fs-fuse can do)."""
        zarr.open_group(store, mode="w")
        shape, chunks, shards, dtype, compressors = {
            "bulk": (bulk.shape, (1 << 20,), (16 << 20,), "float32", None),
            "append": ((0,), (1 << 20,), (16 << 20,), "float32", None),
            **{k: ((6144, 6144), (256, 256), (2048, 2048), "uint16", zarr.codecs.ZstdCodec()) for k in WIDE},
        }.get(kind, ((4096, 4096), (256, 256), (2048, 2048), "uint8", zarr.codecs.ZstdCodec()))
        name = {"bulk": "b", "append": "a", **{k: "w" for k in WIDE}}.get(kind, "t")
        arr = zarr.create_array(store, name=name, shape=shape, chunks=chunks, shards=shards if sharded_here else None,
                                dtype=dtype, compressors=compressors, fill_value=0)
        if kind == "region" or kind in ("eight", "sixteen"):
            arr[...] = tiles

    def prepare(place, kind, prefix, sharded_here):
        """What a workload starts from: sharded for zarr-python and shardfs, as plain chunk objects
        for the mounts that show objects as they are."""
        if sharded_here:
            create(place.store(prefix, proxied=False), kind, True)
        else:
            twin = os.path.join(work, "twin")
            create(LocalStore(twin), kind, False)
            upload_twin(endpoint, prefix, twin)
            shutil.rmtree(twin)

    def write_tiles(arr_for, picks, per_shard, source=None):
        """Writes each pick's tile of `source` (`rewritten` unless told) with 8 threads; with
        `per_shard`, one tile of a shard at a time (zarr-python rewrites a shard to write a tile of
        it: two at once would lose one)."""
        source = rewritten if source is None else source
        locks = {(i, j): threading.Lock() for i in range(3) for j in range(3)}

        def one(t):
            i, j = t[1]
            with locks[(i // 8, j // 8)] if per_shard else contextlib.nullcontext():
                arr_for(t)[tile_slices(i, j)] = source[tile_slices(i, j)]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, enumerate(picks)))

    def workload(kind, store_of, per_shard):
        """Runs one workload through `store_of(k)` (the k-th of eight stores for `eight`)."""
        store = store_of(0)
        if kind in ("bulk", "tiles"):
            zarr.open_array(store, path=kind[0], mode="r+")[...] = bulk if kind == "bulk" else tiles
        elif kind == "append":
            arr = zarr.open_array(store, path="a", mode="r+")
            for k in range(64):
                arr.append(appends[k * per_append:(k + 1) * per_append])
        elif kind == "region":
            arr = zarr.open_array(store, path="t", mode="r+")
            write_tiles(lambda t: arr, order, per_shard)
        elif kind in WIDE:
            count = MANY.get(kind, 1)
            arrays = [zarr.open_array(store_of(k), path="w", mode="r+") for k in range(count)]
            write_tiles(lambda t: arrays[wide_writer(t[1], count)], wide_order, per_shard, wide)
        elif kind in MANY:
            arrays = [zarr.open_array(store_of(k), path="t", mode="r+") for k in range(MANY[kind])]
            write_tiles(lambda t: arrays[t[0] % len(arrays)], order, per_shard)

    def verify(place, kind, prefix):
        store = place.store(prefix, proxied=False)
        name, want = {"bulk": ("b", bulk), "tiles": ("t", tiles), "append": ("a", appends),
                      "region": ("t", rewritten), "eight": ("t", rewritten), "sixteen": ("t", rewritten),
                      **{k: ("w", wide) for k in WIDE}}[kind]
        got = zarr.open_array(store, path=name, mode="r")[...]
        return got.shape == want.shape and np.array_equal(got, want)

    results = {}  # (kind, writer, where) -> [(seconds, requests, MiB up, peak MiB)]
    failed = {}  # (kind, writer, where) -> why a peer could not do it
    places = []
    try:
        for rtt in rtts:
            if rtt == "local":
                places.append(Local(os.path.join(work, "local")))
            else:
                # SHARDFS_BENCH_PROXY_LOG=DIR keeps a line per request (scripts/latency_proxy.py --log).
                proxies[rtt] = Proxy(port, float(rtt), args.connection_mbs or None,
                                     os.environ.get("SHARDFS_BENCH_PROXY_LOG"))
                places.append(Bucket(proxies[rtt], endpoint))
        for run in range(args.runs):
            for place in places:
                for kind in workloads:
                    for writer in writers:
                        if args.quick and (kind, writer) == ("append", "direct"):
                            continue
                        # The other mounts need a bucket; plain chunk files, a disk.
                        if (writer in ("rclone", "s3fs", "mountpoint") and isinstance(place, Local)) or \
                                (writer in ("plain", "memory") and not isinstance(place, Local)):
                            continue
                        # Plain chunk files in memory: the same writes where the filesystem costs nothing.
                        at = memory if writer == "memory" else place
                        if kind not in NEW_FILES_ONLY.get(writer, (kind,)):
                            failed[(kind, writer, place.label)] = "unsupported: it writes new files only"
                            continue
                        prefix = new_prefix(kind)
                        if writer in ("plain", "memory"):
                            create(at.store(prefix), kind, False)
                        else:
                            prepare(place, kind, prefix, writer in ("direct", "shardfs"))
                        count = MANY.get(kind, 1)
                        if writer in ("direct", "plain", "memory"):
                            stores = [at.store(prefix) for _ in range(count)]
                            mounts = []
                        else:
                            extra = mount_args if writer == "shardfs" else []
                            mounts = [Mount(writer, work, binary, place, prefix, extra) for _ in range(count)]
                        live.extend(mounts)
                        if mounts:
                            stores = [(InPlaceStore if writer == "mountpoint" else LocalStore)(m.path) for m in mounts]
                        time.sleep(0.3)  # the mounts' own requests are not the workload's
                        before, start = place.counts(), time.perf_counter()
                        failure = None
                        try:
                            workload(kind, lambda k: stores[k % len(stores)], writer == "direct")
                            if writer in ("direct", "plain"):
                                place.sync(prefix)
                        except Exception as e:  # a peer that cannot run the workload is reported
                            failure = f"{type(e).__name__}: {e}"
                        # Eight machines unmount each on its own, at once.
                        with concurrent.futures.ThreadPoolExecutor(len(mounts) or 1) as pool:
                            list(pool.map(Mount.unmount, mounts))
                        for m in mounts:
                            live.remove(m)
                        elapsed = time.perf_counter() - start
                        after = place.counts()
                        if failure is None and not verify(at, kind, prefix):
                            failure = "wrong data read back"
                        if at is memory:
                            shutil.rmtree(os.path.join(memory.root, prefix), ignore_errors=True)
                        where = place.label
                        if failure and writer in ("direct", "shardfs"):
                            raise AssertionError(f"{writer}: {kind} at {where}: {failure}")
                        if failure:
                            failed[(kind, writer, where)] = failure.splitlines()[0][:100]
                            print(f"run {run + 1} {where}: {kind} / {writer}: FAILED: {failure}", flush=True)
                            continue
                        requests = after["requests"] - before["requests"]
                        up = (after["bytes_up"] - before["bytes_up"]) / MIB
                        down = (after["bytes_down"] - before["bytes_down"]) / MIB
                        peak = max((m.peak for m in mounts), default=0) / MIB
                        results.setdefault((kind, writer, where), []).append((elapsed, requests, up, peak, down))
                        print(f"run {run + 1} {where}: {kind} / {writer}: {elapsed:.2f} s, {requests} requests,"
                              f" {up:.0f} MiB up, {down:.0f} MiB down" + (f", peak RSS {peak:.0f} MiB" if peak else ""), flush=True)
    finally:
        for m in live:
            subprocess.run(["umount", "-l", m.path], check=False)
        for proxy in proxies.values():
            proxy.stop()
        server.terminate()
        server.wait()
        remove_unless_mounted(work)
        if memory is not None:
            shutil.rmtree(memory.root, ignore_errors=True)
    # What the many mounts' tiles are as stored: each tile zstd-compressed as the array's codec does.
    zstd = numcodecs.Zstd(level=0)
    compressed_mib = {
        "region": sum(len(zstd.encode(np.ascontiguousarray(rewritten[tile_slices(i, j)]))) for i, j in TILES) / MIB,
        "wide": sum(len(zstd.encode(np.ascontiguousarray(wide[tile_slices(i, j)]))) for i, j in WIDE_TILES) / MIB,
    }
    publish(report(args, [p.label for p in places], workloads, writers, results, failed, compressed_mib), args.out)
    return 0


def upload_twin(endpoint, prefix, root):
    """Puts the files of a local directory under the prefix, as a mount that shows objects sees them."""
    store = direct_store(endpoint, prefix)

    async def put_all():
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    data = f.read()
                key = os.path.relpath(path, root)
                await store.set(key, default_buffer_prototype().buffer.from_bytes(data))

    asyncio.run(put_all())


def report(args, wheres, workloads, writers, results, failed, compressed_mib):
    names = {"direct": "zarr-python direct (obstore; local: LocalStore)", "shardfs": "shardfs mount",
             "rclone": "rclone mount --vfs-cache-mode writes", "s3fs": "s3fs-fuse",
             "mountpoint": "mountpoint-s3 (chunk files written in place)",
             "plain": "zarr-python writing it unsharded, plain chunk files (local only)",
             "memory": "the same in memory (tmpfs, not synced; local only)"}
    what = {"bulk": f"bulk: new {args.scale * 256:.0f} MiB float32, 4 MiB chunks, 64 MiB shards",
            "tiles": "tiles: new 4096x4096 uint8, 256x256 zstd chunks, 2048x2048 shards",
            "append": "append: 64 appends to a sharded array",
            "region": "region: 256 tiles rewritten, 8 threads",
            "eight": "eight: 256 tiles rewritten through 8 mounts at once",
            "sixteen": "sixteen: 256 tiles rewritten through 16 mounts at once",
            "wide": "wide: new 6144x6144 uint16, 576 zstd tiles of ~128 KiB, 8 MiB shards, one mount",
            "wide8": "wide8: the same through 8 mounts at once, each an eighth of every shard",
            "wide16": "wide16: the same through 16 mounts at once, each a sixteenth of every shard"}
    lines = ["s3s-fs behind scripts/latency_proxy.py"
             + (f", each connection paced to {args.connection_mbs:g} MB/s" if args.connection_mbs else ", unpaced")
             + f"; median of {args.runs} run(s), each on a fresh mount and prefix, verified by reading the "
             "array back; times include the unmount; (requests, MiB sent to the server, MiB received"
             + ", shardfs's peak RSS)." + (f" shardfs mounted with `{args.mount_args}`." if args.mount_args else ""),
             "", "| workload | writer | " + " | ".join(wheres) + " |",
             "|---|---|" + "---|" * len(wheres)]
    median = {}
    for key, runs in results.items():
        t = statistics.median(r[0] for r in runs)
        median[key] = min(runs, key=lambda r: abs(r[0] - t))
    for kind in workloads:
        for writer in writers:
            cells = []
            for where in wheres:
                m = median.get((kind, writer, where))
                if m is None:
                    why = failed.get((kind, writer, where))
                    cells.append("-" if why is None else why if why.startswith("unsupported") else f"failed ({why})")
                    continue
                extra = f", {m[3]:.0f} MiB RSS" if m[3] else ""
                cells.append(f"{m[0]:.2f} s ({m[1]}, {m[2]:.0f} MiB, {m[4]:.0f} MiB{extra})")
            lines.append(f"| {what[kind]} | {names[writer]} | " + " | ".join(cells) + " |")
    lines.append("")
    for where in wheres:
        for kind in workloads:
            d, s = median.get((kind, "direct", where)), median.get((kind, "shardfs", where))
            if d and s:
                peers = [f"{p} {median[(kind, p, where)][0] / s[0]:.2f}x" for p in ("rclone", "s3fs", "mountpoint")
                         if (kind, p, where) in median]
                lines.append(f"- {where}, {kind}: shardfs / direct = {s[0] / d[0]:.2f}x the time, "
                             f"{s[2] / max(d[2], 1e-9):.2f}x the bytes sent"
                             + (f"; peers' time / shardfs's: {', '.join(peers)}" if peers else ""))
            for floor, name in (("plain", "plain chunk files"), ("memory", "chunk files in memory")):
                p = median.get((kind, floor, where))
                if p and s and d:
                    lines.append(f"- {where}, {kind}: {name} / direct = {p[0] / d[0]:.2f}x, "
                                 f"shardfs / {name} = {s[0] / p[0]:.2f}x")
        for kind in MANY:
            one = ONE_MOUNT[kind]
            if (kind, "shardfs", where) in median and (one, "shardfs", where) in median:
                e, r = median[(kind, "shardfs", where)], median[(one, "shardfs", where)]
                mib = compressed_mib[one]
                lines.append(f"- {where}: {kind} mounts / one mount writing the same tiles ({one}) = "
                             f"{e[0] / r[0]:.2f}x the time; they sent {e[2] / mib:.2f}x the compressed bytes of "
                             f"the tiles ({mib:.1f} MiB), one mount {r[2] / mib:.2f}x")
                if (kind, "rclone", where) in median:
                    lines.append(f"- {where}: {kind} rclone mounts / shardfs mounts = "
                                 f"{median[(kind, 'rclone', where)][0] / e[0]:.2f}x the time")
    return lines


if __name__ == "__main__":
    sys.exit(main())
