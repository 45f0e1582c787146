"""A daemon killed -9 at the worst moment ends, and its callers are answered (issue 61, hole 8).

The worst moment: a lookup in a directory is waiting for the daemon's answer (its GET stalled by
the fault proxy), so the kernel holds that directory's lock, and the daemon's watcher tells the
kernel to drop a name in the same directory (the directory's zarr.json, replaced in the bucket).
The kernel takes that lock to drop the name, so the watcher's write to /dev/fuse sleeps,
uninterruptibly, until the lookup is answered. Killed then, the daemon cannot finish dying: the
sleeping thread keeps its /dev/fuse open, so the kernel never ends the connection, so the lookup
is never answered. Without the guard that aborts a dead daemon's connection, the daemon and the
caller stayed in D state until someone wrote to /sys/fs/fuse/connections/N/abort, which this test
does in any case, so that no run leaves a stuck mount behind.

Checked: the watcher is seen asleep in the kernel before the kill; within 5 s of the kill every
thread of the daemon is gone and the caller's lookup failed with ENOTCONN or ECONNABORTED.

Runs in ``target/venv``; as root (the connection is aborted through fusectl, mounted in a mount
namespace of the test's own where the machine has not mounted it).
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
import shardfs
import zarr
from zarr.storage import ObjectStore

from object_stores import BUCKET, s3_objects
from proxies import FaultProxy

CONNECTIONS = "/sys/fs/fuse/connections"
# The guard and this test's clean-up both reach a connection through fusectl: the system's, or
# (root only) one of their own.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.path.ismount(CONNECTIONS),
                                reason="fusectl is not mounted and this is not root")


def mount_device(mnt):
    """The device (major, minor) of the mount at `mnt`, from mountinfo (asks the daemon nothing)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4].replace("\\040", " ") == str(mnt):
            device = fields[2]
    major, minor = device.split(":")
    return int(major), int(minor)


def still_mounted_as(mnt, device):
    points = [line.split(" ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return any(f[4].replace("\\040", " ") == str(mnt) and f[2] == f"{device[0]}:{device[1]}" for f in points)


def abort_connection(mnt, device):
    """Aborts the FUSE connection of the mount at `mnt`, if that mount is still there with
    `device` (so never another mount's that took the device number since)."""
    if not still_mounted_as(mnt, device):
        return
    abort = f"{CONNECTIONS}/{device[1]}/abort"
    if os.path.exists(abort):
        Path(abort).write_text("1")
    else:
        subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"mount -t fusectl fusectl {CONNECTIONS} && echo 1 > {abort}"], check=True, timeout=10)


def threads(pid):
    """The (name, state) of each thread of process `pid` that has not exited."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            state = stat[stat.rindex(")") + 2]
            if state not in "ZX":
                found.append((name, state))
    except FileNotFoundError:
        pass
    return found


def errno_of(call):
    try:
        call()
    except OSError as e:
        return e.errno
    return None


def guards_of(daemon):
    """The process IDs of the guards of daemon `daemon` still running."""
    found = subprocess.run(["pgrep", "-f", f"^shardfs guard {daemon} "], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if threads(int(pid))]


def mount_golden(mnt, log):
    """Mounts the golden sharded store read-only at `mnt`; the daemon's process ID."""
    store = Path(__file__).resolve().parents[1] / "data/golden/sharded"
    subprocess.run([shardfs.binary(), "mount", str(store), str(mnt), "--read-only", "--log-file", str(log), "-vv"],
                   check=True, capture_output=True, text=True)
    return int(subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt} "], capture_output=True,
                              text=True).stdout.split()[0])


def wait_for(condition, seconds, step=0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


LOOKUP = """
import errno, os, sys, time
start = time.monotonic()
try:
    os.stat(sys.argv[1])
    print("ok", time.monotonic() - start, flush=True)
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno), time.monotonic() - start, flush=True)
"""


@pytest.fixture
def bucket(s3_server):
    """An array at ``killed/`` (a prefix no other file's cases use in the session's server) of two
    shards (view files c/0 and c/1 in the first, c/2 and c/3 in the second), and the proxy in
    front of the server."""
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    array = zarr.create_array(store=ObjectStore(s3_objects(s3_server.endpoint, "killed")), shape=(16,), chunks=(4,),
                              shards=(8,), dtype="uint8", overwrite=True)
    array[...] = np.arange(16, dtype="uint8")
    proxy = FaultProxy(s3_server.endpoint)
    try:
        yield s3, proxy
    finally:
        proxy.stop()


GUARDED, WITHOUT_GUARD, QUEUED = "guarded", "killed with its guard", "guarded, a lookup still queued"


def waiting_on_the_daemon(pid):
    """True once process `pid` waits in the kernel for the daemon's answer to a request."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() in ("request_wait_answer", "fuse_simple_request")
    except OSError:
        return False


@pytest.mark.parametrize("case", [GUARDED, WITHOUT_GUARD, QUEUED])
def test_a_daemon_killed_while_its_watcher_waits_on_a_lookup_ends_and_its_caller_is_answered(bucket, tmp_path, case):
    """Killed with its guard (as at the end of a container), the daemon still ends: the lookup
    held was one the daemon had been sent, which the kernel ends once the session's /dev/fuse
    is closed, and the thread that writes invalidations does not hold that one open. A lookup
    still queued (the daemon's one worker thread busy) is ended only by the guard's abort."""
    s3, proxy = bucket
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    threads_flag = ["--threads", "1"] if case == QUEUED else []
    subprocess.run([shardfs.binary(), "mount", f"s3://{BUCKET}/killed", str(mnt), "--endpoint-url", proxy.endpoint,
                    "--read-only", "--metadata-ttl", "100", "--read-ahead-size", "0", *threads_flag,
                    "--log-file", str(tmp_path / "daemon.log"), "-v"],
                   check=True, capture_output=True, text=True)
    device = mount_device(mnt)
    daemon, callers = None, []
    try:
        daemon = int(subprocess.run(["pgrep", "-f", f"shardfs mount .* {mnt} "], capture_output=True,
                                    text=True).stdout.split()[0])
        # The kernel holds c/0 (its name and inode), for the watcher to drop.
        (mnt / "c/0").stat()
        proxy.control([{"method": "GET", "key": "/killed/c/1$", "fault": "stall", "seconds": 600, "times": 1}])
        lookups = ["c/2", "c/3"] if case == QUEUED else ["c/2"]
        for name in lookups:
            callers.append(subprocess.Popen([sys.executable, "-c", LOOKUP, str(mnt / name)], stdout=subprocess.PIPE,
                                            text=True))
            if len(callers) == 1:
                proxy.wait_applied(0)
        # The lookup of c/2 waits for the stalled GET of its shard's index, holding the lock of
        # directory c (shared: the queued lookup of c/3 holds it too). A new version of the first
        # shard makes the watcher drop the name c/0, in that directory.
        assert wait_for(lambda: all(waiting_on_the_daemon(c.pid) for c in callers), 10)
        zarr.open_array(ObjectStore(s3_objects(s3.meta.endpoint_url, "killed")), mode="r+")[0:8] = 100
        # The thread that writes the watcher's invalidations (the watcher's own before the fix).
        asleep = wait_for(lambda: {("shardfs-notify", "D"), ("shardfs-watch", "D")} & set(threads(daemon)), 15)
        assert asleep, f"the watcher never waited on the lookup's lock: {threads(daemon)}"

        if case == WITHOUT_GUARD:
            (guarding,) = guards_of(daemon)
            os.kill(guarding, signal.SIGKILL)
            assert wait_for(lambda: not threads(guarding), 5)
        os.kill(daemon, signal.SIGKILL)
        killed = time.monotonic()
        ended = wait_for(lambda: not threads(daemon), 5)
        left = threads(daemon)
        answered = wait_for(lambda: all(c.poll() is not None for c in callers),
                            max(0.1, killed + 5 - time.monotonic()))
        assert ended, f"5 s after kill -9 the daemon's threads are still there: {left}"
        assert answered, "5 s after the daemon was killed, a lookup it held is still waiting"
        for caller in callers:
            outcome = caller.stdout.read().split()
            # A request in flight ends as aborted, every later one finds no connection.
            assert outcome[0] in ("ENOTCONN", "ECONNABORTED"), f"a held lookup ended with {outcome}"
        assert errno_of(lambda: os.stat(mnt / "zarr.json")) == errno.ENOTCONN
    finally:
        # Whatever happened, nothing is left waiting on this mount.
        abort_connection(mnt, device)
        proxy.control([])
        for caller in callers:
            caller.wait(30)
        if daemon is not None:
            wait_for(lambda: not threads(daemon), 30)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_a_clean_unmount_stands_the_guard_down(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    daemon = mount_golden(mnt, log)
    try:
        assert wait_for(lambda: "guarding FUSE connection" in log.read_text(), 10), log.read_text()
        assert len(guards_of(daemon)) == 1
        (mnt / "zp/zarr.json").read_bytes()
        subprocess.run([shardfs.binary(), "unmount", str(mnt)], check=True, capture_output=True, timeout=60)
        assert not threads(daemon) and not guards_of(daemon)
        assert "aborted" not in log.read_text() and "not guarded" not in log.read_text()
    finally:
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_a_dead_daemons_guard_never_aborts_a_later_mount_of_the_same_device_number(tmp_path):
    """The guard of a killed daemon is held stopped until a new mount has taken the old mount's
    place (most often its device number too, the lowest free), then let go: it finds the daemon
    ended, and what it opened was the old connection's, gone, so it leaves the new mount alone."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "first.log"
    first = mount_golden(mnt, log)
    second = None
    try:
        assert wait_for(lambda: "guarding FUSE connection" in log.read_text(), 10), log.read_text()
        old = mount_device(mnt)
        (guard,) = guards_of(first)
        os.kill(guard, signal.SIGSTOP)
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: not threads(first), 5)
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=True, capture_output=True)
        second = mount_golden(mnt, tmp_path / "second.log")
        print("device numbers: old", old, "new", mount_device(mnt))
        os.kill(guard, signal.SIGCONT)
        assert wait_for(lambda: not threads(guard), 5), "the dead daemon's guard is still there"
        time.sleep(0.5)
        assert json.loads((mnt / "zp/zarr.json").read_text())["node_type"] == "group"
        assert "aborted" not in log.read_text()
    finally:
        if second is not None:
            subprocess.run([shardfs.binary(), "unmount", str(mnt)], capture_output=True, timeout=60)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
