"""scripts/fault_proxy.py driven from a test: started in front of an S3 server, its rules set and
its counts read through its control endpoint, stopped by the test that started it. Used by
``test_faults.py``, ``test_many_writers.py`` and ``test_killed_daemon.py``."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class FaultProxy:
    """scripts/fault_proxy.py in a process of its own, in front of `upstream`."""

    def __init__(self, upstream):
        self.process = subprocess.Popen([sys.executable, ROOT / "scripts/fault_proxy.py", "--upstream", upstream],
                                        stdout=subprocess.PIPE, text=True)
        self.endpoint = f"http://127.0.0.1:{int(self.process.stdout.readline().split()[-1])}"

    def control(self, rules=None):
        """Sets the rules (None: none set), and returns how often each was applied."""
        data = None if rules is None else json.dumps({"rules": rules}).encode()
        request = urllib.request.Request(f"{self.endpoint}/__faults", data=data, method="GET" if data is None else "POST")
        with urllib.request.urlopen(request) as r:
            return json.loads(r.read())

    def wait_applied(self, rule, timeout=30):
        """Waits until rule number `rule` has been applied once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.control()["applied"][rule] > 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"fault rule {rule} never applied: {self.control()}")

    def stop(self):
        self.process.terminate()
        self.process.wait(10)
