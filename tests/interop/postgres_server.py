"""A real PostgreSQL server for tests and benchmarks (Debian's `postgresql` package): a fresh
cluster in a directory of its own, on a free port of 127.0.0.1, trusting local connections, run
as the `postgres` user when this process is root (the server refuses to run as root); stopped
however the caller ends (a context manager).

And `TableStore`, the layout `shardfs` mounts (`NAME(key text PRIMARY KEY, value bytea)`) as a
zarr-python 2 store: a MutableMapping whose every write is one statement. zarr-python ships no
PostgreSQL store, so this minimal one is what its users would write (and what the benchmark
compares the mount with).
"""

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import MutableMapping

from ports import free_port, wait_for_port


def binaries():
    """The directory of Debian's PostgreSQL server programs, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


class PostgresServer:
    """A cluster whose user `postgres` logs in without a password, or with `password` when given
    (SCRAM, the server's default method)."""

    def __init__(self, password=None):
        self.bin = binaries()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server: apt-get install postgresql (scripts/setup.sh does)")
        # Not under pytest's tmp_path: the server's user must be able to reach its directory.
        self.directory = tempfile.mkdtemp(prefix="shardfs-postgres-")
        os.chmod(self.directory, 0o755)
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self.data = os.path.join(self.directory, "data")
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.process = None
        auth = ["-A", "trust"]
        if password is not None:
            secret = os.path.join(self.directory, "password")
            with open(secret, "w") as f:
                f.write(password)
            if self.user:
                os.chown(secret, pwd.getpwnam(self.user).pw_uid, -1)
            auth = ["-A", "scram-sha-256", f"--pwfile={secret}"]
        self.as_user(f"{self.bin}/initdb", "-D", self.data, *auth, "-U", "postgres", "--no-sync", capture=True)

    def as_user(self, *command, capture=False):
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        return subprocess.run([*prefix, *command], check=True, capture_output=capture)

    def start(self):
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        self.process = subprocess.Popen(
            [*prefix, f"{self.bin}/postgres", "-D", self.data, "-p", str(self.port), "-k", self.directory,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.directory, "log"), "ab"))
        wait_for_port(self.port, "postgres", self.process)
        # The port opens before the server takes connections ("the database system is starting
        # up"): wait until pg_isready says it accepts them.
        deadline = time.monotonic() + 60
        while subprocess.run([f"{self.bin}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres on port {self.port} never took connections (log: {self.directory}/log)")
            time.sleep(0.05)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            # The fast shutdown: clients disconnected, then a checkpoint (runuser passes on no
            # signal, so pg_ctl sends it).
            self.as_user(f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", capture=True)
            self.process.wait(timeout=60)
        self.process = None

    def remove(self):
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def postgres_server():
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


class TableStore(MutableMapping):
    """Zarr keys in the table `table` of the database at `url`, a row a key."""

    def __init__(self, url, table="zarr"):
        import psycopg

        self.table = table
        self.connection = psycopg.connect(url, autocommit=True)
        self.connection.execute(
            f'CREATE TABLE IF NOT EXISTS "{table}" (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL)')

    def __getitem__(self, key):
        row = self.connection.execute(f'SELECT value FROM "{self.table}" WHERE key = %s', (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        return bytes(row[0])

    def __setitem__(self, key, value):
        self.connection.execute(
            f'INSERT INTO "{self.table}" VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value',
            (key, bytes(value)))

    def __delitem__(self, key):
        if self.connection.execute(f'DELETE FROM "{self.table}" WHERE key = %s', (key,)).rowcount == 0:
            raise KeyError(key)

    def __iter__(self):
        return (row[0] for row in self.connection.execute(f'SELECT key FROM "{self.table}"').fetchall())

    def __len__(self):
        return self.connection.execute(f'SELECT count(*) FROM "{self.table}"').fetchone()[0]

    def items(self):
        return {k: bytes(v) for k, v in self.connection.execute(f'SELECT key, value FROM "{self.table}"')}.items()

    def close(self):
        self.connection.close()
