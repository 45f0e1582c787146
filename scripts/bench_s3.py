"""The s3 profile of scripts/bench.sh: shardfs over sharded objects against s3fs-fuse over the same
chunks stored one object each, on one local S3 server (moto), side by side in one run. With
`--service azure` or `gcs` (the azure and gcs profiles), shardfs alone on Azurite or
fake-gcs-server (the servers and clients of tests/interop/object_stores.py, with their access logs on):
s3fs-fuse speaks only S3.

    target/venv/bin/python scripts/bench_s3.py [--shards N] [--chunks-per-shard M] [--chunk-bytes B]
                                               [--runs R] [--out FILE]
    target/venv/bin/python scripts/bench_s3.py --service azure|gcs [same options]

Measured for each (median of R runs, each on a fresh mount so that nothing is cached, except the
warm repeat): `find` + `cat` of every chunk, cold; the same again on the same mount, warm; 10,000
random chunk reads (examples/random_reads, 1 thread) on a fresh mount; and zarr-python 3 reading
the whole sharded array directly from the bucket (obstore) against reading it through the
shardfs mount. Requests are counted from the server's request log. Not a test: nothing here
asserts a speed. Writes a markdown table to FILE (default: print only).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import zarr
from zarr.storage import ObjectStore

BUCKET = "bench"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
import object_stores  # noqa: E402
from bench_net import LoggedMoto, publish, remove_unless_mounted  # noqa: E402


class Server(LoggedMoto):
    def requests(self):
        return sum(1 for line in self.log_lines() if '" 2' in line or '" 3' in line or '" 4' in line)


class Emulator:
    """A server of tests/interop/object_stores.py for another service, with its access log on:
    each request is one line carrying its status."""

    def __init__(self, service, work):
        base = object_stores.SERVICES[service]
        quiet = {"--silent"}

        class Logged(base):
            def command(self):
                command = [c for c in super().command() if c not in quiet]
                return [("info" if c == "error" and command[i - 1] == "-log-level" else c) for i, c in enumerate(command)]

        self.server = Logged()
        os.environ.update(self.server.environment(work))
        self.server.start()
        self.endpoint, self.scheme = self.server.endpoint, self.server.scheme
        self.server.make_bucket(object_stores.BUCKET)

    def requests(self):
        with open(os.path.join(self.server.data, "server.log"), errors="replace") as f:
            return sum(1 for line in f if '" 2' in line or '" 3' in line or '" 4' in line)

    def stop(self):
        self.server.stop()
        self.server.cleanup()


def upload(s3, local, prefix):
    for dirpath, _, names in os.walk(local):
        for name in names:
            path = os.path.join(dirpath, name)
            key = prefix + "/" + os.path.relpath(path, local)
            with open(path, "rb") as f:
                s3.put_object(Bucket=BUCKET, Key=key, Body=f.read())


class System:
    def __init__(self, name, server, work, binary, url=f"s3://{BUCKET}/sharded"):
        self.name, self.server, self.work, self.binary, self.url = name, server, work, binary, url
        self.mnt = os.path.join(work, "mnt-" + name)
        os.makedirs(self.mnt, exist_ok=True)

    def mount(self):
        if self.name == "shardfs":
            subprocess.run([self.binary, "mount", "--read-only", self.url, self.mnt,
                            "--endpoint-url", self.server.endpoint], check=True)
        else:
            passwd = os.path.join(self.work, "passwd-s3fs")
            with open(passwd, "w") as f:
                f.write("test:test\n")
            os.chmod(passwd, 0o600)
            subprocess.run(["s3fs", f"{BUCKET}:/plain", self.mnt, "-o", f"url={self.server.endpoint}",
                            "-o", "use_path_request_style", "-o", f"passwd_file={passwd}", "-o", "ro"], check=True)
            for _ in range(100):
                if os.path.ismount(self.mnt):
                    break
                time.sleep(0.05)

    def unmount(self):
        subprocess.run(["umount", self.mnt], check=False)
        for _ in range(100):
            if not os.path.ismount(self.mnt):
                break
            time.sleep(0.05)


def timed(server, command):
    before = server.requests()
    start = time.perf_counter()
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    time.sleep(0.2)
    return elapsed, server.requests() - before


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--chunks-per-shard", type=int, default=256)
    parser.add_argument("--chunk-bytes", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--service", choices=("s3", "azure", "gcs"), default="s3")
    args = parser.parse_args()
    if args.service != "s3":
        return bench_emulator(args)
    if not shutil.which("s3fs"):
        print("bench: installing s3fs with apt-get")
        subprocess.run("apt-get install -y -qq s3fs >/dev/null || (apt-get update -qq && apt-get install -y -qq s3fs >/dev/null)",
                       shell=True, check=True)
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "--bins", "--examples"], cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target/release/shardfs")
    reads = os.path.join(ROOT, "target/release/examples/random_reads")
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    total = args.shards * args.chunks_per_shard
    work = tempfile.mkdtemp(prefix="shardfs-bench-s3.")
    server = Server(work)
    systems = []
    try:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench_store.py"), os.path.join(work, "gen"),
                        "--shards", str(args.shards), "--chunks-per-shard", str(args.chunks_per_shard),
                        "--chunk-bytes", str(args.chunk_bytes)], check=True)
        import boto3

        s3 = boto3.client("s3", endpoint_url=server.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        upload(s3, os.path.join(work, "gen/sharded"), "sharded")
        upload(s3, os.path.join(work, "gen/plain"), "plain")
        print(f"bench s3: {total} chunks of {args.chunk_bytes} bytes, {args.shards} shards, {args.runs} runs")
        rows = {}
        systems = [System(name, server, work, binary) for name in ("shardfs", "s3fs")]
        for system in systems:
            rows[system.name] = measure(system, server, reads, total, args.runs)
        store = ObjectStore(object_stores.s3_objects(server.endpoint, "sharded", BUCKET))
        zp_direct, zp_through = zarr_reads(server, store, systems[0], args.runs)
    finally:
        for system in systems:
            system.unmount()
        server.stop()
        remove_unless_mounted(work)
    s, f = rows["shardfs"], rows["s3fs"]
    lines = [
        f"S3 profile: {total} chunks of {args.chunk_bytes} bytes in {args.shards} shards on a local moto server, "
        f"median of {args.runs} runs, one run of `scripts/bench.sh --profile s3`.",
        "",
        "| operation | shardfs (sharded objects) | requests | s3fs-fuse (one object per chunk) | requests | s3fs / shardfs |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (("cold", "find + cat of every chunk, cold"), ("warm", "the same again, warm"),
                       ("random", "10,000 random chunk reads, fresh mount")):
        lines.append(f"| {label} | {s[key][0]:.2f} s | {s[key][1]} | {f[key][0]:.2f} s | {f[key][1]} | "
                     f"{f[key][0] / s[key][0]:.1f}x |")
    lines += [
        "",
        "| zarr-python 3 reading the whole array | time | requests |",
        "|---|---|---|",
        f"| directly from the bucket (obstore) | {zp_direct[0]:.2f} s | {zp_direct[1]} |",
        f"| through the shardfs mount | {zp_through[0]:.2f} s | {zp_through[1]} |",
    ]
    publish(lines, args.out)
    return 0


def measure(system, server, reads, total, runs):
    """Medians (time, requests) of a cold and a warm find + cat and of 10,000 random reads."""
    results = {"cold": [], "warm": [], "random": []}
    for _ in range(runs):
        system.mount()
        results["cold"].append(timed(server, f"find {system.mnt} -type f -print0 | xargs -0 cat"))
        results["warm"].append(timed(server, f"find {system.mnt} -type f -print0 | xargs -0 cat"))
        system.unmount()
        system.mount()
        results["random"].append(timed(server, f"{reads} {system.mnt}/a/c 10000 1 {total}"))
        system.unmount()
    return {k: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v)) for k, v in results.items()}


def zarr_reads(server, store, shardfs, runs):
    """Medians (time, requests) of zarr-python reading the whole array directly from `store`, and
    through a fresh mount of `shardfs`; the two reads must agree."""
    direct, through = [], []
    for _ in range(runs):
        before, start = server.requests(), time.perf_counter()
        want = zarr.open_array(store, path="a", mode="r")[...]
        direct.append((time.perf_counter() - start, server.requests() - before))
        shardfs.mount()
        before, start = server.requests(), time.perf_counter()
        got = zarr.open_array(os.path.join(shardfs.mnt, "a"), mode="r")[...]
        through.append((time.perf_counter() - start, server.requests() - before))
        shardfs.unmount()
        assert np.array_equal(want, got), "zarr-python read different data through the mount"
    return tuple((statistics.median(t for t, _ in v), statistics.median(r for _, r in v)) for v in (direct, through))


def bench_emulator(args):
    """shardfs alone over the sharded objects on Azurite or fake-gcs-server."""
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "--bins", "--examples"], cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target/release/shardfs")
    reads = os.path.join(ROOT, "target/release/examples/random_reads")
    total = args.shards * args.chunks_per_shard
    work = tempfile.mkdtemp(prefix=f"shardfs-bench-{args.service}.")
    server = Emulator(args.service, work)
    shardfs = System("shardfs", server, work, binary, f"{server.scheme}://{object_stores.BUCKET}/sharded")
    try:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench_store.py"), os.path.join(work, "gen"),
                        "--shards", str(args.shards), "--chunks-per-shard", str(args.chunks_per_shard),
                        "--chunk-bytes", str(args.chunk_bytes)], check=True)
        object_stores.upload(server.server, os.path.join(work, "gen/sharded"), "sharded")
        print(f"bench {args.service}: {total} chunks of {args.chunk_bytes} bytes, {args.shards} shards, {args.runs} runs")
        row = measure(shardfs, server, reads, total, args.runs)
        store = object_stores.zarr_store(server.server, "sharded")
        zp_direct, zp_through = zarr_reads(server, store, shardfs, args.runs)
    finally:
        shardfs.unmount()
        server.stop()
        remove_unless_mounted(work)
    name = {"azure": "Azure profile (Azurite)", "gcs": "GCS profile (fake-gcs-server)"}[args.service]
    lines = [
        f"{name}: {total} chunks of {args.chunk_bytes} bytes in {args.shards} shards, median of {args.runs} runs, "
        f"one run of `scripts/bench.sh --profile {args.service}`.",
        "",
        "| operation | shardfs (sharded objects) | requests |",
        "|---|---|---|",
    ]
    for key, label in (("cold", "find + cat of every chunk, cold"), ("warm", "the same again, warm"),
                       ("random", "10,000 random chunk reads, fresh mount")):
        lines.append(f"| {label} | {row[key][0]:.2f} s | {row[key][1]} |")
    lines += [
        "",
        "| zarr-python 3 reading the whole array | time | requests |",
        "|---|---|---|",
        f"| directly from the {'container' if args.service == 'azure' else 'bucket'} (obstore) | {zp_direct[0]:.2f} s | {zp_direct[1]} |",
        f"| through the shardfs mount | {zp_through[0]:.2f} s | {zp_through[1]} |",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
