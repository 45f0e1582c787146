"""Icechunk repositories mounted as plain Zarr, with the field's own writer and reader: the Python
``icechunk`` package writes repositories (spec v1 and v2, local and in a local S3 server: two
commits, a tag, a branch, native, inline and virtual chunks, a sharded array), and zarr-python reads
every version through the mount exactly as Icechunk's own session reads it. Virtual chunks read
only where authorized and while their file is the version recorded; damaged repository files
fail the paths concerned and nothing else.
"""

import datetime
import errno
import hashlib
import os
import shutil
from pathlib import Path

import icechunk as ic
import numpy as np
import obstore
import pytest
import zarr
from obstore.store import S3Store

from conftest import read_errno
from shardfs import MountError

ARRAYS = ("grp/big", "small", "sharded", "virt")


def build(storage, virtual_dir: Path, spec_version: int):
    """A repository with two commits on main (the first tagged), a branch from the first, and
    native, inline, virtual and sharded arrays. Returns it and the first snapshot's ID."""
    prefix = f"file://{virtual_dir}/"
    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, ic.local_filesystem_store(str(virtual_dir))))
    repo = ic.Repository.create(storage, config=config, spec_version=spec_version,
                                authorize_virtual_chunk_access={prefix: None})
    session = repo.writable_session("main")
    root = zarr.group(store=session.store, attributes={"title": "shardfs icechunk test"})
    big = root.create_array("grp/big", shape=(100, 100), chunks=(10, 10), dtype="f8")
    # Random values compress too little to be inlined: native chunk objects.
    big[:] = np.random.default_rng(0).random((100, 100))
    # Small enough to be held inline in the manifest.
    root.create_array("small", shape=(4,), chunks=(4,), dtype="i2")[:] = [1, 2, 3, 4]
    root.create_array("sharded", shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="u1")[:] = (
        np.arange(64 * 64) % 251).reshape(64, 64)
    root.create_array("virt", shape=(100,), chunks=(25,), dtype="<i4", compressors=None, filters=None)
    raw = virtual_dir / "raw.bin"
    # Chunk 1 records when its file was last modified (Icechunk's own reader refuses an ETag
    # recorded for a local file, whatever it is), chunks 0 and 2 nothing.
    recorded = datetime.datetime.fromtimestamp(raw.stat().st_mtime + 1, tz=datetime.timezone.utc)
    specs = [ic.VirtualChunkSpec(index=[0], location=f"{prefix}raw.bin", offset=0, length=100),
             ic.VirtualChunkSpec(index=[1], location=f"{prefix}raw.bin", offset=100, length=100,
                                 last_updated_at_checksum=recorded),
             ic.VirtualChunkSpec(index=[2], location=f"{prefix}raw.bin", offset=200, length=100)]
    session.store.set_virtual_refs("virt", specs)
    first = session.commit("first")
    repo.create_tag("v1.0", first)
    session = repo.writable_session("main")
    zarr.open_array(session.store, path="small")[0] = 42
    zarr.open_array(session.store, path="grp/big")[0, :] = -1
    session.commit("second")
    repo.create_branch("dev", first)
    session = repo.writable_session("dev")
    zarr.open_array(session.store, path="small")[1] = 7
    session.commit("on dev")
    return repo, first


@pytest.fixture(scope="session")
def virtual_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("virtual")
    np.arange(100, dtype="<i4").tofile(directory / "raw.bin")
    return directory


@pytest.fixture(scope="session", params=[1, 2], ids=["spec1", "spec2"])
def local_repo(request, tmp_path_factory, virtual_dir):
    path = tmp_path_factory.mktemp(f"repo-v{request.param}")
    repo, first = build(ic.local_filesystem_storage(str(path)), virtual_dir, request.param)
    return path, repo, first


def versions(first):
    """Each version as shardfs options and as Icechunk's session arguments."""
    return [({}, {"branch": "main"}), ({"tag": "v1.0"}, {"tag": "v1.0"}), ({"branch": "dev"}, {"branch": "dev"}),
            ({"snapshot": first}, {"snapshot_id": first})]


def icechunk_reads(repo, version, virtual_dir):
    group = zarr.open_group(repo.readonly_session(**version).store, mode="r")
    return {name: group[name][...] for name in ARRAYS}, dict(group.attrs)


def assert_version_reads_alike(view, repo, version, virtual_dir, zarr_format=3, arrays=ARRAYS):
    expected, attrs = icechunk_reads(repo, version, virtual_dir)
    group = zarr.open_group(view, mode="r", zarr_format=zarr_format)
    assert dict(group.attrs) == attrs
    for name in arrays:
        got = group[name][...]
        assert got.dtype == expected[name].dtype, name
        np.testing.assert_array_equal(got, expected[name], err_msg=f"{name} at {version}")


def test_every_version_reads_as_icechunk_reads_it(local_repo, virtual_dir, shardfs_mount):
    path, repo, first = local_repo
    for options, version in versions(first):
        view = shardfs_mount(path, allow_virtual=f"file://{virtual_dir}/", **options)
        assert_version_reads_alike(view, repo, version, virtual_dir)
        # The sharded array is shown unsharded: one file per inner chunk.
        assert len(list((Path(view) / "sharded/c").rglob("*/*"))) == 64
    # The versions differ where the commits did.
    main, tag = (zarr.open_array(shardfs_mount(path, **o) + "/small", mode="r")[...] for o in [{}, {"tag": "v1.0"}])
    assert main[0] == 42 and tag[0] == 1


def test_the_v2_view_of_a_repository(local_repo, virtual_dir, shardfs_mount):
    path, repo, first = local_repo
    view = shardfs_mount(path, zarr_format=2, allow_virtual=f"file://{virtual_dir}/")
    assert_version_reads_alike(view, repo, {"branch": "main"}, virtual_dir, zarr_format=2,
                               arrays=("grp/big", "small", "virt"))


def test_info_lists_branches_and_tags(local_repo):
    import subprocess
    path, repo, first = local_repo
    listed = subprocess.run(["shardfs", "info", str(path)], capture_output=True, text=True, check=True).stdout
    assert f"tag v1.0 {first}" in listed
    assert f"branch main {repo.lookup_branch('main')}" in listed
    assert f"branch dev {repo.lookup_branch('dev')}" in listed


def test_virtual_chunks_read_only_where_authorized_and_unchanged(local_repo, virtual_dir, shardfs_mount):
    path, repo, _ = local_repo
    view = Path(shardfs_mount(path))
    assert read_errno(view / "virt/c/0") == errno.EIO
    assert read_errno(view / "small/c/0") is None
    view = Path(shardfs_mount(path, allow_virtual="file:///elsewhere/"))
    assert read_errno(view / "virt/c/0") == errno.EIO
    view = Path(shardfs_mount(path, allow_virtual=f"file://{virtual_dir}/"))
    assert (view / "virt/c/1").read_bytes() == np.arange(25, 50, dtype="<i4").tobytes()
    raw = virtual_dir / "raw.bin"
    stat = raw.stat()
    try:
        os.utime(raw, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 * 10**9))
        view = Path(shardfs_mount(path, allow_virtual=f"file://{virtual_dir}/"))
        # Chunk 1 recorded its file's modification time, which is later now; chunk 0 nothing.
        assert read_errno(view / "virt/c/1") == errno.EIO
        assert read_errno(view / "virt/c/0") is None
        with pytest.raises(Exception):
            icechunk_reads(repo, {"branch": "main"}, virtual_dir)
    finally:
        os.utime(raw, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_damaged_repository_files_fail_the_paths_concerned(local_repo, virtual_dir, shardfs_mount, tmp_path):
    path, repo, first = local_repo
    copy = tmp_path / "repo"
    shutil.copytree(path, copy)
    # A truncated snapshot: that version cannot be mounted, in one line naming its file.
    (copy / "snapshots" / first).write_bytes((copy / "snapshots" / first).read_bytes()[:60])
    with pytest.raises(MountError, match=f"snapshots/{first}"):
        shardfs_mount(copy, tag="v1.0")
    # A damaged manifest: the chunks it holds read EIO, and only those.
    view = Path(shardfs_mount(copy, allow_virtual=f"file://{virtual_dir}/"))
    expected, _ = icechunk_reads(repo, {"branch": "main"}, virtual_dir)
    small_chunk = (view / "small/c/0").read_bytes()
    manifests = sorted((copy / "manifests").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    for manifest in manifests:
        manifest.write_bytes(manifest.read_bytes()[:50] + b"\0" * 10)
    view = Path(shardfs_mount(copy, allow_virtual=f"file://{virtual_dir}/"))
    assert read_errno(view / "grp/big/c/0/0") == errno.EIO
    assert (view / "zarr.json").read_bytes()
    assert zarr.open_group(view, mode="r").attrs["title"] == "shardfs icechunk test"
    assert small_chunk  # read before the damage
    # A native chunk object that is gone reads EIO, never as fill value.
    shutil.rmtree(copy)
    shutil.copytree(path, copy)
    for chunk in (copy / "chunks").iterdir():
        chunk.unlink()
    view = Path(shardfs_mount(copy, allow_virtual=f"file://{virtual_dir}/"))
    assert read_errno(view / "grp/big/c/5/5") == errno.EIO
    with pytest.raises(OSError):
        zarr.open_array(view / "grp/big", mode="r")[...]
    np.testing.assert_array_equal(zarr.open_array(view / "virt", mode="r")[...], expected["virt"])
    # A version that is not there is refused in one line.
    with pytest.raises(MountError, match="no tag nope"):
        shardfs_mount(copy, tag="nope")


def test_a_repository_in_a_bucket(s3_server, virtual_dir, shardfs_mount):
    s3_server.put("icechunk")
    for spec in (1, 2):
        storage = ic.s3_storage(bucket="icechunk", prefix=f"repo{spec}", endpoint_url=s3_server.endpoint,
                                allow_http=True, region="us-east-1", access_key_id="test",
                                secret_access_key="test", force_path_style=True)
        repo, first = build(storage, virtual_dir, spec)
        for options, version in versions(first):
            view = shardfs_mount(f"s3://icechunk/repo{spec}", endpoint_url=s3_server.endpoint,
                                 allow_virtual=f"file://{virtual_dir}/", **options)
            assert_version_reads_alike(view, repo, version, virtual_dir)


def test_virtual_chunks_in_a_bucket_are_read_while_their_etag_stands(s3_server, shardfs_mount, tmp_path):
    """Virtual chunks in S3 objects, recorded with the objects' ETags: read exactly while the
    objects stand; once one is rewritten, its chunk reads EIO, as Icechunk's reader refuses it."""
    s3_server.put("virtual")
    raw = np.arange(50, dtype="<i4").tobytes()
    s3_server.put("virtual/raw.bin", raw)
    # A single PUT's ETag on S3 (and moto) is the MD5 of the bytes.
    etag = f'"{hashlib.md5(raw).hexdigest()}"'
    prefix = "s3://virtual/"
    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, ic.s3_store(
        endpoint_url=s3_server.endpoint, allow_http=True, region="us-east-1", s3_compatible=True,
        force_path_style=True)))
    credentials = ic.s3_credentials(access_key_id="test", secret_access_key="test")
    repo = ic.Repository.create(ic.local_filesystem_storage(str(tmp_path / "repo")), config=config,
                                authorize_virtual_chunk_access=ic.containers_credentials({prefix: credentials}))
    session = repo.writable_session("main")
    zarr.group(store=session.store).create_array("virt", shape=(50,), chunks=(25,), dtype="<i4",
                                                  compressors=None, filters=None)
    session.store.set_virtual_refs("virt", [
        ic.VirtualChunkSpec(index=[i], location=f"{prefix}raw.bin", offset=100 * i, length=100, etag_checksum=etag)
        for i in range(2)])
    session.commit("virtual")
    view = Path(shardfs_mount(tmp_path / "repo", endpoint_url=s3_server.endpoint, allow_virtual=prefix))
    expected = zarr.open_array(repo.readonly_session("main").store, path="virt", mode="r")[...]
    np.testing.assert_array_equal(zarr.open_array(view / "virt", mode="r")[...], expected)
    np.testing.assert_array_equal(expected, np.arange(50))
    # The object rewritten (signed: moto refuses an anonymous overwrite), so its ETag changed:
    # refused by both readers.
    bucket = S3Store("virtual", endpoint=s3_server.endpoint, region="us-east-1", access_key_id="test",
                     secret_access_key="test", client_options={"allow_http": True})
    obstore.put(bucket, "raw.bin", np.arange(1, 51, dtype="<i4").tobytes())
    view = Path(shardfs_mount(tmp_path / "repo", endpoint_url=s3_server.endpoint, allow_virtual=prefix))
    assert read_errno(view / "virt/c/0") == errno.EIO
    with pytest.raises(Exception):
        zarr.open_array(repo.readonly_session("main").store, path="virt", mode="r")[...]
