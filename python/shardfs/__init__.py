"""Mount a sharded Zarr v3 store from Python: the unsharded view (one file per inner chunk) of a
local directory or an object store URL (``s3://``, ``az://`` or ``gs://BUCKET/PREFIX``), served by
the ``shardfs`` binary installed with this package.

    import shardfs

    with shardfs.mount("data/image.zarr", read_only=True) as view:
        arr = zarr.open_array(f"{view}/0", mode="r")   # or any tool that reads files

The daemon starts, the block runs once the mount serves, and on leaving the block (also on an
exception or Ctrl-C) every pending write is committed and the mount goes away. Options are the
flags of ``shardfs mount`` with ``_`` for ``-``: ``read_only=True``, ``zarr_format=2``,
``cache_size="1G"``, ``endpoint_url="http://127.0.0.1:9000"``. A failure is one
:class:`MountError` carrying the daemon's one-line message.
"""

import contextlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time

__all__ = ["MountError", "binary", "mount"]


class MountError(RuntimeError):
    """shardfs could not mount, or could not unmount cleanly: the message is the daemon's line."""


def binary() -> str:
    """The shardfs executable installed with this package (the venv's scripts), else on PATH."""
    beside = os.path.join(sysconfig.get_path("scripts"), "shardfs")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("shardfs")
    if found is None:
        raise MountError("the shardfs executable is not installed (pip install shardfs)")
    return found


def _flags(options: dict) -> list:
    flags = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            flags += [flag, ",".join(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def _one_line(completed: subprocess.CompletedProcess, what: str) -> str:
    """The daemon's one-line message (the first line: a usage error goes on with help)."""
    lines = [line.strip() for line in (completed.stderr or "").splitlines() if line.strip()]
    return lines[0] if lines else f"{what} failed with exit status {completed.returncode}"


def _unmount(exe: str, mountpoint: str) -> None:
    # A reader still finishing (another thread of a program whose read failed) keeps the mount
    # busy for a moment: asked again for up to 10 s before the mount is left for the caller.
    for _ in range(100):
        done = subprocess.run([exe, "unmount", mountpoint], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if "busy" not in (done.stderr or ""):
            break
        time.sleep(0.1)
    raise MountError(_one_line(done, f"shardfs unmount {mountpoint}"))


@contextlib.contextmanager
def mount(store, mountpoint=None, **options):
    """Mounts ``store`` at ``mountpoint`` (a new temporary directory when None) for the length of
    the ``with`` block, which gets the mount point's path."""
    exe = binary()
    made = mountpoint is None
    path = tempfile.mkdtemp(prefix="shardfs-") if made else os.fspath(mountpoint)
    try:
        started = subprocess.run([exe, "mount", os.fspath(store), path, *_flags(options)],
                                 capture_output=True, text=True)
        if started.returncode != 0:
            raise MountError(_one_line(started, f"shardfs mount {store}"))
        try:
            yield path
        except BaseException:
            # The block's own exception is the one to see; the unmount is still attempted.
            with contextlib.suppress(MountError):
                _unmount(exe, path)
            raise
        _unmount(exe, path)
    finally:
        if made and not os.path.ismount(path):
            with contextlib.suppress(OSError):
                os.rmdir(path)
