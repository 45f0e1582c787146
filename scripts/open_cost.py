"""What a warm read of one chunk file costs through a mount, against the same file on the local
disk: the floor of zarr-python reading many small chunks through any FUSE view.

    target/venv-newest/bin/python scripts/open_cost.py [--binary SHARDFS] [--rounds R]

A 4096x4096 uint8 array of 1,024 zstd chunks of 128x128 is written twice on the local disk:
sharded (1024x1024 shards) and as plain chunk files. The sharded one is mounted read-only and
every chunk file is read once (so the kernel holds its name, attributes and pages). Then, round
after round, each chunk file is opened, read whole and closed, through the mount and on the disk:
once as Python's `open(path, "rb")` does by default, which asks the kernel whether the file is a
terminal (an ioctl, TCGETS: on a FUSE file a request to the daemon, which the kernel does not
answer itself, before Python 3.14), and once unbuffered (`buffering=0`, no ioctl). And zarr-python
reads the whole array through the mount, from the plain chunk files, and from the shards directly.
Medians of the rounds. Not a test: nothing here asserts a speed.
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
from zarr.storage import LocalStore


def files_under(root):
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def per_file_us(paths, buffering):
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=buffering) as f:
            f.read()
    return (time.perf_counter() - start) * 1e6 / len(paths)


def zarr_read_s(root):
    start = time.perf_counter()
    zarr.open_array(LocalStore(root, read_only=True), path="t", mode="r")[...]
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default="target/release/shardfs")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    work = tempfile.mkdtemp(prefix="shardfs-open-cost.")
    sharded, plain, mnt = (os.path.join(work, n) for n in ("sharded", "plain", "mnt"))
    daemon = None
    try:
        os.mkdir(mnt)
        data = np.random.default_rng(1).integers(0, 255, (4096, 4096), dtype=np.uint8)
        for root, shards in ((sharded, (1024, 1024)), (plain, None)):
            zarr.create_array(LocalStore(root), name="t", shape=data.shape, chunks=(128, 128), shards=shards,
                              dtype="uint8", compressors=zarr.codecs.ZstdCodec(), fill_value=0)[...] = data
        daemon = subprocess.Popen([binary, "mount", "-f", "--read-only", sharded, mnt])
        for _ in range(400):
            if os.path.ismount(mnt):
                break
            time.sleep(0.025)
        else:
            raise RuntimeError(f"{binary} did not mount {mnt}")
        paths = {"mount": files_under(os.path.join(mnt, "t", "c")), "disk": files_under(os.path.join(plain, "t", "c"))}
        assert len(paths["mount"]) == len(paths["disk"]) == 1024, {k: len(v) for k, v in paths.items()}
        for where in paths:
            per_file_us(paths[where], -1)
        rows = {}
        for _ in range(args.rounds):
            for where in paths:
                for buffering in (-1, 0):
                    rows.setdefault((where, buffering), []).append(per_file_us(paths[where], buffering))
            for where, root in (("mount", mnt), ("disk", plain), ("shards", sharded)):
                rows.setdefault(("zarr", where), []).append(zarr_read_s(root))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"median of {args.rounds} rounds, 1,024 chunk files of about 16 KiB, warm\n")
        print("| read | through the mount | plain files on the disk |\n|---|---|---|")
        print(f"| open(rb) + read + close, Python's default (TCGETS ioctl) | {med[('mount', -1)]:.1f} us "
              f"| {med[('disk', -1)]:.1f} us |")
        print(f"| the same unbuffered (no ioctl) | {med[('mount', 0)]:.1f} us | {med[('disk', 0)]:.1f} us |")
        print(f"| zarr-python reads the array | {med[('zarr', 'mount')]:.3f} s | {med[('zarr', 'disk')]:.3f} s |")
        print(f"\nzarr-python reading the shards directly: {med[('zarr', 'shards')]:.3f} s")
    finally:
        if daemon is not None:
            if os.path.ismount(mnt):
                subprocess.run([binary, "unmount", mnt], check=False)
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if not os.path.ismount(mnt):
            shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
