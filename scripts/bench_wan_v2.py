"""Zarr v2 arrays at cloud latency: zarr-python 2.18 (a v2-only reader, its chunks one after
another) reading a v2 array of chunk files through a shardfs mount of a bucket behind the latency
proxy, and `cat` of its chunk files in C order. The view shows such an array as stored; what a
mount adds is read-ahead through its chunk files (src/view/plain_arrays.rs).

    target/venv-v2/bin/python scripts/bench_wan_v2.py [--rtt MS] [--runs R] [--binary SHARDFS ...]

The array: 4096x4096 uint8 in 128x128 chunks (1024 files of 16 KiB, no compressor, `.`
separator), written by zarr-python 2 into the directory s3s-fs serves. Each `--binary` is measured in turn, each run on a
fresh mount (the mount not timed), with the proxy's request count; the bytes read are checked.
Not a test: nothing here asserts a speed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import zarr

sys.path.insert(0, os.path.dirname(__file__))
from bench_net import BUCKET, Proxy, start_s3s_fs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rtt", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--binary", action="append", required=True, help="a shardfs to measure; repeat to compare")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="shardfs-bench-wan-v2.")
    server, port = start_s3s_fs(work)
    proxy = Proxy(port, args.rtt, 20.0)
    try:
        data = np.random.default_rng(1).integers(0, 255, (4096, 4096), dtype="u1")
        # Written into the directory s3s-fs serves, which keeps each object as a file.
        local = os.path.join(work, "s3", BUCKET, "ds", "v2")
        zarr.open_array(local, mode="w", shape=data.shape, chunks=(128, 128), dtype="u1", compressor=None)[...] = data
        # A mount of an object store wants a Zarr v3 document at its root.
        with open(os.path.join(local, "..", "zarr.json"), "w") as f:
            f.write('{"zarr_format": 3, "node_type": "group"}')
        chunks = [f"{i}.{j}" for i in range(32) for j in range(32)]
        rows = []
        for binary in args.binary:
            for run in range(args.runs):
                for what in ("zarr-python 2 reads v2", "cat of its chunk files in C order"):
                    mnt = tempfile.mkdtemp(prefix="mnt-", dir=work)
                    subprocess.run([binary, "mount", "--read-only", f"s3://{BUCKET}/ds", mnt,
                                    "--endpoint-url", proxy.endpoint], check=True)
                    try:
                        time.sleep(0.3)
                        before = proxy.counts()["requests"]
                        start = time.perf_counter()
                        if what.startswith("zarr"):
                            ok = np.array_equal(zarr.open_array(os.path.join(mnt, "v2"), mode="r")[...], data)
                        else:
                            size = 0
                            for c in chunks:
                                with open(os.path.join(mnt, "v2", c), "rb") as f:
                                    size += len(f.read())
                            ok = size == data.nbytes
                        took = time.perf_counter() - start
                        requests = proxy.counts()["requests"] - before
                    finally:
                        subprocess.run([binary, "unmount", mnt], check=False)
                    assert ok, f"{what} through {binary} read wrong"
                    rows.append((binary, what, took, requests))
                    print(f"bench wan v2: {binary} {what}: {took:.2f} s ({requests} requests)", flush=True)
        print(f"| binary | workload | RTT {args.rtt:g} ms, median of {args.runs} |\n|---|---|---|")
        for binary in args.binary:
            for what in ("zarr-python 2 reads v2", "cat of its chunk files in C order"):
                got = sorted((t, r) for b, w, t, r in rows if b == binary and w == what)
                t, r = got[len(got) // 2]
                print(f"| {binary} | {what} | {t:.2f} s ({r} requests) |")
    finally:
        proxy.stop()
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
