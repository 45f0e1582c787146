"""The db profile of scripts/bench.sh: zarr-python 2.18 reading an array through a shardfs mount of
a database against zarr-python 2.18 reading it through its own store for that database
(SQLiteStore, LMDBStore, RedisStore, DBMStore over dbm.gnu and over Berkeley DB's hash and btree
files; for LevelDB and PostgreSQL, which zarr-python ships no store
for, the minimal stores of the same layouts in tests/interop/plyvel_store.py and
postgres_server.py), side by side in one run.

    target/venv-v2/bin/python scripts/bench_db.py [--runs R] [--quick] [--binary SHARDFS] [--out FILE]

The array: 256 MiB of float32 in 1 MiB chunks, uncompressed (--quick: 64 MiB, one run), written
by zarr-python 2.18 into each database through its own store. Redis is a redis-server started
here on a free port of 127.0.0.1, in memory only; PostgreSQL a fresh cluster of Debian's server on
another (fsync on). Beside them, the same chunks as plain files in a
directory, read through zarr-python's DirectoryStore and through a mount of the directory: what
FUSE itself costs. Each read is from a fresh store or a fresh mount
(release build, read-only; the mount is timed, the unmount is not, as a store is opened in the
time and closed after it), in the same order each run, and is compared with what was written. A
second table gives what each mount's daemon spent on its read (CPU time and minor page faults,
from /proc), which a busy machine disturbs less than the time. Not a test: nothing here asserts a speed.
"""

import argparse
import dbm.gnu
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import berkeleydb
import zarr
from bench_net import shardfs_binary
from ports import free_port, wait_for_port
from plyvel_store import PlyvelStore
from postgres_server import PostgresServer, TableStore

warnings.simplefilter("ignore")


def daemon_usage(mnt):
    """The CPU seconds and minor page faults of the daemon serving `mnt`, so far."""
    pid = subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt} "], capture_output=True, text=True).stdout.split()[0]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 MiB, one run")
    parser.add_argument("--binary", help="the shardfs to measure (default: a release build of this tree)")
    parser.add_argument("--out")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    mib = 64 if args.quick else 256
    binary = shardfs_binary(args.binary)
    work = tempfile.mkdtemp(prefix="shardfs-bench-db.")
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", work],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mounts = []
    postgres = PostgresServer()
    try:
        postgres.start()
        wait_for_port(redis_port, "redis-server", redis)
        data = np.random.default_rng(1).random(mib << 18, dtype="f4")
        databases = {
            "SQLite": (lambda: zarr.SQLiteStore(f"{work}/data.sqlite"), f"{work}/data.sqlite"),
            "LMDB": (lambda: zarr.LMDBStore(f"{work}/data.lmdb"), f"{work}/data.lmdb"),
            "LevelDB": (lambda: PlyvelStore(f"{work}/data.leveldb"), f"{work}/data.leveldb"),
            "GNU dbm": (lambda: zarr.DBMStore(f"{work}/data.gdbm", open=dbm.gnu.open), f"{work}/data.gdbm"),
            "Berkeley DB hash": (lambda: zarr.DBMStore(f"{work}/data.hash.db", open=berkeleydb.hashopen),
                                 f"{work}/data.hash.db"),
            "Berkeley DB btree": (lambda: zarr.DBMStore(f"{work}/data.btree.db", open=berkeleydb.btopen),
                                  f"{work}/data.btree.db"),
            "Redis": (lambda: zarr.RedisStore(port=redis_port), f"redis://127.0.0.1:{redis_port}/0"),
            "PostgreSQL": (lambda: TableStore(postgres.url), postgres.url),
            # The floor: the same chunks as plain files, read through a mount of their directory.
            "plain files": (lambda: zarr.DirectoryStore(f"{work}/plain"), f"{work}/plain"),
        }
        for name, (store, _) in databases.items():
            start = time.perf_counter()
            opened = store()
            zarr.create(shape=data.shape, chunks=(1 << 18,), dtype="f4", compressor=None, store=opened,
                        path="big")[...] = data
            opened.close()
            if name == "plain files":
                # A mount of a directory wants a Zarr v3 document at its root.
                with open(f"{work}/plain/zarr.json", "w") as f:
                    f.write('{"zarr_format": 3, "node_type": "group"}')
            print(f"bench db: {name} written in {time.perf_counter() - start:.1f} s", flush=True)

        def direct(name):
            opened = databases[name][0]()
            try:
                return zarr.open_array(store=opened, path="big", mode="r")[...]
            finally:
                opened.close()

        def mounted(name):
            mnt = tempfile.mkdtemp(prefix="mnt-", dir=work)
            subprocess.run([binary, "mount", databases[name][1], mnt, "--read-only"], check=True)
            mounts.append(mnt)
            return zarr.open_array(f"{mnt}/big", mode="r")[...]

        readers = {"direct": direct, "shardfs": mounted}
        results = {}
        usage = {}
        for _ in range(runs):
            for name in databases:
                for reader, read in readers.items():
                    start = time.perf_counter()
                    got = read(name)
                    results.setdefault((name, reader), []).append(time.perf_counter() - start)
                    if mounts:
                        usage.setdefault(name, []).append(daemon_usage(mounts[-1]))
                    # Unmounted after the clock stops, as a store is closed after it.
                    while mounts:
                        subprocess.run([binary, "unmount", mounts.pop()], check=True)
                    assert np.array_equal(got, data), f"{name} through {reader} read wrong"
        target = {"SQLite": "1.5x", "LMDB": "1.5x", "LevelDB": "1.5x", "GNU dbm": "1.5x", "Berkeley DB hash": "1.5x",
                  "Berkeley DB btree": "1.5x", "Redis": "2.0x", "PostgreSQL": "2.0x", "plain files": "-"}
        lines = ["| database | zarr-python 2.18's own store | shardfs mount | ratio | target |", "|---|---|---|---|---|"]
        for name in databases:
            medians = [sorted(results[(name, r)])[len(results[(name, r)]) // 2] for r in readers]
            lines.append(f"| {name} | {medians[0]:.2f} s | {medians[1]:.2f} s | {medians[1] / medians[0]:.2f}x "
                         f"| {target[name]} |")
        # What the daemon spent, less noisy than the time on a shared machine.
        lines += ["", "| database | daemon CPU | daemon minor page faults |", "|---|---|---|"]
        for name in databases:
            cpu, faults = (sorted(u[i] for u in usage[name])[len(usage[name]) // 2] for i in (0, 1))
            lines.append(f"| {name} | {cpu:.2f} s | {faults:,} |")
        table = "\n".join(lines)
        print(table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(f"zarr-python {zarr.__version__}; {mib} MiB of float32 in 1 MiB chunks; medians of {runs} runs\n\n")
                f.write(table + "\n")
    finally:
        for mnt in mounts:
            subprocess.run([binary, "unmount", mnt], check=False)
        redis.terminate()
        redis.wait()
        postgres.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
