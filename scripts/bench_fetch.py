"""Requests and time of zarr-python reading arrays through an S3 mount, for one or more shardfs
binaries side by side (a build before a change and one after), against zarr-python reading the
bucket directly (obstore), on one local moto server.

    target/venv/bin/python scripts/bench_fetch.py BINARY [BINARY...] [--runs R] [--scale S]
                                                  [--workloads big,tiles,cat] [--disk-cache]

Arrays (the shapes of issue 23, the first one cut to S x 512 MiB, default S = 0.25):
- `big`: float32, 4 MiB chunks, 128 MiB shards;
- `tiles`: 8192x8192 uint8, 256x256 chunks, 2048x2048 shards (64 MiB, 1024 chunks, 16 shards).
Workloads, each on a fresh mount: zarr-python 3 reads the whole array (`zarr.open_array(...)[...]`,
checked against the direct read), and `cat` of every chunk file of `big`. Requests are counted
from moto's request log (GETs apart). With --disk-cache, each binary also runs each workload with
`--cache DIR` (a fresh DIR per run): once on an empty DIR (cold), then on a new mount over the same
DIR (a warm remount), which should send no GET. Median of R runs. moto is slow and on loopback: times are
for comparing builds here, not a forecast for a real bucket (see scripts/bench.sh for that).
Not a test: nothing here asserts a speed.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import boto3
import numpy as np
import zarr
from obstore.store import S3Store
from zarr.storage import ObjectStore

from bench_net import BUCKET, LoggedMoto, remove_unless_mounted

class Server(LoggedMoto):
    def requests(self):
        """(all requests, GETs) logged so far."""
        total = gets = 0
        for line in self.log_lines():
            # moto colours some lines: "\x1b[35m\x1b[1mGET /... HTTP/1.1\x1b[0m" 206
            m = re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) [^"]*" [2345]\d\d', line)
            if m:
                total += 1
                gets += m.group(1) == "GET" and "list-type" not in line
        return total, gets


def write_arrays(endpoint, scale):
    store = ObjectStore(S3Store(BUCKET, prefix="ds", endpoint=endpoint, region="us-east-1",
                                access_key_id="test", secret_access_key="test", client_options={"allow_http": True}))
    root = zarr.open_group(store, mode="w")
    n = int(scale * (512 << 20) / 4)
    chunk = (4 << 20) // 4
    big = root.create_array("big", shape=(n,), dtype="float32", chunks=(chunk,), shards=(32 * chunk,),
                            compressors=None)
    big[...] = np.arange(n, dtype="float32")
    tiles = root.create_array("tiles", shape=(8192, 8192), dtype="uint8", chunks=(256, 256),
                              shards=(2048, 2048), compressors=None)
    tiles[...] = (np.arange(8192 * 8192, dtype="uint64") * 2654435761 % 251).astype("uint8").reshape(8192, 8192)
    return store


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--workloads", default="big,tiles,cat", help="comma-separated: big, tiles, cat")
    parser.add_argument("--disk-cache", action="store_true", help="also cold and warm mounts with --cache DIR")
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    work = tempfile.mkdtemp(prefix="shardfs-bench-fetch.")
    server = Server(work)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    mounted = False
    try:
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=BUCKET)
        store = write_arrays(server.endpoint, args.scale)
        want = {name: zarr.open_array(store, path=name, mode="r")[...] for name in ("big", "tiles")}

        def measure(action):
            before, start = server.requests(), time.perf_counter()
            action()
            elapsed = time.perf_counter() - start
            time.sleep(0.3)  # the server's log catches up
            after = server.requests()
            return elapsed, after[0] - before[0], after[1] - before[1]

        rows = []
        workloads = args.workloads.split(",")
        for name in [w for w in ("big", "tiles") if w in workloads]:
            runs = [measure(lambda: zarr.open_array(store, path=name, mode="r")[...]) for _ in range(args.runs)]
            rows.append((f"zarr-python reads `{name}`", "directly (obstore)", runs))
        def mounted_run(binary, label, workload, extra):
            """Mounts with `extra` flags, runs `workload` measured, unmounts."""
            nonlocal mounted
            subprocess.run([binary, "mount", "--read-only", f"s3://{BUCKET}/ds", mnt,
                            "--endpoint-url", server.endpoint, *extra], check=True)
            mounted = True
            if workload == "cat":
                command = f"find {mnt}/big/c -type f -print0 | xargs -0 cat | wc -c"
                run = measure(lambda: subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL))
            else:
                got = []
                run = measure(lambda: got.append(zarr.open_array(os.path.join(mnt, workload), mode="r")[...]))
                assert np.array_equal(got[0], want[workload]), f"{label}: {workload} differs"
            subprocess.run([binary, "unmount", mnt], check=True)
            mounted = False
            return run

        for binary in args.binaries:
            label = os.path.relpath(os.path.realpath(binary))
            for workload in workloads:
                what = "cat of every chunk of `big`" if workload == "cat" else f"zarr-python reads `{workload}`"
                runs = [mounted_run(binary, label, workload, []) for _ in range(args.runs)]
                rows.append((what, label, runs))
                if not args.disk_cache:
                    continue
                cold, warm = [], []
                for i in range(args.runs):
                    cache = ["--cache", os.path.join(work, f"cache-{len(rows)}-{i}")]
                    cold.append(mounted_run(binary, label, workload, cache))
                    warm.append(mounted_run(binary, label, workload, cache))
                rows.append((what, f"{label} --cache, cold", cold))
                rows.append((what, f"{label} --cache, warm remount", warm))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", mnt], check=False)
        server.stop()
        remove_unless_mounted(work)
    mib = args.scale * 512
    print(f"`big`: {mib:.0f} MiB float32, 4 MiB chunks, 128 MiB shards; `tiles`: 8192x8192 uint8, 256x256 "
          f"chunks, 2048x2048 shards. moto on loopback, median of {args.runs} runs, a fresh mount each.\n")
    print("| workload | reader | time | requests | of them GETs |")
    print("|---|---|---|---|---|")
    for what, who, runs in sorted(rows, key=lambda r: r[0]):
        med = [statistics.median(r[i] for r in runs) for i in range(3)]
        print(f"| {what} | {who} | {med[0]:.2f} s | {med[1]:.0f} | {med[2]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
