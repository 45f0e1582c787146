"""What the Python benchmarks share: the bucket's name and keys, free ports, scripts/latency_proxy.py
run as a process of its own with its counts, removing a scratch directory, and writing the
report. Needs only the standard library, so that every venv's benchmark can import it.
"""

import functools
import json
import os
import shutil
import socket
import subprocess
import sys

BUCKET = "bench"
KEYS = dict(access_key_id="test", secret_access_key="test")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
from ports import free_port, wait_for_port  # noqa: E402


class LoggedMoto:
    """moto (this venv's moto_server) in a process of its own, each request a line of its log."""

    def __init__(self, work):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(work, "moto.log")
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(self.port)],
                                            stdout=subprocess.DEVNULL, stderr=log)
        wait_for_port(self.port, "moto", self.process)

    def log_lines(self):
        with open(self.log, errors="replace") as f:
            return f.readlines()

    def stop(self):
        self.process.terminate()
        self.process.wait()


class Proxy:
    """scripts/latency_proxy.py in a process of its own, with its request counts."""

    def __init__(self, server_port, rtt, connection_mbs=None, log_dir=None):
        self.rtt = rtt
        pace = ["--connection-mbs", str(connection_mbs)] if connection_mbs else []
        if log_dir:
            pace += ["--log", os.path.join(log_dir, f"proxy-{rtt:g}ms.log")]
        self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts/latency_proxy.py"),
                                         "--upstream", f"127.0.0.1:{server_port}", "--rtt-ms", str(rtt), *pace],
                                        stdout=subprocess.PIPE, text=True)
        _, _, port, control = self.process.stdout.readline().split()
        self.port, self.control = int(port), int(control)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def counts(self):
        with socket.create_connection(("127.0.0.1", self.control)) as s:
            return json.loads(s.makefile().readline())

    def stop(self):
        self.process.terminate()
        self.process.wait()




@functools.cache
def mount_s3_binary():
    """mountpoint-s3's mount-s3, built by scripts/mountpoint_s3.sh when missing (once per run)."""
    script = os.path.join(ROOT, "scripts", "mountpoint_s3.sh")
    return subprocess.run([script], check=True, capture_output=True, text=True).stdout.strip()


def shardfs_binary(binary):
    """`binary`, or a release build of this tree when none is given."""
    if binary:
        return binary
    subprocess.run(["cargo", "build", "--release", "--locked", "-q", "--bins"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target/release/shardfs")


def start_s3s_fs(work):
    """An s3s-fs server (scripts/s3s_fs.sh builds it) over WORK/s3, with bucket BUCKET, and the
    test keys in the environment, once it listens: (its process, its port)."""
    s3s_fs = subprocess.run([os.path.join(ROOT, "scripts/s3s_fs.sh")], check=True, capture_output=True,
                            text=True).stdout.strip()
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    os.makedirs(os.path.join(work, "s3", BUCKET))
    port = free_port()
    server = subprocess.Popen([s3s_fs, "--host", "127.0.0.1", "--port", str(port), "--access-key", "test",
                               "--secret-key", "test", os.path.join(work, "s3")],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "s3s-fs.log"), "w"))
    try:
        wait_for_port(port, "s3s-fs", server)
    except BaseException:
        server.kill()
        raise
    return server, port


def publish(lines, out):
    """Prints the report's `lines`, and writes them to the file `out` when one is named."""
    print("\n".join(lines))
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


def remove_unless_mounted(work):
    """Removes the directory `work`, unless something is still mounted below it (never delete
    through a mount)."""
    if subprocess.run(["grep", "-q", work, "/proc/mounts"]).returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
