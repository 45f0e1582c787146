"""The wan profile of scripts/bench.sh: reading sharded Zarr from an object store at cloud latency,
shardfs against the other ways to read the same objects, all in one run.

    target/venv/bin/python scripts/bench_wan.py [--rtts 0,20,50] [--runs R] [--scale S] [--quick]
                                                [--readers ...] [--binary SHARDFS] [--mount-args ARGS]
                                                [--connection-mbs MBS] [--out FILE]

One s3s-fs server (fast, Rust; scripts/s3s_fs.sh builds it) holds the arrays of issue 23, written
by zarr-python (scripts/bench_fetch.py's `write_arrays`): `big`, S x 512 MiB float32 (4 MiB
chunks, 128 MiB shards) and `tiles`, 8192x8192 uint8 (256x256 chunks, 2048x2048 shards). Every
reader goes through scripts/latency_proxy.py, one proxy per round trip, which adds the RTT to each
request/response turn and each new connection, paces each connection (20 MB/s each way unless
told), and counts the requests. Readers:

- zarr-python 3 on the bucket directly (obstore's S3Store): the speed to match;
- zarr-python through a shardfs mount of the bucket (the unsharded view, release build);
- zarr-python through s3fs-fuse, rclone mount and mountpoint-s3 (mount-s3 over mountpoint-s3-fs
  0.11, built by scripts/mountpoint_s3.sh, with the options a user gives for a local endpoint:
  --endpoint-url, --force-path-style, --read-only); all three show the sharded objects as they
  are, so zarr-python reads shard indexes and chunk ranges through them;
- `cat` of every chunk file of `big` through shardfs, against `cat` of its shard objects through
  s3fs-fuse, rclone mount and mountpoint-s3, and boto3 downloading those shard objects (its
  parallel ranged GETs);
- `ls -lR` of the chunk directories of both arrays through shardfs (each shard's index read), and
  of the same chunk files on the local disk;
- random reads: 256 tiles of `tiles` picked at random (the same for every reader), read by 8
  threads, one zarr-python selection each (one inner chunk);
- zarr-python reading the same arrays unsharded, as plain chunk files on the local disk (no
  network, warm): what reading per-chunk files costs zarr-python itself, the floor of any view
  that shows them (the RTT does not apply to it; it is measured at each, like the others);
- zarr-python through a shardfs mount of the same shards on the local disk (`local`: no network,
  warm): the floor of the view itself, what FUSE and the daemon add to reading chunk files.

Each measurement is on a fresh mount (or a fresh client), and runs are interleaved: run 1 of every
reader at every RTT, then run 2. The table gives medians of R runs and the requests of the median
run (workload only, not the mount). Not a test: nothing here asserts a speed.
"""

import argparse
import concurrent.futures
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import boto3
import numpy as np
import zarr
from bench_fetch import write_arrays
from bench_net import (BUCKET, KEYS, Proxy, mount_s3_binary,
                        publish, remove_unless_mounted, shardfs_binary, start_s3s_fs)
from obstore.store import S3Store
from zarr.storage import ObjectStore


PEERS = ("shardfs", "s3fs", "rclone", "mountpoint")


class Mounts:
    """Mounts of the bucket's `ds` prefix through one proxy, by shardfs, s3fs-fuse, rclone or
    mountpoint-s3 (`read_only=False`: writable, as far as each tool writes)."""

    def __init__(self, work, binary, mount_args, read_only=True, local=None):
        self.work, self.binary, self.mount_args, self.read_only = work, binary, mount_args, read_only
        self.local = local  # the directory a `local` mount shows
        self.foreground = {}  # mount point -> mount-s3's process (it runs in the foreground here)
        self.passwd = os.path.join(work, "passwd-s3fs")
        with open(self.passwd, "w") as f:
            f.write("test:test\n")
        os.chmod(self.passwd, 0o600)
        self.live = []

    def mount(self, tool, proxy):
        mnt = tempfile.mkdtemp(prefix=f"mnt-{tool}-", dir=self.work)
        if tool == "mountpoint":
            env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
            mount_s3 = mount_s3_binary()
            ro = ["--read-only"] if self.read_only else []
            self.foreground[mnt] = subprocess.Popen(
                [mount_s3, BUCKET, mnt, "--prefix", "ds/", "--endpoint-url", proxy.endpoint, "--force-path-style", *ro],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif tool == "shardfs":
            subprocess.run([self.binary, "mount", "--read-only", f"s3://{BUCKET}/ds", mnt,
                            "--endpoint-url", proxy.endpoint, *self.mount_args], check=True)
        elif tool == "local":
            subprocess.run([self.binary, "mount", "--read-only", self.local, mnt, *self.mount_args], check=True)
        elif tool == "s3fs":
            subprocess.run(["s3fs", f"{BUCKET}:/ds", mnt, "-o", f"url={proxy.endpoint}", "-o", "use_path_request_style",
                            "-o", f"passwd_file={self.passwd}", "-o", "ro"], check=True)
        else:
            # rclone's S3 backend refuses any AWS_CA_BUNDLE (its HTTP transport is its own); plain HTTP here.
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
            env.update(RCLONE_CONFIG_WAN_TYPE="s3", RCLONE_CONFIG_WAN_PROVIDER="Other",
                       RCLONE_CONFIG_WAN_ENDPOINT=proxy.endpoint, RCLONE_CONFIG_WAN_ACCESS_KEY_ID="test",
                       RCLONE_CONFIG_WAN_SECRET_ACCESS_KEY="test", RCLONE_CONFIG_WAN_FORCE_PATH_STYLE="true",
                       RCLONE_CONFIG="/dev/null")
            subprocess.run(["rclone", "mount", f"wan:{BUCKET}/ds", mnt, "--daemon", "--read-only",
                            "--vfs-cache-mode", "off"], check=True, env=env, stderr=subprocess.DEVNULL)
        self.live.append(mnt)
        for _ in range(200):
            if os.path.ismount(mnt):
                return mnt
            time.sleep(0.05)
        raise RuntimeError(f"{tool} did not mount {mnt}")

    def unmount(self, mnt):
        subprocess.run(["umount", mnt], check=False, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if not os.path.ismount(mnt):
                break
            time.sleep(0.05)
        else:
            subprocess.run(["umount", "-l", mnt], check=False)
        if mnt in self.foreground:
            self.foreground.pop(mnt).wait(30)
        self.live.remove(mnt)

    def unmount_all(self):
        for mnt in list(self.live):
            self.unmount(mnt)


class Sink:
    """A file-like object that keeps only the count of bytes written (boto3's download target)."""

    def __init__(self):
        self.size = 0

    def write(self, data):
        self.size += len(data)


def direct_store(proxy):
    return ObjectStore(S3Store(BUCKET, prefix="ds", endpoint=proxy.endpoint, region="us-east-1",
                               client_options={"allow_http": True}, **KEYS))


def random_tiles(arr, picks):
    """Each pick's 256x256 tile, read by 8 threads."""

    def one(ij):
        i, j = ij
        return arr[i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, picks))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rtts", default="0,20,50", help="round trips to add, ms, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="`big` is SCALE x 512 MiB")
    parser.add_argument("--quick", action="store_true", help="--scale 0.25 --runs 1 --rtts 0,20 (for iteration)")
    parser.add_argument("--readers", default="direct,shardfs,s3fs,rclone,mountpoint,boto3,plain,local")
    parser.add_argument("--binary", help="the shardfs to measure (default: a release build of this tree)")
    parser.add_argument("--mount-args", default="",
                        help="more flags for the shardfs mount, one string (\"--part-size 64M\")")
    # S3's connections carry about 90 MB/s; 20 keeps the network the bound where the proxy, in
    # Python, shares 2 cores with the server and the readers. Unpaced, loopback's gigabytes per
    # connection would reward opening few.
    parser.add_argument("--connection-mbs", type=float, default=20.0,
                        help="pace each connection to this many MB/s each way, as the proxy's option "
                             "(default 20; 0: unpaced)")
    parser.add_argument("--proxy-log", metavar="DIR",
                        help="each proxy writes a line per request to DIR/proxy-<RTT>ms.log (which requests a reader made)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.scale, args.runs, args.rtts = 0.25, 1, "0,20"
    rtts = [float(r) for r in args.rtts.split(",")]
    readers = args.readers.split(",")
    binary = shardfs_binary(args.binary)
    work = tempfile.mkdtemp(prefix="shardfs-bench-wan.")
    server, port = start_s3s_fs(work)
    local = os.path.join(work, "local")
    proxies, mounts = {}, Mounts(work, binary, args.mount_args.split(), local=local)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        start = time.perf_counter()
        store = write_arrays(endpoint, args.scale)
        want = {name: zarr.open_array(store, path=name, mode="r")[...] for name in ("big", "tiles")}
        plain = os.path.join(work, "plain")
        zarr.open_group(local, mode="w")
        for name, source in want.items():
            sharded = zarr.open_array(store, path=name, mode="r")
            zarr.create_array(os.path.join(plain, name), shape=source.shape, chunks=sharded.chunks,
                              dtype=source.dtype, compressors=None)[...] = source
            zarr.create_array(os.path.join(local, name), shape=source.shape, chunks=sharded.chunks,
                              shards=sharded.shards, dtype=source.dtype, compressors=None)[...] = source
        listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=BUCKET, Prefix="ds/big/c/")
        shards = sorted(o["Key"] for o in listing["Contents"])
        shard_bytes = sum(o["Size"] for o in listing["Contents"])  # the chunks and the shards' indexes
        print(f"bench wan: arrays written in {time.perf_counter() - start:.1f} s; shards of big: {len(shards)}",
              flush=True)
        for rtt in rtts:
            proxies[rtt] = Proxy(port, rtt, args.connection_mbs, args.proxy_log)
        picks = [(r.randrange(32), r.randrange(32)) for r in [random.Random(42)] for _ in range(256)]
        want_tiles = [want["tiles"][i * 256:(i + 1) * 256, j * 256:(j + 1) * 256] for i, j in picks]

        # Each workload: (label, reader, function of the proxy returning a check, or None).
        def zarr_direct(name):
            def run(proxy):
                return np.array_equal(zarr.open_array(direct_store(proxy), path=name, mode="r")[...], want[name])
            return run

        def zarr_plain(name):
            def run(proxy):
                return np.array_equal(zarr.open_array(os.path.join(plain, name), mode="r")[...], want[name])
            return run

        def zarr_mounted(tool, name):
            def run(proxy, mnt):
                return np.array_equal(zarr.open_array(os.path.join(mnt, name), mode="r")[...], want[name])
            return tool, run

        def random_direct(proxy):
            got = random_tiles(zarr.open_array(direct_store(proxy), path="tiles", mode="r"), picks)
            return all(np.array_equal(a, b) for a, b in zip(got, want_tiles))

        def random_mounted(tool):
            def run(proxy, mnt):
                got = random_tiles(zarr.open_array(os.path.join(mnt, "tiles"), mode="r"), picks)
                return all(np.array_equal(a, b) for a, b in zip(got, want_tiles))
            return tool, run

        def cat(tool):
            def run(proxy, mnt):
                out = subprocess.run(f"find {mnt}/big/c -type f -print0 | xargs -0 cat | wc -c", shell=True,
                                     check=True, capture_output=True, text=True).stdout
                return int(out) == (want["big"].nbytes if tool == "shardfs" else shard_bytes)
            return tool, run

        chunk_files = sum(int(np.prod(a.cdata_shape)) for a in (zarr.open_array(os.path.join(plain, n), mode="r")
                                                                 for n in ("big", "tiles")))

        def listing(root):
            out = subprocess.run(f"ls -lR {root}/big/c {root}/tiles/c", shell=True, check=True,
                                 capture_output=True, text=True).stdout
            return sum(line.startswith("-") for line in out.splitlines()) == chunk_files

        def boto3_download(proxy):
            s3 = boto3.client("s3", endpoint_url=proxy.endpoint)
            sink = Sink()
            for key in shards:
                s3.download_fileobj(BUCKET, key, sink)
            return sink.size == shard_bytes

        big_mib = args.scale * 512
        workloads = []
        for name, what in (("big", f"zarr-python reads `big` ({big_mib:.0f} MiB)"),
                           ("tiles", "zarr-python reads `tiles` (64 MiB)")):
            workloads.append((what, "direct", zarr_direct(name)))
            for tool in PEERS:
                workloads.append((what, tool, zarr_mounted(tool, name)))
            workloads.append((what, "plain", zarr_plain(name)))
            workloads.append((what, "local", zarr_mounted("local", name)))
        what = f"cat of every chunk of `big` ({big_mib:.0f} MiB)"
        workloads.append((what, "shardfs", cat("shardfs")))
        workloads.append((what, "s3fs", cat("s3fs")))
        workloads.append((what, "rclone", cat("rclone")))
        workloads.append((what, "mountpoint", cat("mountpoint")))
        workloads.append((what, "boto3", boto3_download))
        what = f"ls -lR of the chunk files of both ({chunk_files})"
        workloads.append((what, "shardfs", ("shardfs", lambda proxy, mnt: listing(mnt))))
        workloads.append((what, "plain", lambda proxy: listing(plain)))
        what = "256 random tiles of `tiles`, 8 threads"
        workloads.append((what, "direct", random_direct))
        for tool in PEERS:
            workloads.append((what, tool, random_mounted(tool)))
        workloads = [w for w in workloads if w[1] in readers]

        results = {}  # (what, reader, rtt) -> [(seconds, requests, GETs)]
        for run in range(args.runs):
            for rtt in rtts:
                proxy = proxies[rtt]
                for what, reader, action in workloads:
                    mnt = None
                    if isinstance(action, tuple):
                        tool, fn = action
                        mnt = mounts.mount(tool, proxy)
                        time.sleep(0.3)  # the mount's own requests are not the workload's
                    before, start = proxy.counts(), time.perf_counter()
                    ok = fn(proxy, mnt) if mnt else action(proxy)
                    elapsed = time.perf_counter() - start
                    after = proxy.counts()
                    if mnt:
                        mounts.unmount(mnt)
                    if not ok:
                        raise AssertionError(f"{reader} read wrong data: {what} at {rtt} ms")
                    requests = after["requests"] - before["requests"]
                    gets = after["by_kind"].get("GET", 0) - before["by_kind"].get("GET", 0)
                    results.setdefault((what, reader, rtt), []).append((elapsed, requests, gets))
                    print(f"run {run + 1} rtt {rtt:g} ms: {what} / {reader}: {elapsed:.2f} s, {requests} requests",
                          flush=True)
    finally:
        mounts.unmount_all()
        for proxy in proxies.values():
            proxy.stop()
        server.terminate()
        server.wait()
        remove_unless_mounted(work)

    names = {"direct": "zarr-python direct (obstore)", "shardfs": "shardfs mount", "s3fs": "s3fs-fuse",
             "rclone": "rclone mount", "mountpoint": "mountpoint-s3 (mountpoint-s3-fs 0.11)", "boto3": "boto3 download_fileobj of the shards",
             "plain": "plain chunk files, local disk (unsharded)",
             "local": "shardfs mount of the shards on the local disk"}
    median = {}
    for key, runs in results.items():
        t = statistics.median(r[0] for r in runs)
        median[key] = (t, min(runs, key=lambda r: abs(r[0] - t))[1])
    lines = [f"`big`: {args.scale * 512:.0f} MiB float32, 4 MiB chunks, 128 MiB shards; `tiles`: 8192x8192 uint8, "
             f"256x256 chunks, 2048x2048 shards. s3s-fs behind scripts/latency_proxy.py"
             + (f", each connection paced to {args.connection_mbs:g} MB/s" if args.connection_mbs else ", unpaced")
             + f"; median of {args.runs} "
             f"run(s), each on a fresh mount or client; requests in parentheses."
             + (f" shardfs mounted with `{args.mount_args}`." if args.mount_args else ""), "",
             "| workload | reader | " + " | ".join(f"RTT {r:g} ms" for r in rtts) + " |",
             "|---|---|" + "---|" * len(rtts)]
    seen = []
    for what, reader, _ in workloads:
        if (what, reader) in seen:
            continue
        seen.append((what, reader))
        cells = " | ".join(f"{median[(what, reader, r)][0]:.2f} s ({median[(what, reader, r)][1]})" for r in rtts)
        lines.append(f"| {what} | {names[reader]} | {cells} |")
    lines.append("")
    for rtt in rtts:
        for what in [w for w, r in seen if r == "direct" and w.startswith("zarr")]:
            if (what, "shardfs", rtt) in median:
                d, s = median[(what, "direct", rtt)], median[(what, "shardfs", rtt)]
                lines.append(f"- RTT {rtt:g} ms, {what}: shardfs / direct = {s[0] / d[0]:.2f}x the time, "
                             f"{s[1] / max(d[1], 1):.2f}x the requests (targets: 1.3x, 2x)")
                if (what, "plain", rtt) in median:
                    lines.append(f"  (plain local chunk files / direct = {median[(what, 'plain', rtt)][0] / d[0]:.2f}x)")
                if (what, "local", rtt) in median:
                    lines.append(f"  (a mount of the local shards / direct = {median[(what, 'local', rtt)][0] / d[0]:.2f}x)")
        for what in [w for w, r in seen if r == "mountpoint"]:
            if (what, "shardfs", rtt) in median and (what, "mountpoint", rtt) in median:
                s, m = median[(what, "shardfs", rtt)], median[(what, "mountpoint", rtt)]
                lines.append(f"- RTT {rtt:g} ms, {what}: shardfs / mountpoint-s3 = {s[0] / m[0]:.2f}x the time "
                             f"(target: at most 1x)")
        cat_what = f"cat of every chunk of `big` ({args.scale * 512:.0f} MiB)"
        if (cat_what, "shardfs", rtt) in median and (cat_what, "boto3", rtt) in median:
            s, b = median[(cat_what, "shardfs", rtt)], median[(cat_what, "boto3", rtt)]
            lines.append(f"- RTT {rtt:g} ms, cat of every chunk through shardfs / boto3's download of the shards: "
                         f"{s[0] / b[0]:.2f}x the time (target: at most 1x)")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
