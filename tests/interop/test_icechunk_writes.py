"""Icechunk branches as writable mounts: what plain-Zarr tools write through the view becomes
Icechunk commits, and Icechunk's own Python library (the oracle) reads every commit made.

- zarr-python, tensorstore and `cp` writing through a branch mount, in a local repository and in
  S3 (s3s-fs, whose conditional writes are atomic per key, as Icechunk's commits need);
- a new array, a group attribute, a chunk deleted; a sharded array written inner chunk by inner
  chunk stays sharded;
- commits at fsync, at --commit-idle-ms and at unmount, with --message or a default naming shardfs;
- another writer's commit while the mount holds changes: rebased (disjoint changes both land, the
  mount's chunk wins where both wrote one); a change that cannot be rebased fails fsync with EIO
  and commits nothing;
- kill -9 before a commit leaves the branch where it was and the repository readable;
- a tag mount refuses writes (EROFS); two mounts on one branch writing disjoint chunks lose nothing;
- a plain file no commit can hold fails the directory's fsync with EIO naming it.

Runs in ``target/venv-newest``. One case alone:
``target/venv-newest/bin/python -m pytest tests/interop/test_icechunk_writes.py -k rebase``.
"""

import errno
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import icechunk as ic
import numpy as np
import pytest
import shardfs
import tensorstore as ts
import zarr

from object_stores import S3sFs, daemon_pid, serving

BUCKET = "icechunk"


@pytest.fixture(scope="module")
def s3s(tmp_path_factory):
    server = S3sFs()
    with serving(server, tmp_path_factory.mktemp("s3s-env")):
        server.make_bucket(BUCKET)
        yield server


class Repo:
    """A repository, as the mount names it and as Icechunk's library opens it."""

    def __init__(self, address, storage, options, files, mounts):
        self.address, self.storage, self.options, self.files = address, storage, options, files
        self.mounts = mounts

    def chunk_objects(self):
        """How many chunk objects the repository holds, counted in the files holding them."""
        chunks = self.files / "chunks"
        return len(os.listdir(chunks)) if chunks.is_dir() else 0

    def open(self):
        return ic.Repository.open(self.storage())

    def mount(self, **options):
        """A mount of the repository, for a `with` block: unmounted (committing) as it ends."""
        return shardfs.mount(self.address, tempfile.mkdtemp(dir=self.mounts), **self.options, **options)

    def tip(self, branch="main"):
        return self.open().lookup_branch(branch)

    def group(self, branch="main"):
        return zarr.open_group(self.open().readonly_session(branch).store, mode="r")

    def messages(self, branch="main"):
        return [snap.message for snap in self.open().ancestry(branch=branch)]


@pytest.fixture
def mounts(tmp_path):
    """Where the case mounts (whatever is left mounted there is unmounted by conftest's
    no_mount_left)."""
    where = tmp_path / "mounts"
    where.mkdir()
    return where


@pytest.fixture(params=["local", "s3"])
def repo(request, tmp_path, mounts):
    """A new repository (spec 2) holding `a` (8x8 int32, 4x4 chunks) and `sh` (8x8, 2x2 inner
    chunks in 4x4 shards), both written once."""
    if request.param == "local":
        path = str(tmp_path / "repo")
        made = Repo(path, lambda: ic.local_filesystem_storage(path), {}, Path(path), mounts)
    else:
        server = request.getfixturevalue("s3s")
        prefix = tmp_path.name
        made = Repo(f"s3://{BUCKET}/{prefix}", lambda: ic.s3_storage(
            bucket=BUCKET, prefix=prefix, endpoint_url=server.endpoint, allow_http=True, region="us-east-1",
            access_key_id="test", secret_access_key="test", force_path_style=True), {"endpoint_url": server.endpoint},
            Path(server.data, "objects", BUCKET, prefix), mounts)
    repository = ic.Repository.create(made.storage())
    session = repository.writable_session("main")
    group = zarr.group(store=session.store)
    group.create_array("a", shape=(8, 8), chunks=(4, 4), dtype="i4", fill_value=0)[:] = np.arange(64).reshape(8, 8)
    group.create_array("sh", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="i4", fill_value=0)[:] = 1
    session.commit("made by the test")
    return made


def library_commit(repo, write, message="from the library"):
    session = repo.open().writable_session("main")
    write(zarr.open_group(session.store, mode="r+"))
    return session.commit(message)


def test_zarr_python_writes_become_one_commit_icechunk_reads(repo):
    base = repo.tip()
    with repo.mount() as mnt:
        group = zarr.open_group(mnt, mode="r+")
        group["a"][0:4, 4:8] = 100
        group.attrs["note"] = "from shardfs"
        new = group.create_array("new", shape=(6,), chunks=(4,), dtype="f8", fill_value=-1)
        new[:] = np.arange(6) / 2
        # Nothing reaches the branch before a sync point.
        assert repo.tip() == base
    got = repo.group()
    expected = np.arange(64).reshape(8, 8)
    expected[0:4, 4:8] = 100
    np.testing.assert_array_equal(got["a"][:], expected)
    np.testing.assert_array_equal(got["new"][:], np.arange(6) / 2)
    assert got.attrs["note"] == "from shardfs"
    messages = repo.messages()
    assert len(messages) == 3, messages  # and "Repository initialized"
    assert messages[0].startswith("shardfs: ") and messages[1] == "made by the test"


def test_tensorstore_writes_through_a_branch_mount(repo):
    with repo.mount(message="tensorstore wrote this") as mnt:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{mnt}/a/"}}
        array = ts.open(spec, open=True).result()
        array[4:8, 0:4].write(np.full((4, 4), -5, dtype="i4")).result()
    expected = np.arange(64).reshape(8, 8)
    expected[4:8, 0:4] = -5
    np.testing.assert_array_equal(repo.group()["a"][:], expected)
    assert repo.messages()[0] == "tensorstore wrote this"


def test_cp_of_a_zarr_array_into_a_branch_makes_it_a_node(repo, tmp_path):
    plain = tmp_path / "plain.zarr"
    source = zarr.create_array(str(plain), shape=(10, 6), chunks=(4, 4), dtype="u2", fill_value=7)
    source[:] = np.arange(60, dtype="u2").reshape(10, 6)
    with repo.mount() as mnt:
        subprocess.run(["cp", "-r", str(plain), f"{mnt}/copied"], check=True)
        assert Path(mnt, "copied/zarr.json").read_bytes() == (plain / "zarr.json").read_bytes()
    np.testing.assert_array_equal(repo.group()["copied"][:], source[:])


def test_a_sharded_array_written_inner_chunk_by_inner_chunk_stays_sharded(repo):
    with repo.mount() as mnt:
        inner = zarr.open_array(f"{mnt}/sh", mode="r+")
        assert inner.chunks == (2, 2) and inner.shards is None  # the view shows it unsharded
        for i in range(4):
            for j in range(4):
                inner[2 * i:2 * i + 2, 2 * j:2 * j + 2] = 10 * i + j
        # A chunk file deleted becomes a deleted inner chunk: the fill value.
        os.unlink(f"{mnt}/sh/c/3/3")
    got = repo.group()["sh"]
    assert got.shards == (4, 4) and got.chunks == (2, 2)
    expected = np.repeat(np.repeat(10 * np.arange(4)[:, None] + np.arange(4)[None, :], 2, 0), 2, 1)
    expected[6:8, 6:8] = 0
    np.testing.assert_array_equal(got[:], expected)


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_fsync_commits_and_a_rebase_keeps_the_other_writers_commit(repo):
    with repo.mount(commit_idle_ms=60000) as mnt:
        array = zarr.open_array(f"{mnt}/a", mode="r+")
        array[0:4, 0:4] = -1  # chunk (0, 0), by the mount alone
        array[4:8, 4:8] = -2  # chunk (1, 1), by both: the mount's write is the later one
        library_commit(repo, lambda g: g["a"].__setitem__((slice(0, 4), slice(4, 8)), 55))
        library_commit(repo, lambda g: g["a"].__setitem__((slice(4, 8), slice(4, 8)), 66))
        # fsync of one file commits everything the mount holds.
        fsync(f"{mnt}/a/c/0/0")
        expected = np.arange(64).reshape(8, 8)
        expected[0:4, 0:4], expected[0:4, 4:8], expected[4:8, 4:8] = -1, 55, -2
        np.testing.assert_array_equal(repo.group()["a"][:], expected)
        assert repo.messages()[1:3] == ["from the library", "from the library"]
        # The mount shows what the branch holds now, the other writer's chunk too.
        np.testing.assert_array_equal(zarr.open_array(f"{mnt}/a", mode="r")[:], expected)


def test_a_change_that_cannot_be_rebased_fails_fsync_with_eio_and_commits_nothing(repo):
    with repo.mount(commit_idle_ms=60000) as mnt:
        zarr.open_array(f"{mnt}/a", mode="r+")[0:4, 0:4] = -1
        tip = library_commit(repo, lambda g: g.__delitem__("a"), message="deleted a")
        with pytest.raises(OSError) as failed:
            fsync(f"{mnt}/zarr.json")
        assert failed.value.errno == errno.EIO
        assert repo.tip() == tip
        assert "a" not in repo.group()
        # What cannot be committed is dropped, not kept to fail every later sync: the mount goes on.
        zarr.open_array(f"{mnt}/sh", mode="r+")[0:2, 0:2] = 5
    assert (repo.group()["sh"][0:2, 0:2] == 5).all() and "a" not in repo.group()


def test_kill_9_before_a_commit_leaves_the_branch_where_it_was(repo, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    base = repo.tip()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in repo.options.items()]
    subprocess.run([shardfs.binary(), "mount", repo.address, str(mnt), "--commit-idle-ms", "600000", *flags],
                   check=True)
    try:
        zarr.open_array(mnt / "a", mode="r+")[:] = 9
        zarr.open_array(mnt / "sh", mode="r+")[:] = 9
        os.kill(daemon_pid(mnt), signal.SIGKILL)
    finally:
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    assert repo.tip() == base
    np.testing.assert_array_equal(repo.group()["a"][:], np.arange(64).reshape(8, 8))
    np.testing.assert_array_equal(repo.group()["sh"][:], np.ones((8, 8)))


def test_a_tag_mount_refuses_writes(repo):
    repo.open().create_tag("v1", repo.tip())
    with repo.mount(tag="v1") as mnt:
        with pytest.raises(OSError) as refused:
            Path(mnt, "a/c/0/0").write_bytes(b"x")
        assert refused.value.errno == errno.EROFS
        with pytest.raises(OSError) as refused:
            Path(mnt, "new").mkdir()
        assert refused.value.errno == errno.EROFS


def wait_for(condition, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.1)


def test_commit_idle_commits_and_the_mount_follows_the_branch(repo):
    base = repo.tip()
    with repo.mount(commit_idle_ms=200) as mnt:
        zarr.open_array(f"{mnt}/a", mode="r+")[0:4, 0:4] = 3
        wait_for(lambda: repo.tip() != base, "a commit after the last write")
        assert (repo.group()["a"][0:4, 0:4] == 3).all()
        # With nothing uncommitted the mount shows what another writer commits.
        library_commit(repo, lambda g: g["a"].__setitem__((slice(4, 8), slice(0, 4)), 44))
        wait_for(lambda: (zarr.open_array(f"{mnt}/a", mode="r")[4:8, 0:4] == 44).all(),
                 "the other writer's commit shown")


def test_a_plain_file_no_commit_can_hold_fails_the_sync_with_eio(repo):
    with repo.mount(commit_idle_ms=60000) as mnt:
        Path(mnt, "notes.txt").write_text("not Zarr")
        zarr.open_array(f"{mnt}/a", mode="r+")[0:4, 0:4] = 1
        with pytest.raises(OSError) as failed:
            fsync(mnt)
        assert failed.value.errno == errno.EIO
        os.unlink(f"{mnt}/notes.txt")
        fsync(mnt)
        assert (repo.group()["a"][0:4, 0:4] == 1).all()


@pytest.mark.parametrize("shards", [None, (16, 16)], ids=["chunks", "shards"])
def test_two_mounts_on_one_branch_writing_disjoint_chunks_lose_nothing(s3s, tmp_path, mounts, shards):
    """Two mounts write alternate chunks, each fsyncing as it goes: with shards, every shard is
    written by both, and each commit is merged inner chunk by inner chunk with the other's."""
    prefix = tmp_path.name
    repo = Repo(f"s3://{BUCKET}/{prefix}", lambda: ic.s3_storage(
        bucket=BUCKET, prefix=prefix, endpoint_url=s3s.endpoint, allow_http=True, region="us-east-1",
        access_key_id="test", secret_access_key="test", force_path_style=True), {"endpoint_url": s3s.endpoint},
        Path(s3s.data, "objects", BUCKET, prefix), mounts)
    session = ic.Repository.create(repo.storage()).writable_session("main")
    zarr.group(store=session.store).create_array("big", shape=(32, 32), chunks=(4, 4), shards=shards, dtype="i4",
                                                  fill_value=-1)
    session.commit("empty")
    with repo.mount(commit_idle_ms=300) as one, repo.mount(commit_idle_ms=300) as two:
        arrays = [zarr.open_array(f"{mnt}/big", mode="r+") for mnt in (one, two)]
        for i in range(8):
            for j in range(8):
                arrays[(i + j) % 2][4 * i:4 * i + 4, 4 * j:4 * j + 4] = 100 * i + j
            fsync(f"{(one, two)[i % 2]}/big/zarr.json")
    expected = np.repeat(np.repeat(100 * np.arange(8)[:, None] + np.arange(8)[None, :], 4, 0), 4, 1)
    np.testing.assert_array_equal(repo.group()["big"][:], expected)
    assert repo.group()["big"].shards == shards


def test_a_rebase_merges_the_inner_chunks_of_a_shard_both_wrote(repo):
    """The mount stores shard (0, 0) with its inner chunk (0, 0) written (after --commit-idle-ms)
    and, before it commits (another --commit-idle-ms, 5 s, later), the library commits inner chunk (1, 1)
    of that shard: the mount's commit merges the two shards, keeping both inner chunks. (Random
    values, so that shards are chunk objects, not inline in a manifest.)"""
    rng = np.random.default_rng(1)
    first, ours, theirs = (rng.integers(0, 2**31, (16, 16), dtype="i4") for _ in range(3))
    library_commit(repo, lambda g: g.create_array("r", shape=(32, 32), chunks=(16, 16), shards=(32, 32),
                                                  dtype="i4").__setitem__(Ellipsis, np.tile(first, (2, 2))))
    with repo.mount(commit_idle_ms=5000) as mnt:
        base, stored = repo.tip(), repo.chunk_objects()
        zarr.open_array(f"{mnt}/r", mode="r+")[0:16, 0:16] = ours
        wait_for(lambda: repo.chunk_objects() > stored, "the shard stored")
        library_commit(repo, lambda g: g["r"].__setitem__((slice(16, 32), slice(16, 32)), theirs))
        # On a slow machine the mount may commit first, and the library's commit then holds both.
        wait_for(lambda: any(m.startswith("shardfs: ") for m in repo.messages()), "the mount's commit")
        expected = np.tile(first, (2, 2))
        expected[0:16, 0:16], expected[16:32, 16:32] = ours, theirs
        np.testing.assert_array_equal(repo.group()["r"][:], expected)
        assert repo.tip() != base
        np.testing.assert_array_equal(zarr.open_array(f"{mnt}/r", mode="r")[:], expected)


def test_a_spec_1_repository_stays_spec_1_and_its_virtual_chunks_stay_virtual(tmp_path, mounts):
    """A repository of Icechunk's first spec (refs/, no `repo` file) with a virtual chunk: written
    through a mount, it keeps its spec, and the chunk not written stays the virtual reference."""
    raw = np.arange(16, dtype="<i4")
    (tmp_path / "raw.bin").write_bytes(raw.tobytes())
    prefix = f"file://{tmp_path}/"
    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, ic.local_filesystem_store(str(tmp_path))))
    path = str(tmp_path / "repo")
    credentials = ic.containers_credentials({prefix: None})
    repository = ic.Repository.create(ic.local_filesystem_storage(path), config=config, spec_version=1,
                                      authorize_virtual_chunk_access=credentials)
    session = repository.writable_session("main")
    zarr.group(store=session.store).create_array("v", shape=(32,), chunks=(16,), dtype="<i4", compressors=None,
                                                 filters=None, fill_value=0)
    session.store.set_virtual_refs("v", [ic.VirtualChunkSpec(index=[0], location=f"{prefix}raw.bin", offset=0,
                                                             length=64)])
    session.commit("virtual")
    with shardfs.mount(path, tempfile.mkdtemp(dir=mounts), allow_virtual=prefix) as mnt:
        zarr.open_array(f"{mnt}/v", mode="r+")[16:32] = -7
    assert (Path(path) / "refs").is_dir() and not (Path(path) / "repo").exists()
    reopened = ic.Repository.open(ic.local_filesystem_storage(path), authorize_virtual_chunk_access=credentials)
    session = reopened.readonly_session("main")
    np.testing.assert_array_equal(zarr.open_array(session.store, path="v", mode="r")[:],
                                  np.concatenate([raw, np.full(16, -7, dtype="<i4")]))
    assert session.all_virtual_chunk_locations() == [f"{prefix}raw.bin"]
