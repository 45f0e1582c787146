"""Loopback ports for the servers the interop tests start: a free one, and waiting for one to
listen."""

import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, what, process=None):
    """Returns once something listens on `port`; fails naming `what` after 30 s, or at once when
    its `process` (a Popen) has ended."""
    for _ in range(300):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start on port {port}")
