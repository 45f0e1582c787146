"""Interop test for web servers: shardfs mounts https://HOST/PATH-style URLs served by nginx.

    target/venv/bin/python scripts/interop_http.py [path/to/shardfs]

zarr-python 3 and tensorstore write every layout of tests/data/generate.py into a directory
(sharded, with consolidated metadata), plus a group without consolidated metadata. One nginx
(Debian's, installed by scripts/setup.sh; run as this user on loopback with a configuration
written here, stopped however the test ends) serves that directory twice: with WebDAV listings
(the dav_ext module's PROPFIND) and without (a plain static server, which answers PROPFIND 405).
A third server neither lists nor gives ETags: reads are pinned to Last-Modified instead. For
each server:
- shardfs mounts http://127.0.0.1:PORT/sharded beside a read-only mount of the same directory as
  a local store; every chunk file of the two views is byte for byte the same, and zarr-python and
  tensorstore read every array of the web mount exactly as of the local one;
- `ls -R` (os.walk) of the two views is the same (without WebDAV the groups' children come from
  consolidated metadata); a group without consolidated metadata lists its children with WebDAV,
  only its zarr.json without, and its array is read by name all the same;
- every write fails with EROFS; `shardfs check`, `info` and `refs` take the URL;
- a shard replaced on the server while a view file of it is open never yields a mix of versions:
  the reader gets the old bytes, the new ones, or an error.
And, before mounting: an unreachable server and a URL with no zarr.json are one-line errors
naming the URL, with exit status 1.
"""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import tensorstore as ts
import zarr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import generate  # noqa: E402
from checks import Checks
from interop import chunk_files

warnings.filterwarnings("ignore", message="Consolidated metadata")
DAV_EXT = "/usr/lib/nginx/modules/ngx_http_dav_ext_module.so"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx serving `root` on three loopback ports: `dav` lists with PROPFIND, `plain` does not,
    and `no_etag` neither lists nor gives ETags (only Last-Modified)."""

    def __init__(self, root, work):
        self.dav, self.plain, self.no_etag = free_port(), free_port(), free_port()
        conf = os.path.join(work, "nginx.conf")
        temp = "\n".join(f"  {kind}_temp_path {work}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # Workers of a root master would run as nobody, which cannot read the temporary directory.
        user = "user root;" if os.geteuid() == 0 else ""
        with open(conf, "w") as f:
            f.write(f"""daemon off;
{user}
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
load_module {DAV_EXT};
events {{}}
http {{
  access_log off;
{temp}
  server {{ listen 127.0.0.1:{self.dav}; root {root}; dav_ext_methods PROPFIND OPTIONS; }}
  server {{ listen 127.0.0.1:{self.plain}; root {root}; }}
  server {{ listen 127.0.0.1:{self.no_etag}; root {root}; etag off; }}
}}
""")
        self.process = subprocess.Popen(["nginx", "-c", conf, "-e", f"{work}/nginx-error.log"])
        deadline = time.monotonic() + 10
        while not all(self.listening(p) for p in (self.dav, self.plain, self.no_etag)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"nginx did not start: {open(f'{work}/nginx-error.log').read()}")
            time.sleep(0.05)

    @staticmethod
    def listening(port):
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Mounts:
    """Mounts made during the test, each unmounted however the test ends."""

    def __init__(self, binary):
        self.binary, self.points = binary, []

    def mount(self, store, mnt, *flags):
        os.makedirs(mnt, exist_ok=True)
        subprocess.run([self.binary, "mount", store, mnt, *flags], check=True)
        self.points.append(mnt)
        return mnt

    def unmount(self, mnt):
        subprocess.run([self.binary, "unmount", mnt], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt], check=False)
        self.points.remove(mnt)

    def close(self):
        for mnt in list(self.points):
            self.unmount(mnt)


def walk(root):
    """Every directory of `root` with its sorted entries, as `ls -R` shows them."""
    return {os.path.relpath(d, root): (sorted(dirs), sorted(files)) for d, dirs, files in os.walk(root)}


def errors_before_mounting(binary, nginx, work, check):
    mnt = os.path.join(work, "never")
    os.makedirs(mnt)
    for what, url, needle in [
        ("server unreachable", f"http://127.0.0.1:{free_port()}/sharded", "cannot reach the server"),
        ("no zarr.json (WebDAV)", f"http://127.0.0.1:{nginx.dav}/nothing-here", "zarr.json"),
        ("no zarr.json (plain)", f"http://127.0.0.1:{nginx.plain}/nothing-here", "zarr.json"),
    ]:
        result = subprocess.run([binary, "mount", url, mnt], capture_output=True, text=True)
        lines = result.stderr.strip().splitlines()
        check(f"mount refused: {what}: exit 1, one line naming the URL and the cause",
              result.returncode == 1 and len(lines) == 1 and url in lines[0] and needle in lines[0]
              and not os.path.ismount(mnt), result.stderr)


def same_as_local(mnt, local, arrays, server, check):
    differ = sorted(chunk_files(mnt) ^ chunk_files(local))
    same = chunk_files(mnt) & chunk_files(local)
    differ += [f for f in sorted(same)
               if open(os.path.join(mnt, f), "rb").read() != open(os.path.join(local, f), "rb").read()]
    check(f"{server}: every chunk file is byte for byte the local mount's ({len(same)} files)",
          not differ and len(same) > 100, str(differ[:5]))
    got, want = walk(mnt), walk(local)
    check(f"{server}: ls -R is the local mount's", got == want,
          str({d: (got.get(d), want.get(d)) for d in set(got) | set(want) if got.get(d) != want.get(d)})[:400])
    for path in arrays:
        want = zarr.open_array(os.path.join(local, path), mode="r")[...]
        got = zarr.open_array(os.path.join(mnt, path), mode="r")[...]
        check(f"{server}: {path}: zarr-python reads it as from the local mount", np.array_equal(got, want))
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mnt, path)}}
        got = ts.open(spec, open=True, read=True).result().read().result()
        check(f"{server}: {path}: tensorstore reads it as from the local mount", np.array_equal(got, want))


def unconsolidated_group(mnt, server, listed, check):
    names = sorted(os.listdir(mnt))
    want = ["arr", "zarr.json"] if listed else ["zarr.json"]
    check(f"{server}: ls of a group without consolidated metadata: {want}", names == want, str(names))
    got = zarr.open_array(os.path.join(mnt, "arr"), mode="r")[...]
    check(f"{server}: its array is read by name", np.array_equal(got, np.arange(64, dtype="int32").reshape(8, 8)))


def writes_refused(mnt, server, check):
    for what, act in [
        ("create a file", lambda: open(os.path.join(mnt, "new"), "wb").close()),
        ("overwrite zarr.json", lambda: open(os.path.join(mnt, "zarr.json"), "r+b").close()),
        ("mkdir", lambda: os.mkdir(os.path.join(mnt, "d"))),
        ("rm a chunk", lambda: os.remove(os.path.join(mnt, "zp/raw_nocrc/c/5"))),
    ]:
        try:
            act()
            check(f"{server}: {what} fails with EROFS", False, "it succeeded")
        except OSError as e:
            check(f"{server}: {what} fails with EROFS", e.errno == errno.EROFS, repr(e))


def commands_take_the_url(binary, url, server, check):
    for command in (["check"], ["check", "--data"], ["info"]):
        result = subprocess.run([binary, *command, url], capture_output=True, text=True)
        check(f"{server}: shardfs {' '.join(command)} URL exits 0", result.returncode == 0, result.stderr[-300:])
    result = subprocess.run([binary, "refs", url], capture_output=True, text=True)
    try:
        refs = json.loads(result.stdout)["refs"]
        shards = {v[0] for v in refs.values() if isinstance(v, list)}
    except (ValueError, KeyError):
        shards = set()
    check(f"{server}: shardfs refs URL names every shard by its URL",
          result.returncode == 0 and shards and all(s.startswith(url + "/") for s in shards), result.stderr[-300:])


def replaced_while_open(mnt, local, data, server, check):
    """A shard replaced on the server between two reads of one open view file: the bytes read are
    one version's, or the read fails."""
    array = zarr.open_array(os.path.join(data, "big"), mode="r+")
    # From the local mount: a read through this one would put the old version in the page cache.
    old = open(os.path.join(local, "big/c/0"), "rb").read()
    with open(os.path.join(mnt, "big/c/0"), "rb", buffering=0) as f:
        head = f.read(4096)
        array[...] = array[...] + 1
        # nginx's ETag is the file's mtime (to the second) and size: a replacement of the same
        # size in the same second would be the same version to it.
        later = time.time() + 10
        for name in os.listdir(os.path.join(data, "big/c")):
            os.utime(os.path.join(data, "big/c", name), (later, later))
        try:
            rest = f.read()
            outcome = "old" if head + rest == old else "mixed"
        except OSError as e:
            outcome = f"error {errno.errorcode.get(e.errno)}"
    # Both mounts show the new version once their watchers have seen it (a pass a second, after
    # the web mount's one-second metadata TTL): waited for, within a bound, never timed.
    # Until then, a read of a version gone from the server fails with ESTALE (README,
    # "Consistency"): at the open, or at the read of a file looked up before the replacement.
    # An error is a right answer here; a mix of versions never is.
    deadline, stale = time.monotonic() + 20, 0
    while True:
        try:
            new = open(os.path.join(mnt, "big/c/0"), "rb").read()
            old_again = open(os.path.join(local, "big/c/0"), "rb").read()
        except OSError as e:
            if e.errno != errno.ESTALE or time.monotonic() > deadline:
                raise
            stale += 1
            time.sleep(0.2)
            continue
        if new == old_again != old or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(f"{server}: the new version shown {time.monotonic() - deadline + 20:.1f} s after the replacement"
          f" (web mount {'new' if new != old else 'old'}, local mount {'new' if old_again != old else 'old'};"
          f" {stale} reads ESTALE before)")
    check(f"{server}: a shard replaced while a view file of it is open: never a mix ({outcome})",
          outcome != "mixed" and new == old_again != old, outcome)
    array[...] = array[...] - 1


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/shardfs")
    check = Checks()
    work = tempfile.mkdtemp(prefix="shardfs-http-")
    mounts = Mounts(binary)
    nginx = None
    try:
        data = os.path.join(work, "data")
        generate.generate(data)
        arrays = json.load(open(os.path.join(data, "arrays.json")))
        sharded = os.path.join(data, "sharded")
        # One big uncompressed shard of one inner chunk of 1 MiB, for the replacement check.
        big = zarr.create_array(store=os.path.join(sharded, "big"), shape=(2 << 20,), dtype="uint8",
                                chunks=(2 << 20,), shards=(2 << 20,), compressors=None, fill_value=0)
        big[...] = np.arange(2 << 20, dtype="uint64").astype("uint8")
        plain = zarr.open_group(os.path.join(data, "unconsolidated"), mode="w")
        plain.create_array("arr", shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="int32")[...] = \
            np.arange(64, dtype="int32").reshape(8, 8)
        zarr.consolidate_metadata(sharded)
        nginx = Nginx(data, work)
        errors_before_mounting(binary, nginx, work, check)
        local = mounts.mount(sharded, os.path.join(work, "local"), "--read-only")
        servers = (("WebDAV", nginx.dav, True), ("plain", nginx.plain, False), ("no ETag", nginx.no_etag, False))
        for server, port, listed in servers:
            url = f"http://127.0.0.1:{port}/sharded"
            # Nothing fetched ahead: each read asks the server for its own bytes, so that the read
            # after a replacement meets the new version.
            mnt = mounts.mount(url, os.path.join(work, f"mnt-{server}"), "--read-ahead-size", "0")
            same_as_local(mnt, local, arrays, server, check)
            writes_refused(mnt, server, check)
            replaced_while_open(mnt, local, sharded, server, check)
            mounts.unmount(mnt)
            other = mounts.mount(f"http://127.0.0.1:{port}/unconsolidated", os.path.join(work, f"un-{server}"))
            unconsolidated_group(other, server, listed, check)
            mounts.unmount(other)
            commands_take_the_url(binary, url, server, check)
    finally:
        mounts.close()
        if nginx:
            nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
    return check.summary("interop_http")


if __name__ == "__main__":
    sys.exit(main())
