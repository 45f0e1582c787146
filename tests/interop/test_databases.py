"""Databases mounted as stores (issue 52): zarr-python 2's SQLiteStore layout, written and read by
the peers themselves.

- zarr-python 2.18 (target/venv-v2) writes arrays into the database through its own store, and
  reads them back exactly through the mount;
- a sharded Zarr v3 array stored under the same keys reads unsharded, exactly (zarr-python 3);
- zarr-python 3 writes through a writable mount (`--shard-new`), and the database's keys then hold
  a valid sharded array, read by zarr-python 3 from a copy of those keys;
- kill -9 of a writing daemon: the database passes its own integrity check and holds every chunk
  that was fsync'd;
- another process writing the database while mounted is seen;
- two mounts writing interleaved chunks of the same shards lose nothing, nor do eight writing
  disjoint chunks of them at once;
- zarr-python 2.18 writes arrays through a mount of a Berkeley DB hash or btree file, and reads
  them exactly from the file through DBMStore over berkeleydb; a Berkeley DB file whose flock
  another process holds, or cut short, is refused in one line naming it;
- a database in another layout, locked, an LMDB environment py-lmdb holds open, or a Redis
  server that cannot be reached, is refused before mounting with one line naming it; a Redis server lost while mounted fails reads with EIO,
  and the mount recovers when it is back;
- a Redis value another client changes is read new within the default --metadata-ttl (1 s), and
  a Redis mount whose connections are killed (the server's invalidations to them lost) reads what
  changed meanwhile, without an error.

The Redis database is a real redis-server (the Debian package, started here on a port of its own,
no persistence); each case has a key prefix of its own.

Runs in target/venv (zarr-python 3); one case alone:
``target/venv/bin/python -m pytest tests/interop/test_databases.py -k kill``.
"""

import concurrent.futures
import contextlib
import errno
import itertools
import json
import os
import pickle
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import shardfs
import zarr
import lmdb
import plyvel
import psycopg
import redis
from conftest import BINARY, V2_PYTHON, zarr2_reads
from test_metrics import requests, scrape, served_at
from object_stores import daemon_pid
from ports import free_port, wait_for_port
from kyoto_store import KyotoStore
from plyvel_store import PlyvelStore
from postgres_server import PostgresServer, TableStore, postgres_server


class Sqlite:
    """An SQLite file in zarr-python 2's SQLiteStore layout."""

    name = "sqlite"

    def __init__(self, tmp_path):
        self.path = tmp_path / "data.sqlite"
        with self.connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS zarr(k TEXT PRIMARY KEY, v BLOB)")

    def connect(self):
        return sqlite3.connect(self.path, isolation_level=None)

    options = {}

    @property
    def address(self):
        return str(self.path)

    # zarr-python 2.18's own store of this database, as Python source for target/venv-v2.
    v2_store = "zarr.SQLiteStore(sys.argv[1])"
    v2_argument = property(lambda self: str(self.path))

    def put(self, key, value):
        with self.connect() as db:
            db.execute("REPLACE INTO zarr VALUES (?, ?)", (key, value))

    def items(self):
        with self.connect() as db:
            return dict(db.execute("SELECT k, v FROM zarr"))

    def consistent(self):
        with self.connect() as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


class Lmdb:
    """An LMDB environment as zarr-python 2's LMDBStore writes it. py-lmdb cannot open it while a
    mount has it open (their LMDBs' lock formats differ), so it is written and read here only
    when nothing is mounted."""

    name = "lmdb"
    options = {}

    def __init__(self, tmp_path):
        self.path = tmp_path / "data.lmdb"
        lmdb.open(str(self.path), map_size=2**30).close()

    address = property(lambda self: str(self.path))
    v2_store = "zarr.LMDBStore(sys.argv[1])"
    v2_argument = property(lambda self: str(self.path))

    def put(self, key, value):
        with lmdb.open(str(self.path), map_size=2**30) as env, env.begin(write=True) as txn:
            txn.put(key.encode(), value)

    def items(self):
        with lmdb.open(str(self.path), map_size=2**30) as env, env.begin() as txn:
            return {k.decode(): bytes(v) for k, v in txn.cursor()}

    def consistent(self):
        return bool(self.items())


class LevelDb:
    """A LevelDB directory as plyvel users write it, written by zarr-python 2 through
    `PlyvelStore` (zarr-python ships no LevelDB store). LevelDB lets one process at a time open
    it, so it is written and read here only when nothing is mounted."""

    name = "leveldb"
    options = {}

    def __init__(self, tmp_path):
        self.path = tmp_path / "data.leveldb"
        PlyvelStore(self.path).close()

    address = property(lambda self: str(self.path))
    v2_store = (f'(sys.path.insert(0, {str(Path(__file__).parent)!r}), __import__("plyvel_store"))[1]'
                '.PlyvelStore(sys.argv[1])')
    v2_argument = property(lambda self: str(self.path))

    def put(self, key, value):
        store = PlyvelStore(self.path)
        store[key] = value
        store.close()

    def items(self):
        store = PlyvelStore(self.path)
        try:
            return dict(store.items())
        finally:
            store.close()

    def consistent(self):
        return bool(self.items())


# target/venv-v2 is made with Debian's Python, whose dbm.gnu is GNU dbm (scripts/setup.sh).
DBM_PYTHON = V2_PYTHON


def dbm_run(path, source, *args):
    """Runs `source` in DBM_PYTHON with `db`, the GNU dbm file at `path`, open; returns what it
    printed, unpickled."""
    program = ("import dbm.gnu, pickle, sys\n"
               f"db = dbm.gnu.open(sys.argv[1], sys.argv[2])\n{source}\ndb.close()\n")
    run = subprocess.run([DBM_PYTHON, "-c", program, str(path), *args], capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-1500:]
    return pickle.loads(run.stdout) if run.stdout else None


class Gdbm:
    """A GNU dbm file as zarr-python 2's DBMStore writes it over dbm.gnu. GNU dbm lets one writer,
    or only readers, open it, so it is written here only when nothing is mounted."""

    name = "gdbm"
    options = {}

    def __init__(self, tmp_path):
        self.path = tmp_path / "data.gdbm"
        dbm_run(self.path, "", "c")

    address = property(lambda self: str(self.path))
    v2_store = 'zarr.DBMStore(sys.argv[1], open=__import__("dbm.gnu").gnu.open)'
    v2_argument = property(lambda self: str(self.path))

    def put(self, key, value):
        dbm_run(self.path, "db[sys.argv[3]] = bytes.fromhex(sys.argv[4])", "w", key, value.hex())

    def items(self):
        return dbm_run(self.path, "sys.stdout.buffer.write(pickle.dumps({k.decode(): db[k] for k in db.keys()}))",
                       "r")

    def consistent(self):
        return bool(self.items())


class Kyoto:
    """A Kyoto Cabinet tree file, written by zarr-python 2 through `KyotoStore` (Kyoto Cabinet's
    own tools; no Python binding is on PyPI). It lets one writer, or only readers, open it, so it
    is written here only when nothing is mounted."""

    name = "kyoto"
    options = {}

    def __init__(self, tmp_path):
        self.path = tmp_path / "data.kct"
        KyotoStore(self.path).close()

    address = property(lambda self: str(self.path))
    v2_store = (f'(sys.path.insert(0, {str(Path(__file__).parent)!r}), __import__("kyoto_store"))[1]'
                '.KyotoStore(sys.argv[1])')
    v2_argument = property(lambda self: str(self.path))

    def put(self, key, value):
        store = KyotoStore(self.path)
        store[key] = value
        store.close()

    def items(self):
        return KyotoStore(self.path).everything()

    def consistent(self):
        return subprocess.run(["kctreemgr", "check", str(self.path)], capture_output=True).returncode == 0


def bdb_run(path, opener, source, *args):
    """Runs `source` in DBM_PYTHON (target/venv-v2, which has the `berkeleydb` module) with `db`,
    the Berkeley DB file at `path` open through `berkeleydb.OPENER` (`hashopen`, `btopen`) with
    the flag argv[2] (and keyword arguments after a comma: `btopen, lorder=4321`); returns what it
    printed, unpickled."""
    name, _, kwargs = opener.partition(",")
    program = ("import berkeleydb, pickle, sys\n"
               f"db = berkeleydb.{name}(sys.argv[1], sys.argv[2]{',' + kwargs if kwargs else ''})\n"
               f"{source}\ndb.close()\n")
    run = subprocess.run([DBM_PYTHON, "-c", program, str(path), *args], capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-1500:]
    return pickle.loads(run.stdout) if run.stdout else None


class BerkeleyDb:
    """A Berkeley DB hash or btree file as zarr-python 2's DBMStore writes it over the
    `berkeleydb` module (`hashopen`, `btopen`; a big-endian btree file, `lorder=4321`, too).
    Berkeley DB keeps no lock between processes here and a mount takes a flock the module does
    not, so it is written here only when nothing is mounted."""

    options = {}

    def __init__(self, tmp_path, kind="hash"):
        self.name = f"bdb-{kind}"
        self.opener = {"hash": "hashopen", "btree": "btopen", "btree-big-endian": "btopen, lorder=4321"}[kind]
        self.path = tmp_path / f"data.{kind}.db"
        bdb_run(self.path, self.opener, "", "c")

    address = property(lambda self: str(self.path))
    v2_argument = property(lambda self: str(self.path))

    @property
    def v2_store(self):
        name, _, kwargs = self.opener.partition(",")
        return f'zarr.DBMStore(sys.argv[1], open=__import__("berkeleydb").{name}{"," + kwargs if kwargs else ""})'

    def put(self, key, value):
        bdb_run(self.path, self.opener, "db[sys.argv[3].encode()] = bytes.fromhex(sys.argv[4])", "w", key, value.hex())

    def items(self):
        return bdb_run(self.path, self.opener,
                       "sys.stdout.buffer.write(pickle.dumps({k.decode(): db[k] for k in db.keys()}))", "r")

    def consistent(self):
        # Berkeley DB's own check of every page of the file (db_verify).
        run = subprocess.run([DBM_PYTHON, "-c", "import berkeleydb, sys; berkeleydb.db.DB().verify(sys.argv[1])",
                              str(self.path)], capture_output=True)
        return run.returncode == 0


# The databases nothing but the mount changes while it has them (their own locks, or the mount's).
SOLE = ["leveldb", "gdbm", "kyoto", "bdb-hash", "bdb-btree"]


def one_process_at_a_time(database):
    if database.name in SOLE:
        pytest.skip(f"{database.name} lets one process at a time write a database")


class RedisServer:
    """redis-server on a free port of 127.0.0.1, in memory only."""

    def __init__(self, directory):
        self.directory = directory
        self.port = free_port()
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, "redis-server", self.process)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Redis:
    """Keys PREFIX:KEY of a Redis database, as zarr-python 2's RedisStore writes them."""

    name = "redis"
    prefixes = itertools.count()

    def __init__(self, server):
        self.server = server
        self.prefix = f"case{next(self.prefixes)}"
        self.address = f"redis://127.0.0.1:{server.port}/0"
        self.options = {"key_prefix": self.prefix}
        self.v2_argument = f"{self.prefix}:{server.port}"

    v2_store = 'zarr.RedisStore(prefix=sys.argv[1].split(":")[0], port=int(sys.argv[1].split(":")[1]))'

    def client(self):
        return redis.Redis(port=self.server.port)

    def put(self, key, value):
        self.client().set(f"{self.prefix}:{key}", value)

    def items(self):
        client = self.client()
        keys = list(client.scan_iter(match=f"{self.prefix}:*"))
        return {k.decode()[len(self.prefix) + 1:]: v for k, v in zip(keys, client.mget(keys))} if keys else {}

    def consistent(self):
        return True


@pytest.fixture(scope="session")
def pg_server():
    with postgres_server() as server:
        yield server


class Postgres:
    """A table NAME(key text PRIMARY KEY, value bytea) of a PostgreSQL database, written by
    zarr-python 2 through `TableStore` (zarr-python ships no PostgreSQL store)."""

    name = "postgres"
    tables = itertools.count()

    def __init__(self, server):
        self.server = server
        self.table = f"case{next(self.tables)}"
        self.address = server.url
        self.options = {"table": self.table}
        self.v2_argument = f"{server.url} {self.table}"
        TableStore(server.url, self.table).close()

    v2_store = (f'(sys.path.insert(0, {str(Path(__file__).parent)!r}), __import__("postgres_server"))[1]'
                '.TableStore(*sys.argv[1].split(" "))')

    def store(self):
        return TableStore(self.server.url, self.table)

    def put(self, key, value):
        store = self.store()
        store[key] = value
        store.close()

    def items(self):
        store = self.store()
        try:
            return dict(store.items())
        finally:
            store.close()

    def consistent(self):
        return True


DATABASES = ["sqlite", "lmdb", "leveldb", "gdbm", "kyoto", "bdb-hash", "bdb-btree", "redis", "postgres"]


@pytest.fixture(params=DATABASES)
def database(request, tmp_path):
    if request.param == "redis":
        return Redis(request.getfixturevalue("redis_server"))
    if request.param == "postgres":
        return Postgres(request.getfixturevalue("pg_server"))
    if request.param.startswith("bdb-"):
        return BerkeleyDb(tmp_path, request.param.removeprefix("bdb-"))
    return {"sqlite": Sqlite, "lmdb": Lmdb, "leveldb": LevelDb, "gdbm": Gdbm, "kyoto": Kyoto}[request.param](tmp_path)


def run_v2(database, source):
    """Runs `source` in zarr-python 2.18 with `store`, the database's own store, open."""
    program = f"import sys, numpy as np, zarr\nstore = {database.v2_store}\n{source}\nstore.close()\n"
    run = subprocess.run([V2_PYTHON, "-W", "ignore", "-c", program, database.v2_argument],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    return run.stdout


# What zarr-python 2.18 writes, and what each of its arrays then holds.
V2_ARRAYS = {
    "ints": np.arange(100 * 80, dtype="<i4").reshape(100, 80),
    "deep/floats": np.linspace(0, 1, 3000).reshape(60, 50),
    "sparse": np.where(np.arange(64 * 64).reshape(64, 64) % 9 == 0, 7, 0).astype("u2"),
}
V2_WRITER = """
root = zarr.group(store=store)
root.attrs["made_by"] = "zarr 2.18"
root.create_dataset("ints", data=np.arange(100 * 80, dtype="<i4").reshape(100, 80), chunks=(30, 25))
root.create_dataset("deep/floats", data=np.linspace(0, 1, 3000).reshape(60, 50), chunks=(16, 16),
                    compressor=None)
sparse = root.create_dataset("sparse", shape=(64, 64), chunks=(16, 16), dtype="u2", fill_value=0)
sparse[:] = np.where(np.arange(64 * 64).reshape(64, 64) % 9 == 0, 7, 0)
"""


def test_zarr2_arrays_written_by_its_own_store_read_exactly_through_the_mount(database, shardfs_mount, tmp_path):
    run_v2(database, V2_WRITER)
    values = database.items()
    mnt = shardfs_mount(database.address, read_only=True, **database.options)
    assert (Path(mnt) / ".zgroup").is_file() and (Path(mnt) / "deep/floats/.zarray").is_file()
    (tmp_path / "expected").mkdir()
    assert zarr2_reads(mnt, V2_ARRAYS, tmp_path / "expected") == {path: True for path in V2_ARRAYS}
    # Every value is a file of the same bytes.
    for key, value in values.items():
        assert (Path(mnt) / key).read_bytes() == value, key


def store_directory(database, directory):
    """Stores every file under `directory` in the database, under its relative path."""
    for path in Path(directory).rglob("*"):
        if path.is_file():
            database.put(path.relative_to(directory).as_posix(), path.read_bytes())


def dump(database, directory):
    """Writes every key of the database as a file under `directory`."""
    for key, value in database.items().items():
        (Path(directory) / key).parent.mkdir(parents=True, exist_ok=True)
        (Path(directory) / key).write_bytes(value)
    return directory


def test_sharded_v3_array_under_the_same_keys_reads_unsharded(database, shardfs_mount, tmp_path):
    made = tmp_path / "made"
    data = np.arange(48 * 40, dtype="<f8").reshape(48, 40)
    zarr.create_group(store=made)
    zarr.create_array(store=made / "img", shape=data.shape, chunks=(8, 8), shards=(16, 16), dtype="<f8")[...] = data
    store_directory(database, made)
    mnt = shardfs_mount(database.address, read_only=True, **database.options)
    array = zarr.open_array(f"{mnt}/img", mode="r")
    assert array.shards is None and array.chunks == (8, 8)
    np.testing.assert_array_equal(array[...], data)
    assert sorted(os.listdir(f"{mnt}/img/c/0")) == [str(j) for j in range(5)]


def shardfs_run(database, *args):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in database.options.items()]
    return subprocess.run([BINARY, *args, database.address, *flags], capture_output=True, text=True)


def test_info_and_check_read_the_database_and_refs_refuses_it(database, tmp_path):
    made = tmp_path / "made"
    zarr.create_array(store=made / "img", shape=(32, 32), chunks=(8, 8), shards=(16, 16), dtype="u1")[...] = 5
    store_directory(database, made)
    info = shardfs_run(database, "info")
    assert info.returncode == 0 and "img" in info.stdout, info.stderr
    check = shardfs_run(database, "check", "--data")
    assert check.returncode == 0 and "1 arrays checked, 0 damaged" in check.stdout, check.stdout + check.stderr
    refs = shardfs_run(database, "refs")
    assert refs.returncode != 0 and "no URL another program could read" in refs.stderr


def test_zarr3_writes_through_a_writable_mount_store_a_sharded_array(database, tmp_path):
    data = (np.arange(64 * 64) % 251).astype("u1").reshape(64, 64)
    (tmp_path / "mnt").mkdir()
    with shardfs.mount(database.address, tmp_path / "mnt", shard_new=(4, 4), **database.options) as mnt:
        zarr.create_group(store=mnt, attributes={"through": "shardfs"})
        zarr.create_array(store=f"{mnt}/tiles", shape=data.shape, chunks=(8, 8), dtype="u1")[...] = data
    # Unmounted: what follows reads the database itself.
    stored = dump(database, tmp_path / "stored")
    array = zarr.open_array(stored / "tiles", mode="r")
    assert array.shards == (32, 32) and array.chunks == (8, 8)
    np.testing.assert_array_equal(array[...], data)
    assert zarr.open_group(stored, mode="r").attrs["through"] == "shardfs"
    # Shards, not chunk files: 2 x 2 of them.
    assert sorted(k for k in database.items() if k.startswith("tiles/c/")) == [
        f"tiles/c/{i}/{j}" for i in range(2) for j in range(2)]


def raw_array(database, tmp_path):
    """uint8, no compression, chunks of 4 x 4, 2 shards of 16 chunks each, stored in the
    database."""
    made = tmp_path / "raw"
    zarr.create_array(store=made, shape=(16, 32), chunks=(4, 4), shards=(16, 16), dtype="u1",
                      compressors=None, fill_value=0)
    store_directory(database, made)


def chunk_bytes(n):
    return bytes([n % 251 + 1]) * 16


def test_kill_9_during_writes_keeps_the_database_consistent_and_every_fsynced_chunk(database, tmp_path):
    raw_array(database, tmp_path)
    synced = {}
    (tmp_path / "mnt").mkdir()
    with shardfs.mount(database.address, tmp_path / "mnt", commit_idle_ms=600000, **database.options) as mnt:
        pid = daemon_pid(mnt)
        for n in range(32):
            i, j = divmod(n, 8)
            os.makedirs(f"{mnt}/c/{i}", exist_ok=True)
            with open(f"{mnt}/c/{i}/{j}", "wb") as f:
                f.write(chunk_bytes(n))
                if n % 3 == 0:
                    f.flush()
                    os.fsync(f.fileno())
                    synced[(i, j)] = chunk_bytes(n)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    assert database.consistent()
    every_shard_decodes(database)
    got = zarr.open_array(dump(database, tmp_path / "after"), mode="r")[...]
    assert [k for k, v in synced.items() if bytes(got[k[0] * 4:k[0] * 4 + 4, k[1] * 4:k[1] * 4 + 4].ravel()) != v] == []


def every_shard_decodes(database):
    check = shardfs_run(database, "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_two_mounts_writing_interleaved_chunks_of_the_same_shards_lose_nothing(database, tmp_path):
    one_process_at_a_time(database)
    raw_array(database, tmp_path)
    written = {}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with shardfs.mount(database.address, tmp_path / "a", **database.options) as a, \
            shardfs.mount(database.address, tmp_path / "b", **database.options) as b:
        for n in range(32):
            i, j = divmod(n, 8)
            mnt = (a, b)[(i + j) % 2]
            os.makedirs(f"{mnt}/c/{i}", exist_ok=True)
            with open(f"{mnt}/c/{i}/{j}", "wb") as f:
                f.write(chunk_bytes(n))
                f.flush()
                os.fsync(f.fileno())
            written[(i, j)] = chunk_bytes(n)
    got = zarr.open_array(dump(database, tmp_path / "after"), mode="r")[...]
    assert [k for k, v in written.items() if bytes(got[k[0] * 4:k[0] * 4 + 4, k[1] * 4:k[1] * 4 + 4].ravel()) != v] == []
    every_shard_decodes(database)


def test_eight_mounts_writing_disjoint_chunks_of_the_same_shards_at_once_lose_nothing(database, tmp_path):
    one_process_at_a_time(database)
    # 256 chunks in 16 shards, each shard written by all eight mounts, each chunk committed on its
    # own: every other mount's commit renews the versions a mount reads (on SQLite and LMDB every
    # version), so lookups and directory checks race commits throughout.
    made = tmp_path / "raw"
    zarr.create_array(store=made, shape=(64, 64), chunks=(4, 4), shards=(16, 16), dtype="u1",
                      compressors=None, fill_value=0)
    store_directory(database, made)
    written = {divmod(n, 16): chunk_bytes(n) for n in range(256)}
    with contextlib.ExitStack() as stack:
        mounts = []
        for m in range(8):
            (tmp_path / f"m{m}").mkdir()
            mounts.append(stack.enter_context(shardfs.mount(database.address, tmp_path / f"m{m}", **database.options)))

        def write(m):
            for (i, j), data in written.items():
                if (i * 16 + j) % 8 == m:
                    os.makedirs(f"{mounts[m]}/c/{i}", exist_ok=True)
                    with open(f"{mounts[m]}/c/{i}/{j}", "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(write, range(8)))
    got = zarr.open_array(dump(database, tmp_path / "after"), mode="r")[...]
    assert [k for k, v in written.items() if bytes(got[k[0] * 4:k[0] * 4 + 4, k[1] * 4:k[1] * 4 + 4].ravel()) != v] == []
    every_shard_decodes(database)


def test_another_process_writing_the_database_is_seen(database, shardfs_mount, tmp_path):
    if database.name == "lmdb":
        pytest.skip("py-lmdb cannot open an environment a mount holds (another LMDB lock format)")
    one_process_at_a_time(database)
    run_v2(database, V2_WRITER)
    # A Redis or PostgreSQL mount trusts what it saw for --metadata-ttl (1 s unless given);
    # SQLite and LMDB look each time.
    mnt = shardfs_mount(database.address, metadata_ttl=500, **database.options)
    before = (Path(mnt) / "ints/0.0").read_bytes()
    run_v2(database, 'zarr.open_array(store, path="ints")[0:30, 0:25] = -1')
    time.sleep(0.6)
    after = (Path(mnt) / "ints/0.0").read_bytes()
    assert after != before and after == database.items()["ints/0.0"]
    (tmp_path / "expected").mkdir()
    changed = V2_ARRAYS["ints"].copy()
    changed[0:30, 0:25] = -1
    assert zarr2_reads(mnt, {"ints": changed}, tmp_path / "expected") == {"ints": True}


def walk(mnt):
    """Every file under `mnt`, by relative path, with its bytes."""
    found = {}
    for root, _, files in os.walk(mnt):
        for name in files:
            path = Path(root) / name
            found[path.relative_to(mnt).as_posix()] = path.read_bytes()
    return found


@pytest.mark.parametrize("database", SOLE, indirect=True)
def test_a_database_only_the_mount_changes_is_listed_once_and_its_writes_show_at_once(database, tmp_path):
    run_v2(database, V2_WRITER)
    values = database.items()
    with shardfs.mount(database.address, metrics_address="127.0.0.1:0", **database.options) as mnt:
        url = served_at(Path(mnt))
        assert walk(mnt) == values
        first = scrape(url)
        # Nothing else changes the database while it is mounted: looking again asks it nothing.
        assert walk(mnt) == values
        again = scrape(url)
        assert requests(again, "list") == requests(first, "list") > 0
        assert requests(again, "head") == requests(first, "head")
        # What the mount changes shows at once, though nothing is asked again.
        (Path(mnt) / "ints/0.0").write_bytes(b"rewritten")
        (Path(mnt) / "sparse/0.0").unlink()
        (Path(mnt) / "more").mkdir()
        (Path(mnt) / "more/new").write_bytes(b"new")
        values.update({"ints/0.0": b"rewritten", "more/new": b"new"})
        del values["sparse/0.0"]
        assert "0.0" not in os.listdir(Path(mnt) / "sparse")
        assert walk(mnt) == values
    assert database.items() == values


def mount_fails(address, tmp_path, *flags):
    (tmp_path / "refused").mkdir(exist_ok=True)
    run = subprocess.run([BINARY, "mount", address, tmp_path / "refused", *flags], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0 and not os.path.ismount(tmp_path / "refused")
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_an_sqlite_file_in_another_layout_is_refused_naming_it(tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE kv(key TEXT, value BLOB)")
    line = mount_fails(str(other), tmp_path)
    assert str(other) in line and "zarr(k TEXT PRIMARY KEY, v BLOB)" in line


def test_a_locked_sqlite_file_is_refused_for_writing_naming_the_lock(tmp_path):
    database = Sqlite(tmp_path)
    locker = database.connect()
    locker.execute("BEGIN EXCLUSIVE")
    try:
        line = mount_fails(database.address, tmp_path)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert str(database.path) in line and "locked" in line


def test_a_redis_server_that_cannot_be_reached_is_refused_naming_it(tmp_path):
    address = f"redis://127.0.0.1:{free_port()}/0"
    line = mount_fails(address, tmp_path)
    assert address in line and "cannot reach" in line


def test_a_redis_server_lost_while_mounted_fails_reads_with_eio_and_the_mount_recovers(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    try:
        database = Redis(server)
        run_v2(database, V2_WRITER)
        with shardfs.mount(database.address, metadata_ttl=0, **database.options) as mnt:
            want = (Path(mnt) / "ints/0.0").read_bytes()
            values = database.items()
            server.stop()
            with pytest.raises(OSError) as lost:
                (Path(mnt) / "ints/1.1").read_bytes()
            assert lost.value.errno == errno.EIO
            server.start()
            for key, value in values.items():
                database.put(key, value)
            assert (Path(mnt) / "ints/0.0").read_bytes() == want
            assert (Path(mnt) / "ints/1.1").read_bytes() == values["ints/1.1"]
    finally:
        server.stop()


def test_a_redis_value_another_client_changes_is_read_new_within_a_second(redis_server, shardfs_mount):
    # The default --metadata-ttl (1 s): a look at a value costs the server no hash of it any more.
    # Each new value has the old one's length, so only its version tells it apart.
    database = Redis(redis_server)
    run_v2(database, V2_WRITER)
    mnt = shardfs_mount(database.address, read_only=True, **database.options)
    path = Path(mnt) / "deep/floats/0.0"
    before = path.read_bytes()
    for round in range(1, 4):
        after = bytes(b ^ round for b in before)
        database.put("deep/floats/0.0", after)
        time.sleep(1.2)
        assert path.read_bytes() == after, round


def test_a_redis_mount_whose_connections_are_killed_forgets_its_versions(redis_server, shardfs_mount):
    # Invalidations sent to a killed connection are lost: what changed meanwhile must be read as it
    # is, never as the version known before, and the mount goes on without an error.
    database = Redis(redis_server)
    run_v2(database, V2_WRITER)
    mnt = shardfs_mount(database.address, read_only=True, **database.options)
    path = Path(mnt) / "deep/floats/0.0"
    before = path.read_bytes()
    client = database.client()
    assert client.client_kill_filter(_type="normal", skipme=True) >= 1
    after = bytes(b ^ 0x5A for b in before)
    client.set(f"{database.prefix}:deep/floats/0.0", after)
    time.sleep(1.2)
    assert path.read_bytes() == after
    for key, value in database.items().items():
        assert (Path(mnt) / key).read_bytes() == value, key


def test_an_lmdb_environment_py_lmdb_holds_open_is_refused_naming_it(tmp_path):
    database = Lmdb(tmp_path)
    with lmdb.open(str(database.path), map_size=2**30):
        line = mount_fails(database.address, tmp_path)
    assert str(database.path) in line and "another LMDB's lock format" in line


def test_a_postgresql_server_that_cannot_be_reached_is_refused_naming_it(tmp_path):
    address = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    line = mount_fails(address, tmp_path)
    assert address in line and "cannot reach the server" in line


def test_a_postgresql_table_in_another_layout_or_missing_is_refused_naming_it(pg_server, tmp_path):
    with psycopg.connect(pg_server.url, autocommit=True) as db:
        db.execute("CREATE TABLE kv (key text, value text)")
    line = mount_fails(pg_server.url, tmp_path, "--table=kv")
    assert pg_server.url in line and "kv" in line and "(key text PRIMARY KEY, value bytea)" in line
    # A table whose writes a trigger may change, or whose keys compare case-blind, would have a
    # version name bytes it does not hold.
    with psycopg.connect(pg_server.url, autocommit=True) as db:
        db.execute("CREATE TABLE trig (key text PRIMARY KEY, value bytea)")
        db.execute("CREATE FUNCTION bang() RETURNS trigger AS $$ BEGIN NEW.value := NEW.value || '!'; "
                   "RETURN NEW; END $$ LANGUAGE plpgsql")
        db.execute("CREATE TRIGGER bang BEFORE INSERT OR UPDATE ON trig FOR EACH ROW EXECUTE FUNCTION bang()")
        db.execute("CREATE COLLATION blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        db.execute("CREATE TABLE blind (key text COLLATE blind PRIMARY KEY, value bytea)")
    assert "trigger bang" in mount_fails(pg_server.url, tmp_path, "--table=trig")
    assert "collation blind is not deterministic" in mount_fails(pg_server.url, tmp_path, "--table=blind")
    # A read-only mount creates nothing: a table not there is named.
    line = mount_fails(pg_server.url, tmp_path, "--table=nowhere", "--read-only")
    assert "no table nowhere" in line
    with psycopg.connect(pg_server.url) as db:
        assert db.execute("SELECT to_regclass('nowhere')").fetchone()[0] is None


def test_a_postgresql_password_is_taken_from_the_environment_and_shown_nowhere(tmp_path):
    secret = "s3cret-Pa55word"
    server = PostgresServer(password=secret)
    try:
        server.start()
        # A wrong password is refused before mounting, in one line without it.
        wrong = server.url.replace("postgres@", "postgres:not-it@")
        line = mount_fails(wrong, tmp_path)
        assert "password authentication failed" in line and "not-it" not in line
        env = dict(os.environ, PGPASSWORD=secret, RUST_LOG="debug")
        log = tmp_path / "daemon.log"
        with open(log, "w") as err:
            mounted = subprocess.run([BINARY, "mount", server.url, tmp_path / "refused", "--log-file", log],
                                     env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert mounted.returncode == 0, mounted.stderr
        try:
            mnt = tmp_path / "refused"
            (mnt / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
            pid = daemon_pid(mnt)
            assert secret not in Path(f"/proc/{pid}/cmdline").read_text()
        finally:
            subprocess.run([BINARY, "unmount", tmp_path / "refused"], check=True, timeout=120)
        assert secret not in log.read_text() + mounted.stderr
        with psycopg.connect(server.url, password=secret) as db:
            assert db.execute("SELECT key FROM zarr").fetchall() == [("zarr.json",)]
    finally:
        server.remove()


def test_a_postgresql_server_lost_while_mounted_fails_reads_with_eio_and_the_mount_recovers(tmp_path):
    server = PostgresServer()
    try:
        server.start()
        database = Postgres(server)
        run_v2(database, V2_WRITER)
        with shardfs.mount(database.address, metadata_ttl=0, **database.options) as mnt:
            want = (Path(mnt) / "ints/0.0").read_bytes()
            values = database.items()
            server.stop()
            with pytest.raises(OSError) as lost:
                (Path(mnt) / "ints/1.1").read_bytes()
            assert lost.value.errno == errno.EIO
            server.start()
            assert (Path(mnt) / "ints/0.0").read_bytes() == want
            assert (Path(mnt) / "ints/1.1").read_bytes() == values["ints/1.1"]
    finally:
        server.remove()


def test_a_leveldb_another_process_holds_is_refused_and_a_mounted_one_refuses_others(shardfs_mount, tmp_path):
    database = LevelDb(tmp_path)
    run_v2(database, V2_WRITER)
    held = plyvel.DB(str(database.path))
    try:
        line = mount_fails(database.address, tmp_path)
    finally:
        held.close()
    assert str(database.path) in line and "held by another process" in line
    mnt = shardfs_mount(database.address, read_only=True)
    with pytest.raises(plyvel.IOError, match="lock"):
        plyvel.DB(str(database.path))
    assert (Path(mnt) / "ints/0.0").is_file()


def test_a_gdbm_file_another_process_writes_is_refused_and_readers_share_it(shardfs_mount, tmp_path):
    database = Gdbm(tmp_path)
    run_v2(database, V2_WRITER)
    writer = subprocess.Popen([DBM_PYTHON, "-c", "import dbm.gnu, sys, time\n"
                               "db = dbm.gnu.open(sys.argv[1], 'w'); print('open', flush=True); time.sleep(60)",
                               database.address], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        line = mount_fails(database.address, tmp_path, "--read-only")
    finally:
        writer.kill()
        writer.wait()
    assert str(database.path) in line and "held by another process" in line
    # A read-only mount is a reader: dbm.gnu reads beside it, and cannot write.
    mnt = shardfs_mount(database.address, read_only=True)
    assert (Path(mnt) / "ints/0.0").read_bytes() == database.items()["ints/0.0"]
    with pytest.raises(AssertionError, match="Resource temporarily unavailable|lock|Can't be writer"):
        database.put("x", b"1")


@pytest.mark.parametrize("kind", ["hash", "btree", "btree-big-endian"])
def test_zarr2_arrays_written_through_a_mount_of_a_berkeley_db_file_read_exactly_by_its_own_store(kind, tmp_path):
    database = BerkeleyDb(tmp_path, kind)
    (tmp_path / "mnt").mkdir()
    with shardfs.mount(database.address, tmp_path / "mnt") as mnt:
        run = subprocess.run([V2_PYTHON, "-W", "ignore", "-c",
                              f"import sys, numpy as np, zarr\nstore = zarr.DirectoryStore(sys.argv[1])\n{V2_WRITER}",
                              mnt], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-1500:]
    # Unmounted: zarr-python 2 reads the file through DBMStore over berkeleydb.
    reader = ("import json, sys, numpy as np, zarr\n"
              f"store = {database.v2_store}\n"
              "got = {p: zarr.open_array(store, path=p, mode='r')[...].tolist() for p in json.loads(sys.argv[2])}\n"
              "print(json.dumps([zarr.open_group(store, mode='r').attrs['made_by'], got]))\nstore.close()\n")
    run = subprocess.run([V2_PYTHON, "-W", "ignore", "-c", reader, database.address, json.dumps(list(V2_ARRAYS))],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    made_by, got = json.loads(run.stdout)
    assert made_by == "zarr 2.18"
    for path, want in V2_ARRAYS.items():
        np.testing.assert_array_equal(np.array(got[path], dtype=want.dtype), want)
    assert database.consistent()


def test_a_berkeley_db_file_held_or_damaged_is_refused_in_one_line_naming_it(shardfs_mount, tmp_path):
    database = BerkeleyDb(tmp_path, "btree")
    run_v2(database, V2_WRITER)
    # Another process holding the lock a mount takes (flock, exclusive: a writer).
    holder = subprocess.Popen([DBM_PYTHON, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                               "print('held', flush=True); time.sleep(60)", database.address],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = mount_fails(database.address, tmp_path, "--read-only")
    finally:
        holder.kill()
        holder.wait()
    assert str(database.path) in line and "held by another process" in line
    # A read-only mount shares the file with another reader, and keeps a writer out.
    mnt = shardfs_mount(database.address, read_only=True)
    other = shardfs_mount(database.address, read_only=True)
    assert (Path(mnt) / "ints/0.0").read_bytes() == (Path(other) / "ints/0.0").read_bytes()
    line = mount_fails(database.address, tmp_path)
    assert str(database.path) in line and "held by another process" in line
    # A file cut short after its header: one line naming it.
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(database.path.read_bytes()[:100])
    line = mount_fails(str(damaged), tmp_path, "--read-only")
    assert str(damaged) in line and "Berkeley DB" in line


# Berkeley DB files of every shape a writer may leave, made by the library itself (page sizes,
# byte orders, values on their page and on overflow pages of every length around a page's worth,
# values removed and written again over freed pages), as a JSON of what each key holds.
BDB_SHAPES = r"""
import json, os, random, sys, berkeleydb
from berkeleydb import db
seed, path = int(sys.argv[1]), sys.argv[2]
rnd = random.Random(seed)
handle = db.DB()
size = rnd.choice([512, 1024, 4096, 8192, 65536])
handle.set_pagesize(size)
handle.set_lorder(rnd.choice([1234, 4321]))
handle.open(path, dbtype=rnd.choice([db.DB_HASH, db.DB_BTREE]), flags=db.DB_CREATE)
held, payload = {}, size - 26
for i in range(rnd.randint(5, 300)):
    key = f"a/{rnd.randint(0, 400)}"
    n = rnd.choice([0, 1, rnd.randint(2, 50), payload - 1, payload, payload + 1, 3 * payload + 5, rnd.randint(0, 300_000)])
    value = os.urandom(n)
    handle.put(key.encode(), value)
    held[key] = value
    if held and rnd.random() < 0.35:
        gone = rnd.choice(sorted(held))
        handle.delete(gone.encode())
        del held[gone]
handle.close()
print(json.dumps({k: v.hex() for k, v in held.items()}))
"""


def test_berkeley_db_files_of_every_shape_read_exactly_through_a_read_only_mount(tmp_path):
    # The mount reads a read-only file's values from its pages itself (bdb/layout.rs): each file
    # here is read whole and in ranges around its pages' edges, against what the library wrote.
    for seed in range(12):
        path = tmp_path / f"shape-{seed}.db"
        made = subprocess.run([DBM_PYTHON, "-c", BDB_SHAPES, str(seed), str(path)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr[-1500:]
        held = {k: bytes.fromhex(v) for k, v in json.loads(made.stdout).items()}
        mnt = tmp_path / f"mnt-{seed}"
        mnt.mkdir()
        with shardfs.mount(str(path), mnt, read_only=True):
            for key, value in held.items():
                assert (mnt / key).read_bytes() == value, f"seed {seed}: {key}"
                rnd = random.Random(key)
                with open(mnt / key, "rb") as f:
                    edges = {0, 1, 485, 486, 487, 4069, 4070, 4071, len(value) // 2, len(value) - 1, rnd.randint(0, 300_000)}
                    for at in sorted(at for at in edges if at >= 0):
                        n = rnd.choice([1, 100, 5000, 70_000])
                        assert os.pread(f.fileno(), n, at) == value[at:at + n], f"seed {seed}: {key} {at}+{n}"
