"""A Kyoto Cabinet file as a zarr-python 2 store, through Kyoto Cabinet's own command-line tools
(`kchashmgr`, `kctreemgr`, Debian's kyotocabinet-utils): no Python binding of Kyoto Cabinet is
on PyPI. A MutableMapping of the Zarr keys (UTF-8) to their values, the layout `shardfs` mounts;
writes are kept and imported in one go at `close()` (a tool run per key would take seconds), so
close the store before mounting.
"""

import os
import subprocess
import tempfile
from collections.abc import MutableMapping


class KyotoStore(MutableMapping):
    def __init__(self, path):
        self.path = str(path)
        self.tool = "kctreemgr" if self.path.endswith(".kct") else "kchashmgr"
        self.kept = {}
        if not os.path.exists(self.path):
            self.run("create", self.path)

    def run(self, *args):
        return subprocess.run([self.tool, *args], check=True, capture_output=True).stdout

    def everything(self):
        """Every key and value in the file, then those kept."""
        listed = self.run("list", "-pv", "-px", self.path).decode().split("\n")
        found = {}
        for line in filter(None, listed):
            key, value = line.split("\t")
            found[bytes.fromhex(key.replace(" ", "")).decode()] = bytes.fromhex(value.replace(" ", ""))
        return {**found, **self.kept}

    def __getitem__(self, key):
        if key in self.kept:
            return self.kept[key]
        run = subprocess.run([self.tool, "get", "-px", self.path, key], capture_output=True)
        if run.returncode != 0:
            raise KeyError(key)
        return bytes.fromhex(run.stdout.decode().replace(" ", "").strip())

    def __setitem__(self, key, value):
        self.kept[key] = bytes(value)

    def __delitem__(self, key):
        if key not in self:
            raise KeyError(key)
        self.kept.pop(key, None)
        subprocess.run([self.tool, "remove", self.path, key], capture_output=True)

    def __contains__(self, key):
        try:
            self[key]
            return True
        except KeyError:
            return False

    def __iter__(self):
        return iter(list(self.everything()))

    def __len__(self):
        return len(self.everything())

    def close(self):
        if self.kept:
            with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as tsv:
                for key, value in self.kept.items():
                    tsv.write(f"{key.encode().hex()}\t{value.hex()}\n")
            try:
                self.run("import", "-sx", self.path, tsv.name)
            finally:
                os.unlink(tsv.name)
            self.kept = {}
