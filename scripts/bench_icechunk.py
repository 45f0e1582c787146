"""The icechunk profile of scripts/bench.sh: reading and writing an Icechunk repository through a
shardfs mount against Icechunk's own Python reader and writer, on the local disk and in an object
store at cloud latency.

    target/venv-newest/bin/python scripts/bench_icechunk.py [--rtts 0,20] [--runs R] [--quick]
                                                            [--binary SHARDFS] [--out FILE]

Icechunk 2.3 writes one repository (spec v2) into the directory an s3s-fs server serves, so the
same objects are read from disk and through the bucket: `big`, 256 MiB of float32 in 1 MiB
chunks (native chunk objects, uncompressed), and `tiles`, 8192x8192 uint8 in 256x256 chunks.
Readers, each on a fresh session or mount: zarr-python on Icechunk's session store (its own
reader, Rust underneath), and zarr-python on the files of a shardfs mount of the repository
(release build), zarr-python's thread pool and concurrency at 16 for both. Workloads: all of `big`; 256 tiles picked at random (the same for both), read by
8 threads. Writes, each of a new array and ending in its commit: `big` again (256 MiB of float32,
here in 4 MiB chunks) by zarr-python on a writable session of Icechunk's, then its commit, against
zarr-python on the files of a mount of branch main, then `shardfs unmount` (which returns once the
commit is made); and 256 random 256x256 tiles of a new 8192x8192 uint8 array, by 8 threads. Object
store requests go through scripts/latency_proxy.py (the RTT added to each turn, 20 MB/s per
connection), which counts them. Every read is compared with what was written, and every write is
read back through Icechunk's reader (outside the time). Not a test: nothing here asserts a speed.
"""

import argparse
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import icechunk as ic
import numpy as np
import zarr
from bench_net import BUCKET, Proxy, shardfs_binary, start_s3s_fs

warnings.simplefilter("ignore")
# zarr-python reads files on a thread pool of cores + 4 threads (6 here), which bounds reads of a
# mount at latency; Icechunk's reader fetches from Rust, unbounded by it. 16 for both.
zarr.config.set({"threading.max_workers": 16, "async.concurrency": 16})


def write_repository(path):
    repo = ic.Repository.create(ic.local_filesystem_storage(path))
    session = repo.writable_session("main")
    root = zarr.group(store=session.store)
    big = np.random.default_rng(1).random(64 << 20, dtype="f4")
    root.create_array("big", shape=big.shape, chunks=(1 << 18,), dtype="f4", compressors=None)[...] = big
    tiles = np.random.default_rng(2).integers(0, 255, (8192, 8192), dtype="u1")
    root.create_array("tiles", shape=tiles.shape, chunks=(256, 256), dtype="u1", compressors=None)[...] = tiles
    session.commit("bench")
    return {"big": big, "tiles": tiles}


def read_big(group, want):
    got = group["big"][...]
    assert np.array_equal(got, want["big"]), "big read wrong"


def read_tiles(group, want, picks):
    arr = group["tiles"]

    def one(ij):
        i, j = ij
        got = arr[i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]
        assert np.array_equal(got, want["tiles"][i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]), "tile read wrong"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, picks))


def write_big(group, want, name):
    group.create_array(name, shape=want["big"].shape, chunks=(1 << 20,), dtype="f4", compressors=None)[...] = want["big"]


def write_tiles(group, want, picks, name):
    arr = group.create_array(name, shape=(8192, 8192), chunks=(256, 256), dtype="u1", compressors=None,
                             fill_value=0)

    def one(ij):
        i, j = ij
        arr[i * 256:(i + 1) * 256, j * 256:(j + 1) * 256] = want["tiles"][i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, picks))


def check_written(repo_dir, name, want, picks):
    """The array `name` as Icechunk's reader finds it on branch main: what was written."""
    root = zarr.open_group(ic.Repository.open(ic.local_filesystem_storage(repo_dir)).readonly_session("main").store,
                           mode="r")
    if name.startswith("big"):
        assert np.array_equal(root[name][...], want["big"]), f"{name} written wrong"
        return
    got, expected = root[name][...], np.zeros((8192, 8192), dtype="u1")
    for i, j in picks:
        expected[i * 256:(i + 1) * 256, j * 256:(j + 1) * 256] = want["tiles"][i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]
    assert np.array_equal(got, expected), f"{name} written wrong"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rtts", default="0,20", help="round trips to add, ms, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="--runs 1")
    parser.add_argument("--binary", help="the shardfs to measure (default: a release build of this tree)")
    parser.add_argument("--out")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    binary = shardfs_binary(args.binary)
    work = tempfile.mkdtemp(prefix="shardfs-bench-icechunk.")
    server, port = start_s3s_fs(work)
    proxies, mounts = {}, []
    try:
        repo_dir = os.path.join(work, "s3", BUCKET, "repo")
        start = time.perf_counter()
        want = write_repository(repo_dir)
        print(f"bench icechunk: repository written in {time.perf_counter() - start:.1f} s", flush=True)
        picks = [(r.randrange(32), r.randrange(32)) for r in [random.Random(42)] for _ in range(256)]
        places = ["local"] + [float(r) for r in args.rtts.split(",")]
        for rtt in places[1:]:
            proxies[rtt] = Proxy(port, rtt, 20.0)

        def storage_at(place):
            if place == "local":
                return ic.local_filesystem_storage(repo_dir)
            return ic.s3_storage(bucket=BUCKET, prefix="repo", endpoint_url=proxies[place].endpoint, allow_http=True,
                                 region="us-east-1", access_key_id="test", secret_access_key="test",
                                 force_path_style=True)

        def icechunk_group(place, write):
            repo = ic.Repository.open(storage_at(place))
            if not write:
                return zarr.open_group(repo.readonly_session("main").store, mode="r"), lambda: None
            session = repo.writable_session("main")
            return zarr.open_group(session.store, mode="r+"), lambda: session.commit("bench")

        def shardfs_group(place, write):
            mnt = tempfile.mkdtemp(prefix="mnt-", dir=work)
            source = repo_dir if place == "local" else f"s3://{BUCKET}/repo"
            endpoint = [] if place == "local" else ["--endpoint-url", proxies[place].endpoint]
            subprocess.run([binary, "mount", source, mnt, *endpoint], check=True)
            mounts.append(mnt)
            # The commit is made by the unmount, which returns once it is.
            return zarr.open_group(mnt, mode="r+" if write else "r"), lambda: unmount_all()

        def unmount_all():
            while mounts:
                subprocess.run([binary, "unmount", mounts.pop()], check=True)

        written = iter(range(1 << 30))
        workloads = {"big, all (256 MiB)": (False, lambda g, _: read_big(g, want)),
                     "tiles, 256 random": (False, lambda g, _: read_tiles(g, want, picks)),
                     "big written (256 MiB, 4 MiB chunks)": (True, lambda g, name: write_big(g, want, name)),
                     "tiles written, 256 random": (True, lambda g, name: write_tiles(g, want, picks, name))}
        readers = {"icechunk": icechunk_group, "shardfs": shardfs_group}
        results = {}
        for _ in range(runs):
            for place in places:
                for workload, (write, run) in workloads.items():
                    for reader, open_group in readers.items():
                        name = f"{'big' if workload.startswith('big') else 'tiles'}_{next(written)}"
                        proxy = proxies.get(place)
                        before = proxy.counts()["requests"] if proxy else 0
                        start = time.perf_counter()
                        group, commit = open_group(place, write)
                        run(group, name)
                        commit()
                        elapsed = time.perf_counter() - start
                        requests = proxy.counts()["requests"] - before if proxy else None
                        results.setdefault((workload, place, reader), []).append((elapsed, requests))
                        unmount_all()
                        if write:
                            check_written(repo_dir, name, want, picks)
        lines = ["| workload | where | Icechunk's own | shardfs mount | ratio |", "|---|---|---|---|---|"]
        for workload in workloads:
            for place in places:
                cells = []
                for reader in readers:
                    measured = sorted(results[(workload, place, reader)])
                    elapsed, requests = measured[len(measured) // 2]
                    cells.append((elapsed, requests))
                shown = [f"{t:.2f} s" + (f" ({n} req)" if n is not None else "") for t, n in cells]
                where = place if place == "local" else f"{place:g} ms"
                lines.append(f"| {workload} | {where} | {shown[0]} | {shown[1]} | {cells[1][0] / cells[0][0]:.2f}x |")
        table = "\n".join(lines)
        print(table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(f"Icechunk {ic.__version__}, zarr-python {zarr.__version__}; medians of {runs} runs\n\n")
                f.write(table + "\n")
    finally:
        for mnt in mounts:
            subprocess.run([binary, "unmount", mnt], check=False)
        for proxy in proxies.values():
            proxy.stop()
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
