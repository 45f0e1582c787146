"""The db profile of scripts/bench.sh: zarr-python 2.18 reading an array through a shardfs mount of
a database against zarr-python 2.18 reading it through its own store for that database
(SQLiteStore, LMDBStore, RedisStore, DBMStore over dbm.gnu and over Berkeley DB's hash and btree
files; for LevelDB and PostgreSQL, which zarr-python ships no store
for, the minimal stores of the same layouts in tests/interop/plyvel_store.py and
postgres_server.py), side by side in one run. Kyoto Cabinet's hash and tree files are written through
tests/interop/kyoto_store.py (its command-line tools: no Python binding is on PyPI), and have no
reader of their own here.

    target/venv-v2/bin/python scripts/bench_db.py [--runs R] [--quick] [--binary SHARDFS]
                                                  [--databases NAME,...] [--out FILE]

The array: 256 MiB of float32 in 1 MiB chunks, uncompressed (--quick: 64 MiB, one run), written
by zarr-python 2.18 into each database through its own store. Redis is a redis-server started
here on a free port of 127.0.0.1, in memory only; PostgreSQL a fresh cluster of Debian's server on
another (fsync on). Beside them, the same chunks as plain files in a
directory, read through zarr-python's DirectoryStore and through a mount of the directory: what
FUSE itself costs. Each read is from a fresh store or a fresh mount
(release build, read-only; the mount is timed, the unmount is not, as a store is opened in the
time and closed after it), in the same order each run, and is compared with what was written.
Each database's mount is followed at once by a mount of the plain files, and the two times make
one ratio (issue 64's target for local databases: at most 1.5x plain files through a mount); the
table gives the median of these paired ratios, which a busy machine moves less than it moves
either time. A
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
from kyoto_store import KyotoStore
from ports import free_port, wait_for_port
from plyvel_store import PlyvelStore
from postgres_server import PostgresServer, TableStore

warnings.simplefilter("ignore")

PLAIN = "plain files"
# Kyoto Cabinet's only reader here is its command-line tool, a process per key: no store to time.
NO_READER = {"Kyoto Cabinet hash", "Kyoto Cabinet tree"}
# Issue 64's targets: a local database against plain files through a mount, a server against the
# store zarr-python (or the benchmark) reads it with.
TARGETS = {**{name: "1.5x of plain files" for name in ("SQLite", "LMDB", "LevelDB", "GNU dbm", "Berkeley DB hash",
                                                       "Berkeley DB btree", "Kyoto Cabinet hash", "Kyoto Cabinet tree")},
           "Redis": "2.0x of its store", "PostgreSQL": "2.0x of its store"}


def daemon_usage(mnt):
    """The CPU seconds and minor page faults of the daemon serving `mnt`, so far."""
    pid = subprocess.run(["pgrep", "-f", f" mount .* {mnt} --read-only"], capture_output=True, text=True).stdout.split()[0]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 MiB, one run")
    parser.add_argument("--binary", help="the shardfs to measure (default: a release build of this tree)")
    parser.add_argument("--databases", help="only these rows, comma-separated (plain files are always read)")
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
            "Kyoto Cabinet hash": (lambda: KyotoStore(f"{work}/data.kch"), f"{work}/data.kch"),
            "Kyoto Cabinet tree": (lambda: KyotoStore(f"{work}/data.kct"), f"{work}/data.kct"),
            # The floor: the same chunks as plain files, read through a mount of their directory.
            "plain files": (lambda: zarr.DirectoryStore(f"{work}/plain"), f"{work}/plain"),
        }
        if args.databases:
            wanted = args.databases.split(",") + [PLAIN]
            unknown = set(wanted) - set(databases)
            if unknown:
                sys.exit(f"bench db: no database named {', '.join(sorted(unknown))}; known: {', '.join(databases)}")
            databases = {name: databases[name] for name in wanted}
        for name, (store, _) in databases.items():
            start = time.perf_counter()
            opened = store()
            zarr.create(shape=data.shape, chunks=(1 << 18,), dtype="f4", compressor=None, store=opened,
                        path="big")[...] = data
            opened.close()
            if name == PLAIN:
                # A mount of a directory wants a Zarr v3 document at its root.
                with open(f"{work}/plain/zarr.json", "w") as f:
                    f.write('{"zarr_format": 3, "node_type": "group"}')
            print(f"bench db: {name} written in {time.perf_counter() - start:.1f} s", flush=True)

        def direct(name):
            if name in NO_READER:
                return None
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

        def timed(name, read, reader):
            start = time.perf_counter()
            got = read(name)
            took = time.perf_counter() - start
            if mounts:
                usage.setdefault(name, []).append(daemon_usage(mounts[-1]))
            # Unmounted after the clock stops, as a store is closed after it.
            while mounts:
                subprocess.run([binary, "unmount", mounts.pop()], check=True)
            if got is None:
                return None
            assert np.array_equal(got, data), f"{name} through {reader} read wrong"
            return took

        results, usage, paired = {}, {}, {}
        for _ in range(runs):
            for name in databases:
                for reader, read in {"direct": direct, "shardfs": mounted}.items():
                    took = timed(name, read, reader)
                    if took is not None:
                        results.setdefault((name, reader), []).append(took)
                if name != PLAIN:
                    plain = timed(PLAIN, mounted, "shardfs")
                    paired.setdefault(name, []).append(results[(name, "shardfs")][-1] / plain)

        def median(values):
            return sorted(values)[len(values) // 2]

        lines = ["| database | zarr-python 2.18's own store | shardfs mount | mount / own store "
                 "| mount / plain files through a mount, paired | target |", "|---|---|---|---|---|---|"]
        for name in databases:
            mount = median(results[(name, "shardfs")])
            own = median(results[(name, "direct")]) if (name, "direct") in results else None
            cells = [f"{own:.2f} s" if own else "-", f"{mount:.2f} s", f"{mount / own:.2f}x" if own else "-",
                     f"{median(paired[name]):.2f}x" if name in paired else "1.0x", TARGETS.get(name, "-")]
            lines.append(f"| {name} | {' | '.join(cells)} |")
        # What the daemon spent, less noisy than the time on a shared machine.
        lines += ["", "| database | daemon CPU | daemon minor page faults |", "|---|---|---|"]
        for name in databases:
            lines.append(f"| {name} | {median([u[0] for u in usage[name]]):.2f} s "
                         f"| {median([u[1] for u in usage[name]]):,} |")
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
