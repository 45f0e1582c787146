"""kill -9 torture: daemons mounting one prefix of s3s-fs (through scripts/fault_proxy.py, as a
network would be between them), each with a writer that writes chunks of every shard and fsyncs
each, while daemons are killed -9 and remounted, or stopped (SIGSTOP) past a lease's time-out and
let go on, at random. Writers record a write only once its fsync returned 0. Each daemon's wall clock
is its own (libfaketime): the first SKEW seconds behind the server's, the last SKEW ahead, the rest
spread between, as on machines without a shared time source; their monotonic clocks run true.

Afterwards, a recovery mount commits to every shard (folding what the killed left, taking over
their leases), and a checker reads the bucket directly with zarr-python:
- every chunk holds the last write to it that was acknowledged, or a later one of its writer
  (each chunk has one writer, so a later write is one that was never acknowledged, which may
  land); never bytes no writer wrote;
- every shard decodes, and `shardfs check --data` finds the store healthy;
- nothing of the turn-taking (`__shardfs/exchange/`) is left but a takeover's `doubt-` markers and
  the `stored-` markers of holders killed or stopped before they read them (each daemon's log
  names what it committed as);
- no writer's call failed while its daemon was alive and not killed: contention costs time,
  never an error.

Small by default (the run of `.ci/run`: 4 daemons, 40 s); larger by hand:
``SHARDFS_TORTURE_DAEMONS=8 SHARDFS_TORTURE_SECONDS=240 target/venv/bin/python -m pytest -s tests/interop/test_torture.py``
(``SHARDFS_TORTURE_SKEW=S``: the clocks' spread, 120 s unless told; 0: the machine's own clock).
"""

import datetime
import glob
import os
import random
import signal
import struct
import subprocess
import threading
import time

import numpy as np
import obstore
import pytest
import shardfs
import zarr

from object_stores import S3sFs, daemon_pid, serving, url, zarr_store
from proxies import FaultProxy

DAEMONS = int(os.environ.get("SHARDFS_TORTURE_DAEMONS", "4"))
SECONDS = float(os.environ.get("SHARDFS_TORTURE_SECONDS", "40"))
SHAPE, CHUNKS, SHARDS = (64, 64), (4, 4), (32, 32)
GRID = (SHAPE[0] // CHUNKS[0], SHAPE[1] // CHUNKS[1])
PREFIX = "torture"
SKEW = float(os.environ.get("SHARDFS_TORTURE_SKEW", "120"))
# The multi-threaded build of libfaketime (Debian's `faketime`, which scripts/setup.sh installs).
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")), None)


def clock_offset(n):
    """How far daemon n's wall clock is from the machine's, in seconds: -SKEW for the first,
    +SKEW for the last."""
    return 0.0 if DAEMONS == 1 else SKEW * (2 * n / (DAEMONS - 1) - 1)


def daemon_env(n):
    """Daemon n's environment: its log names the exchange names it commits as (`commits as`),
    and its wall clock is set apart. Only the wall clock: a faked monotonic clock would also move
    the absolute deadlines of Rust's timed waits."""
    env = dict(os.environ, RUST_LOG="info,shardfs::write::shared_commit=debug")
    if SKEW == 0:
        return env
    if LIBFAKETIME is None:
        pytest.fail("libfaketime is not installed (scripts/setup.sh installs Debian's faketime)")
    return dict(env, LD_PRELOAD=LIBFAKETIME, FAKETIME=f"{clock_offset(n):+.0f}s", DONT_FAKE_MONOTONIC="1")


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, len(ordered) * p // 100)] if ordered else 0.0


def logged_offset(slot):
    """How far the time stamp of the line a daemon logs as it starts to serve is from the machine's
    time once its mount returned, in seconds: its clock's offset, less the moments between. None
    where there is no such line."""
    with open(slot.log) as f:
        line = next((line for line in f if "shardfs::mount]" in line and "serving" in line), None)
    if line is None:
        return None
    logged = datetime.datetime.strptime(line[1:25], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    return (logged - slot.first_mounted).total_seconds()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    server = S3sFs()
    with serving(server, tmp_path_factory.mktemp("s3s-env")):
        yield server


def content(writer, seq):
    """A chunk's 16 bytes: its writer and the writer's count of writes, twice."""
    return struct.pack("<II", writer, seq) * 2


def decode(chunk):
    raw = chunk.astype(np.uint8).tobytes()
    writer, seq = struct.unpack("<II", raw[:8])
    return (writer, seq) if raw[8:] == raw[:8] else None


class Slot:
    """One daemon and its writer; `kills` counts its kills (each counted before it is sent),
    `remounts` its mounts after them, `stops` its stops; `lock` keeps the writer off the mount
    point while the daemon is remounted."""

    def __init__(self, n, service, endpoint, tmp_path):
        self.n, self.service, self.endpoint = n, service, endpoint
        self.mnt = tmp_path / f"m{n}"
        self.mnt.mkdir()
        self.log = tmp_path / f"m{n}.log"
        self.lock = threading.Lock()
        self.kills = self.remounts = self.stops = 0
        self.mount()
        self.first_mounted = datetime.datetime.now(datetime.timezone.utc)

    def mount(self):
        subprocess.run([shardfs.binary(), "mount", url(self.service, PREFIX), str(self.mnt), "--endpoint-url",
                        self.endpoint, "--log-file", str(self.log)], check=True, capture_output=True,
                       env=daemon_env(self.n), timeout=120)

    def names(self):
        """The exchange names this slot's daemons committed as."""
        with open(self.log) as f:
            return {line.rsplit("commits as ", 1)[1].strip() for line in f if "commits as " in line}

    def kill_and_remount(self):
        pid = daemon_pid(self.mnt)
        self.kills += 1
        os.kill(pid, signal.SIGKILL)
        with self.lock:
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.mount()
            self.remounts += 1

    def unmount(self):
        done = subprocess.run([shardfs.binary(), "unmount", str(self.mnt)], capture_output=True, text=True)
        return done.returncode, done.stderr


def test_daemons_killed_and_stopped_at_random_lose_no_fsynced_write(service, tmp_path):
    zarr.create_array(store=zarr_store(service, PREFIX), shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint8",
                      compressors=None, fill_value=0)
    proxy = FaultProxy(service.endpoint)
    slots = []
    try:
        for n in range(DAEMONS):
            slots.append(Slot(n, service, proxy.endpoint, tmp_path))
        # The clocks are skewed as told (the test means nothing if the preload took no effect).
        offsets = [(s.n, logged_offset(s)) for s in slots]
        unskewed = [(n, o) for n, o in offsets if o is None or abs(o - clock_offset(n)) > 5]
        assert unskewed == [], f"daemons whose clocks are not as told (daemon, offset logged): {unskewed}"
    except BaseException:
        for slot in slots:
            slot.unmount()
        proxy.stop()
        raise
    owned = {n: [(i, j) for i in range(GRID[0]) for j in range(GRID[1]) if (i * GRID[1] + j) % DAEMONS == n]
             for n in range(DAEMONS)}
    acked, tried, blamed, latencies = {}, {}, [], []
    facts = threading.Lock()
    start = time.monotonic()
    end = start + SECONDS
    events = []
    rng = random.Random(int(os.environ.get("SHARDFS_TORTURE_SEED", "1")))

    def writer(slot):
        seq, pick = 0, random.Random(slot.n)
        while time.monotonic() < end:
            i, j = pick.choice(owned[slot.n])
            seq += 1
            with facts:
                tried.setdefault((i, j), set()).add(seq)
            with slot.lock:
                kills, alive = slot.kills, slot.kills == slot.remounts
                if not os.path.ismount(slot.mnt):
                    # Killed and not yet remounted; anything else is a fault.
                    if alive and slot.kills == kills:
                        blamed.append(f"daemon {slot.n}: not mounted")
                        break
                    failed = True
                else:
                    failed = False
                    path = os.path.join(slot.mnt, "c", str(i), str(j))
                    began = time.monotonic()
                    try:
                        os.makedirs(os.path.dirname(path), exist_ok=True)
                        with open(path, "wb") as f:
                            f.write(content(slot.n, seq))
                            f.flush()
                            os.fsync(f.fileno())
                    except OSError as e:
                        # Killed under it: the write was never acknowledged. Anything else is a fault.
                        if alive and slot.kills == kills:
                            blamed.append(f"{time.monotonic() - start:.1f} s: daemon {slot.n}, chunk {(i, j)}: {e}")
                        failed = True
            if failed:
                # Out of the lock, so that the killer can remount.
                time.sleep(0.1)
                continue
            with facts:
                acked[(i, j)] = seq
                latencies.append(time.monotonic() - began)

    threads = [threading.Thread(target=writer, args=(slot,)) for slot in slots]
    for t in threads:
        t.start()
    kills = stops = 0
    try:
        while time.monotonic() < end - 5:
            time.sleep(rng.uniform(1, 4))
            slot = rng.choice(slots)
            if rng.random() < 0.5:
                events.append(f"{time.monotonic() - start:.1f} s: kill {slot.n}")
                slot.kill_and_remount()
                kills += 1
            else:
                pid = daemon_pid(slot.mnt)
                events.append(f"{time.monotonic() - start:.1f} s: stop {slot.n}")
                slot.stops += 1
                os.kill(pid, signal.SIGSTOP)
                time.sleep(rng.uniform(2, 14))
                os.kill(pid, signal.SIGCONT)
                stops += 1
    finally:
        for t in threads:
            t.join(timeout=600)
        unmounted = [slot.unmount() for slot in slots]
        proxy.stop()
    print(f"{DAEMONS} daemons, {SECONDS:.0f} s, clocks {-SKEW:+.0f} to {SKEW:+.0f} s: "
          f"{sum(len(v) for v in tried.values())} writes, {len(acked)} chunks acknowledged, {kills} kills, "
          f"{stops} stops; an acknowledged write took median {percentile(latencies, 50):.2f} s, "
          f"p99 {percentile(latencies, 99):.2f} s, max {max(latencies, default=0):.2f} s")
    assert blamed == [], (blamed, events)
    assert [u for u in unmounted if u[0] != 0] == []

    # The recovery mount: a commit to every shard, rewriting a chunk as it is, folds what the
    # killed daemons left (past their leases' time-out).
    (tmp_path / "recovery").mkdir()
    with shardfs.mount(url(service, PREFIX), tmp_path / "recovery", endpoint_url=service.endpoint) as view:
        for si in range(SHAPE[0] // SHARDS[0]):
            for sj in range(SHAPE[1] // SHARDS[1]):
                path = os.path.join(view, "c", str(si * SHARDS[0] // CHUNKS[0]), str(sj * SHARDS[1] // CHUNKS[1]))
                try:
                    with open(path, "rb") as f:
                        same = f.read()
                except FileNotFoundError:
                    same = bytes(CHUNKS[0] * CHUNKS[1])
                with open(path, "wb") as f:
                    f.write(same)
                    f.flush()
                    os.fsync(f.fileno())

    got = zarr.open_array(zarr_store(service, PREFIX), mode="r")[...]
    wrong = []
    for i in range(GRID[0]):
        for j in range(GRID[1]):
            chunk = got[i * CHUNKS[0]:(i + 1) * CHUNKS[0], j * CHUNKS[1]:(j + 1) * CHUNKS[1]]
            held = decode(chunk) if chunk.any() else None
            owner = (i * GRID[1] + j) % DAEMONS
            if held is None:
                if (i, j) in acked:
                    wrong.append(f"chunk {(i, j)}: empty, acknowledged {acked[(i, j)]}")
                continue
            writer, seq = held
            if writer != owner or seq not in tried.get((i, j), ()):
                wrong.append(f"chunk {(i, j)}: bytes of no write to it ({writer}, {seq})")
            elif seq < acked.get((i, j), 0):
                wrong.append(f"chunk {(i, j)}: write {seq}, older than acknowledged {acked[(i, j)]}")
    assert wrong == [], wrong
    checked = subprocess.run([shardfs.binary(), "check", "--data", url(service, PREFIX), "--endpoint-url",
                              service.endpoint], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    left = [m["path"] for batch in obstore.list(service.objects(), prefix=f"{PREFIX}/__shardfs/exchange/")
            for m in batch]
    # What a takeover leaves stays for a delta's lifetime (docs/semantics.md): `doubt-` markers,
    # and the `stored-` marker of a holder that never read it: killed, or stopped, taken over
    # and let go on before the marker was made. Never that of a daemon neither killed nor stopped.
    disrupted = set().union(*(s.names() for s in slots if s.kills or s.stops))
    unread = [k for k in left if "/stored-" in k and k.rsplit("/stored-", 1)[1] not in disrupted]
    assert unread == [], f"stored- markers of holders neither killed nor stopped: {unread}"
    assert [k for k in left if "/doubt-" not in k and "/stored-" not in k] == []
