"""Arrays that change while mounted: the view must follow every zarr.json change at once (through
the view) or within one watcher pass (underneath), and never serve old geometry.

    target/venv/bin/python scripts/interop_changes.py [path/to/shardfs] [--appends N]

Through a writable mount, zarr-python appends rows after writing (the chunk directories were in
use before the resize), shrinks then grows then writes, and resizes smaller then larger with reads
between; then a loop of N appends (100 by default) with a full read of the array after each; after
unmount zarr-python and tensorstore read the sharded store directly and must get exactly that data.

Underneath a read-only mount whose chunk files and listings were read warm first, zarr-python
grows, shrinks and re-creates arrays (other chunk and shard shapes; sharded -> unsharded ->
sharded): each time the view must serve exactly the new array within a few watcher passes, and
never the fill value where data is.
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorstore as ts
import zarr
from checks import Checks
from interop import chunk_files

# The watcher passes once a second; a change underneath must show within this long.
SETTLE = 3.0


def expected_chunk_files(arr):
    """The chunk keys an unsharded twin of `arr` would hold: every inner chunk that is not all fill."""
    data = arr[...]
    inner = arr.chunks
    keys = set()
    grid = [-(-s // c) for s, c in zip(arr.shape, inner)]
    for idx in np.ndindex(*grid):
        region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, inner))
        block = data[region]
        if not (block == arr.fill_value).all():
            keys.add(os.path.join("c", *map(str, idx)))
    return keys


def create(path, shape, chunks, shards, dtype="uint16"):
    return zarr.create_array(store=path, shape=shape, chunks=chunks, shards=shards, dtype=dtype,
                             compressors=zarr.codecs.GzipCodec(level=1), fill_value=0, overwrite=True)


def mounted(binary, store, mnt, *flags):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([binary, "mount", *flags, store, mnt], check=True)


def unmount(binary, mnt):
    subprocess.run([binary, "unmount", mnt], check=False)
    if os.path.ismount(mnt):
        # Something still holds a file of the mount (a failed step): never leave it behind.
        subprocess.run(["umount", "-l", mnt], check=False)


def rows(n, width, start):
    return (np.arange(n * width, dtype="uint16").reshape(n, width) + start).astype("uint16")


def through_the_view(binary, work, check, appends):
    store, mnt = os.path.join(work, "writable"), os.path.join(work, "mnt-writable")
    os.makedirs(store)
    zarr.open_group(store, mode="w")
    base = create(os.path.join(store, "temps"), (64, 64), (8, 8), (32, 32))
    base[...] = 3
    create(os.path.join(store, "resized"), (64, 64), (8, 8), (32, 32))[...] = 5
    create(os.path.join(store, "grown"), (10, 64), (8, 8), (32, 32))
    expected = {}
    mounted(binary, store, mnt)
    try:
        # The reproduction of the report: writes, then append.
        a = zarr.open_array(os.path.join(mnt, "temps"), mode="r+")
        a[0:16, 0:16] = 7
        want = np.full((64, 64), 3, dtype="uint16")
        want[0:16, 0:16] = 7
        extra = rows(8, 64, 100)
        try:
            a.append(extra, axis=0)
            want = np.concatenate([want, extra])
            check("temps: append after writes works through the view",
                  np.array_equal(zarr.open_array(os.path.join(mnt, "temps"), mode="r")[...], want))
        except OSError as e:
            check("temps: append after writes works through the view", False, repr(e))
        expected["temps"] = want

        # Shrink, grow, write; then smaller and larger with reads between. zarr-python keeps what
        # edge chunks hold beyond a shrink, so the expectation is an unsharded twin that zarr-python
        # changes the same way.
        twin = zarr.create_array(store=os.path.join(work, "twin-resized"), shape=(64, 64), chunks=(8, 8),
                                 dtype="uint16", compressors=zarr.codecs.GzipCodec(level=1), fill_value=0)
        twin[...] = 5
        r = zarr.open_array(os.path.join(mnt, "resized"), mode="r+")
        r[...]

        def same(step):
            got = zarr.open_array(os.path.join(mnt, "resized"), mode="r")
            ok = got.shape == twin.shape and np.array_equal(got[...], twin[...])
            files, want = chunk_files(os.path.join(mnt, "resized")), chunk_files(os.path.join(work, "twin-resized"))
            check(f"resized: {step}", ok and files == want,
                  f"shape {got.shape} vs {twin.shape}; extra files {sorted(files - want)[:3]}, missing {sorted(want - files)[:3]}")

        for step, change in [
            ("shrunk", lambda a: a.resize((20, 20))),
            ("grown again", lambda a: a.resize((80, 72))),
            ("written in the grown region", lambda a: a.__setitem__((slice(60, 80), slice(40, 72)), 9)),
            ("smaller again", lambda a: a.resize((30, 30))),
            # Long enough for the idle commit (2 s): the chunks zarr-python deleted before the shrink
            # must stay deleted when the array grows again.
            ("left to commit", lambda a: time.sleep(1.5)),
            ("larger again", lambda a: a.resize((64, 64))),
            ("written across the old and new bounds", lambda a: a.__setitem__((slice(20, 50), slice(20, 50)), 4)),
        ]:
            change(r)
            change(twin)
            same(step)
        expected["resized"] = twin[...]

        # The loop of appends, each followed by a full read.
        g = zarr.open_array(os.path.join(mnt, "grown"), mode="r+")
        want = np.zeros((10, 64), dtype="uint16")
        bad = []
        for i in range(appends):
            block = rows(3, 64, i)
            g.append(block, axis=0)
            want = np.concatenate([want, block])
            got = zarr.open_array(os.path.join(mnt, "grown"), mode="r")[...]
            if not np.array_equal(got, want):
                bad.append(i)
        check(f"grown: {appends} appends through the view, each read back exactly", not bad, f"wrong after {bad[:5]}")
        expected["grown"] = want
    finally:
        unmount(binary, mnt)
    check("writable: unmounted", not os.path.ismount(mnt))
    for path, data in expected.items():
        stored = zarr.open_array(os.path.join(store, path), mode="r")
        check(f"{path}: zarr-python reads it from the sharded store",
              stored.shards is not None and np.array_equal(stored[...], data))
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(store, path)}}
        check(f"{path}: tensorstore reads it from the sharded store",
              np.array_equal(ts.open(spec, open=True, read=True).result().read().result(), data))
    result = subprocess.run([binary, "check", store], capture_output=True, text=True)
    check("writable: shardfs check passes", result.returncode == 0, result.stdout[-300:])


def served_within(check, name, probe):
    """Polls `probe` (None when right, else what is wrong) until it is right or SETTLE passes."""
    deadline = time.time() + SETTLE
    while True:
        try:
            wrong = probe()
        except Exception as e:  # noqa: BLE001 - until the watcher's pass, a read may be cut short
            wrong = repr(e)
        if wrong is None or time.time() > deadline:
            check(name, wrong is None, wrong or "")
            return
        time.sleep(0.1)


def view_matches(mnt, store, path):
    """None when the view of `path` reads exactly what the store holds, with exactly its chunk files."""
    direct = zarr.open_array(os.path.join(store, path), mode="r")
    want = direct[...]
    view = zarr.open_array(os.path.join(mnt, path), mode="r")
    if view.shape != want.shape:
        return f"shape {view.shape}, want {want.shape}"
    got = view[...]
    if not np.array_equal(got, want):
        return f"{int((got != want).sum())} elements differ (fill value where data is: {int(((got == 0) & (want != 0)).sum())})"
    files, want_files = chunk_files(os.path.join(mnt, path)), expected_chunk_files(direct)
    if files != want_files:
        return f"chunk files: extra {sorted(files - want_files)[:3]}, missing {sorted(want_files - files)[:3]}"
    return None


def warm(mnt, path):
    """Reads every chunk file and listing of `path` through the view, so the kernel caches them
    (errors are for the checks that follow to find)."""
    try:
        for dirpath, _, names in os.walk(os.path.join(mnt, path)):
            for name in names:
                with open(os.path.join(dirpath, name), "rb") as f:
                    f.read()
        zarr.open_array(os.path.join(mnt, path), mode="r")[...]
    except Exception:  # noqa: BLE001 - the checks after it say what is wrong
        pass


def underneath(binary, work, check):
    store, mnt = os.path.join(work, "changing"), os.path.join(work, "mnt-changing")
    os.makedirs(store)
    zarr.open_group(store, mode="w")
    a = create(os.path.join(store, "a"), (64, 64), (8, 8), (32, 32))
    a[...] = 1
    b = create(os.path.join(store, "b"), (64, 64), (8, 8), (32, 32))
    b[...] = 2
    c = create(os.path.join(store, "c"), (48, 48), (8, 8), (16, 16))
    c[...] = 4
    mounted(binary, store, mnt, "--read-only")
    try:
        for path in ["a", "b", "c"]:
            warm(mnt, path)
        # Grown by another program, which writes the new rows.
        a.resize((96, 64))
        a[64:96] = rows(32, 64, 50)
        served_within(check, "underneath: grown, the new rows are served (never the fill value)",
                      lambda: view_matches(mnt, store, "a"))
        warm(mnt, "a")
        # Shrunk.
        a.resize((40, 40))
        served_within(check, "underneath: shrunk, chunks beyond the bounds are gone",
                      lambda: view_matches(mnt, store, "a"))
        # Deleted and re-created with other chunk and shard shapes.
        b2 = create(os.path.join(store, "b"), (64, 64), (4, 16), (16, 32))
        b2[...] = rows(64, 64, 7)
        served_within(check, "underneath: re-created with other chunk and shard shapes",
                      lambda: view_matches(mnt, store, "b"))
        warm(mnt, "b")
        b3 = create(os.path.join(store, "b"), (64, 64), (16, 8), (32, 64))
        b3[...] = rows(64, 64, 900)
        served_within(check, "underneath: re-created again with yet other shapes",
                      lambda: view_matches(mnt, store, "b"))
        # Sharded -> unsharded -> sharded.
        unsharded = zarr.create_array(store=os.path.join(store, "c"), shape=(48, 48), chunks=(8, 8), dtype="uint16",
                                      compressors=zarr.codecs.GzipCodec(level=1), fill_value=0, overwrite=True)
        unsharded[...] = rows(48, 48, 3)
        served_within(check, "underneath: sharded -> unsharded", lambda: view_matches(mnt, store, "c"))
        warm(mnt, "c")
        again = create(os.path.join(store, "c"), (48, 48), (8, 8), (16, 16))
        again[...] = rows(48, 48, 11)
        served_within(check, "underneath: unsharded -> sharded", lambda: view_matches(mnt, store, "c"))
    finally:
        unmount(binary, mnt)


def main():
    args = sys.argv[1:]
    appends = 100
    if "--appends" in args:
        i = args.index("--appends")
        appends = int(args[i + 1])
        del args[i:i + 2]
    binary = os.path.realpath(args[0] if args else "target/debug/shardfs")
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="shardfs-changes.") as work:
        through_the_view(binary, work, check, appends)
        underneath(binary, work, check)
    return check.summary("interop-changes")


if __name__ == "__main__":
    sys.exit(main())
