"""The Python module of the wheel (shardfs.mount and the shardfs_mount pytest fixture), run by
scripts/package-test.sh in a fresh venv where only the wheel and pytest are installed."""

import os
import pathlib
import subprocess
import sys

import pytest

import shardfs

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden"
CHUNK = "zp/gzip_crc_end/c/2/1"


def mounted(path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        return any(line.split(" ")[1] == target for line in mounts)


def test_the_binary_is_on_the_venvs_path():
    exe = shardfs.binary()
    assert pathlib.Path(exe).parent == pathlib.Path(sys.executable).parent
    assert subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.startswith("shardfs ")


def test_mount_serves_the_unsharded_view_and_unmounts():
    with shardfs.mount(DATA / "sharded", read_only=True) as view:
        assert mounted(view)
        assert (pathlib.Path(view) / CHUNK).read_bytes() == (DATA / "unsharded" / CHUNK).read_bytes()
    assert not mounted(view)
    assert not os.path.exists(view), "the temporary mount point is removed"


def test_a_failed_mount_is_one_error_naming_the_cause(tmp_path):
    missing = tmp_path / "no-such-store"
    with pytest.raises(shardfs.MountError, match="no-such-store"):
        with shardfs.mount(missing, tmp_path / "mnt"):
            pass
    with pytest.raises(shardfs.MountError, match="no-such-option|unexpected argument"):
        with shardfs.mount(DATA / "sharded", no_such_option=1):
            pass


def test_an_exception_in_the_block_leaves_nothing_mounted(tmp_path):
    point = tmp_path / "mnt"
    point.mkdir()
    with pytest.raises(KeyError):
        with shardfs.mount(DATA / "sharded", point, read_only=True):
            assert mounted(point)
            raise KeyError("inside")
    assert not mounted(point)


def test_writes_are_committed_at_the_end_of_the_block(tmp_path):
    store = tmp_path / "store"
    subprocess.run(["cp", "-r", str(DATA / "sharded"), str(store)], check=True)
    with shardfs.mount(store) as view:
        (pathlib.Path(view) / "zp/raw_nocrc/c/3").write_bytes(b"written")
    with shardfs.mount(store, read_only=True) as view:
        assert (pathlib.Path(view) / "zp/raw_nocrc/c/3").read_bytes() == b"written"


def test_the_fixture_mounts_in_one_line(shardfs_mount):
    view = shardfs_mount(DATA / "sharded", read_only=True, zarr_format=2)
    assert (pathlib.Path(view) / "zp/gzip_crc_end/.zarray").is_file()
    assert mounted(view)
