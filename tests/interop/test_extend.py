"""Shard commits by server-side copy (src/write/extend.rs, src/store/bucket/multipart/extend.rs,
src/store/bucket/azure_blocks.rs), against s3s-fs (patched as S3 behaves: scripts/s3s_fs.sh) and
Azurite (patched with Put Block From URL: scripts/azurite.patch), mounted as a user would:

- the S3 server itself: a part copied only from the version `x-amz-copy-source-if-match` names,
  a completion over another version refused, a part below 5 MiB anywhere but last refused; a
  HEAD or a listing racing PUTs gives one version's size and ETag;
- a commit into a shard of 5 MiB or more stores a multipart version whose first bytes are the old
  version's, copied: only the new chunks crossed the network; every version read back with
  zarr-python and with a reader that knows nothing of shardfs (the index decoded here);
- a shard below 5 MiB is rewritten whole; chunks rewritten again and again are rewritten whole
  once more than half of the shard would be unused;
- the version being copied replaced meanwhile (the copy stalled by scripts/fault_proxy.py while
  zarr-python writes the shard directly): the commit reads the shard again and loses nothing;
- a ranged GET of a replaced version answered 416 (a server that decides Range before If-Match):
  the version is read again, the writer's fsync succeeds;
- eight daemons writing an eighth of every shard of 128 KiB chunks at once: no error at any
  writer or unmount, nothing lost;
- on Azure: the server copies into a block only the range and the version named, and refuses a
  block list over another version; a commit into a shard of 5 MiB or more stores a version of two
  blocks, the old bytes copied and the new ones sent (counted by `--metrics-address`: only the new
  chunks and the index crossed the network), read back with zarr-python; eight daemons extending
  the same two 6 MiB shards at once meet no error and lose nothing; the version being copied
  replaced meanwhile, the commit reads the shard again and loses nothing.

Runs in ``target/venv``; one case: ``target/venv/bin/python -m pytest tests/interop/test_extend.py -k 416``.
"""

import base64
import concurrent.futures
import datetime
import hashlib
import os
import struct
import threading
import time
import urllib.request

import boto3
import botocore.exceptions
import numpy as np
import obstore
import pytest
import shardfs
import zarr
from prometheus_client.parser import text_string_to_metric_families

from object_stores import BUCKET, Azure, S3sFs, serving, url, zarr_store
from ports import free_port
from proxies import FaultProxy

CHUNK = 256
SIDE = 8  # chunks along each side of a shard: 64 chunks of 128 KiB (uint16), 8 MiB a shard
INDEX = SIDE * SIDE * 16 + 4  # the shard index: (offset, nbytes) per chunk, and its CRC32C
PART = 5 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    server = S3sFs()
    with serving(server, tmp_path_factory.mktemp("s3s-env")):
        yield server


def client(service):
    return boto3.client("s3", endpoint_url=service.endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


def make_array(service, prefix, shards=(1, 1)):
    shape = (SIDE * CHUNK * shards[0], SIDE * CHUNK * shards[1])
    return zarr.create_array(store=zarr_store(service, prefix), shape=shape, chunks=(CHUNK, CHUNK),
                             shards=(SIDE * CHUNK, SIDE * CHUNK), dtype="uint16", compressors=None, fill_value=0)


def tile(seed):
    return np.random.default_rng(seed).integers(0, 65535, (CHUNK, CHUNK), dtype=np.uint16)


def write_chunks(mnt, tiles, sync=True):
    """Writes each chunk of `tiles` ((i, j) -> array) as a chunk file of the mount; fsyncs the last."""
    items = list(tiles.items())
    for n, ((i, j), data) in enumerate(items):
        os.makedirs(os.path.join(mnt, "c", str(i)), exist_ok=True)
        with open(os.path.join(mnt, "c", str(i), str(j)), "wb") as f:
            f.write(data.astype("<u2").tobytes())
            if sync and n == len(items) - 1:
                f.flush()
                os.fsync(f.fileno())


def shard_bytes(service, prefix, key="c/0/0"):
    return bytes(obstore.get(service.objects(), f"{prefix}/{key}").bytes())


def e_tag(service, prefix, key="c/0/0"):
    return obstore.head(service.objects(), f"{prefix}/{key}")["e_tag"]


def decoded(shard):
    """The chunks of a shard as a reader that knows nothing of shardfs reads them: the index at the
    end, (offset, nbytes) little-endian per chunk, all ones for none."""
    index = shard[-INDEX:-4]
    chunks = {}
    for n in range(SIDE * SIDE):
        offset, nbytes = struct.unpack_from("<QQ", index, n * 16)
        if offset != 2**64 - 1:
            assert offset + nbytes <= len(shard) - INDEX
            chunks[divmod(n, SIDE)] = np.frombuffer(shard[offset:offset + nbytes], "<u2").reshape(CHUNK, CHUNK)
    return chunks


def check(service, prefix, expected, key="c/0/0", origin=(0, 0)):
    """The shard at `key` holds exactly `expected` ((i, j) within the shard -> tile), read both ways."""
    got = decoded(shard_bytes(service, prefix, key))
    assert sorted(got) == sorted(expected)
    for k, data in expected.items():
        assert np.array_equal(got[k], data), k
    array = zarr.open_array(zarr_store(service, prefix), mode="r")
    for (i, j), data in expected.items():
        y, x = (origin[0] + i) * CHUNK, (origin[1] + j) * CHUNK
        assert np.array_equal(array[y:y + CHUNK, x:x + CHUNK], data), (i, j)


def test_the_s3_server_copies_only_the_version_named_and_refuses_small_middle_parts(service):
    s3 = client(service)
    old = os.urandom(PART + 1000)
    tag = s3.put_object(Bucket=BUCKET, Key="copy", Body=old)["ETag"]
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="copy")["UploadId"]
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed|412"):
        s3.upload_part_copy(Bucket=BUCKET, Key="copy", UploadId=upload, PartNumber=1,
                            CopySource={"Bucket": BUCKET, "Key": "copy"}, CopySourceRange=f"bytes=0-{PART}",
                            CopySourceIfMatch='"0123456789abcdef0123456789abcdef"')
    first = s3.upload_part_copy(Bucket=BUCKET, Key="copy", UploadId=upload, PartNumber=1,
                                CopySource={"Bucket": BUCKET, "Key": "copy"}, CopySourceRange=f"bytes=0-{PART}",
                                CopySourceIfMatch=tag)["CopyPartResult"]["ETag"]
    second = s3.upload_part(Bucket=BUCKET, Key="copy", UploadId=upload, PartNumber=2, Body=b"tail")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 2, "ETag": second}]}
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed|412"):
        s3.complete_multipart_upload(Bucket=BUCKET, Key="copy", UploadId=upload, MultipartUpload=parts,
                                     IfMatch='"0123456789abcdef0123456789abcdef"')
    s3.complete_multipart_upload(Bucket=BUCKET, Key="copy", UploadId=upload, MultipartUpload=parts, IfMatch=tag)
    assert s3.get_object(Bucket=BUCKET, Key="copy")["Body"].read() == old[:PART + 1] + b"tail"
    small = s3.create_multipart_upload(Bucket=BUCKET, Key="small")["UploadId"]
    tags = [s3.upload_part(Bucket=BUCKET, Key="small", UploadId=small, PartNumber=n, Body=b"x")["ETag"] for n in (1, 2)]
    with pytest.raises(botocore.exceptions.ClientError, match="EntityTooSmall"):
        s3.complete_multipart_upload(Bucket=BUCKET, Key="small", UploadId=small, MultipartUpload={
            "Parts": [{"PartNumber": n, "ETag": t} for n, t in zip((1, 2), tags)]})


def test_the_s3_server_heads_and_lists_one_versions_size_and_etag(service):
    """One thread PUTs two bodies of different sizes in turn at one key while others HEAD it and
    list it, for 3 s: every answer pairs one version's size with that version's ETag. Unpatched,
    s3s-fs read them apart, and a reader took the wrong bytes for a version's index."""
    s3 = client(service)
    bodies = [os.urandom(100_000), os.urandom(300_000)]
    versions = {(len(b), f'"{hashlib.md5(b).hexdigest()}"') for b in bodies}
    s3.put_object(Bucket=BUCKET, Key="sized", Body=bodies[0])
    stop, seen, wrong = time.monotonic() + 3, [0], []

    def write():
        n = 0
        while time.monotonic() < stop:
            n += 1
            s3.put_object(Bucket=BUCKET, Key="sized", Body=bodies[n % 2])

    def look(listing):
        while time.monotonic() < stop:
            if listing:
                found = s3.list_objects_v2(Bucket=BUCKET, Prefix="sized")["Contents"][0]
                pair = (found["Size"], found["ETag"])
            else:
                head = s3.head_object(Bucket=BUCKET, Key="sized")
                pair = (head["ContentLength"], head["ETag"])
            seen[0] += 1
            if pair not in versions:
                wrong.append(pair)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=look, args=(n % 2,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] > 100 and not wrong, f"{len(wrong)} of {seen[0]} answers paired two versions: {wrong[:2]}"


def test_a_commit_into_a_big_shard_copies_the_old_bytes_and_sends_only_its_new_chunks(service, tmp_path):
    make_array(service, "big")
    tiles = {(i, j): tile(i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    first = {k: v for k, v in tiles.items() if k[0] < 5}
    (tmp_path / "m").mkdir()
    with shardfs.mount(url(service, "big"), tmp_path / "m", endpoint_url=service.endpoint,
                       log_file=tmp_path / "m.log") as mnt:
        # Below 5 MiB each commit writes the shard whole; from 5 MiB on it extends it.
        write_chunks(mnt, {k: v for k, v in first.items() if k[0] < 2})
        small = shard_bytes(service, "big")
        assert len(small) < PART and "-" not in e_tag(service, "big")
        write_chunks(mnt, {k: v for k, v in first.items() if k[0] >= 2})
        before = shard_bytes(service, "big")
        assert len(before) >= PART
        check(service, "big", first)
        write_chunks(mnt, {k: v for k, v in tiles.items() if k[0] >= 5})
        after = shard_bytes(service, "big")
        # A version of two parts (S3's ETag says how many): the old chunk bytes copied, untouched.
        assert e_tag(service, "big").strip('"').endswith("-2")
        kept = len(before) - INDEX
        assert after[:kept] == before[:kept]
        assert len(after) == kept + 3 * SIDE * CHUNK * CHUNK * 2 + 16 + INDEX  # 16: the nonce
        check(service, "big", tiles)
    check(service, "big", tiles)


def test_chunks_rewritten_again_and_again_are_compacted_once_half_the_shard_would_be_unused(service, tmp_path):
    make_array(service, "again")
    tiles = {(i, j): tile(1000 + i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    sizes = []
    (tmp_path / "m").mkdir()
    with shardfs.mount(url(service, "again"), tmp_path / "m", endpoint_url=service.endpoint,
                       log_file=tmp_path / "m.log") as mnt:
        write_chunks(mnt, tiles)
        live = len(shard_bytes(service, "again"))
        for n in range(10):
            tiles.update({(0, j): tile(5000 + n * SIDE + j) for j in range(SIDE)})
            write_chunks(mnt, {(0, j): tiles[0, j] for j in range(SIDE)})
            sizes.append(len(shard_bytes(service, "again")))
            check(service, "again", tiles)
    extended = [s for s in sizes if s > live]
    assert extended, f"never extended: {sizes} (live {live})"
    assert max(sizes) <= 2 * live, f"more than half unused: {sizes} (live {live})"
    assert live in sizes, f"never rewritten whole: {sizes} (live {live})"


def test_a_copy_whose_version_was_replaced_meanwhile_is_read_again_and_loses_nothing(service, tmp_path):
    array = make_array(service, "raced")
    tiles = {(i, j): tile(2000 + i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    array[:6 * CHUNK, :] = np.vstack([np.hstack([tiles[i, j] for j in range(SIDE)]) for i in range(6)])
    proxy = FaultProxy(service.endpoint)
    (tmp_path / "m").mkdir()
    try:
        with shardfs.mount(url(service, "raced"), tmp_path / "m", endpoint_url=proxy.endpoint,
                           log_file=tmp_path / "m.log", verbose=True) as mnt:
            # The copy of the version read waits while zarr-python replaces the shard directly.
            proxy.control([{"method": "PUT", "query": "partNumber=1&", "fault": "stall", "seconds": 3, "times": 1}])
            committing = threading.Thread(target=write_chunks, args=(mnt, {(6, j): tiles[6, j] for j in range(SIDE)}))
            committing.start()
            proxy.wait_applied(0)
            direct = tile(3000)
            array[7 * CHUNK:8 * CHUNK, 0:CHUNK] = direct
            committing.join(timeout=60)
            assert not committing.is_alive()
            assert proxy.control()["applied"] == [1]
        expected = {k: v for k, v in tiles.items() if k[0] < 7}
        expected[7, 0] = direct
        check(service, "raced", expected)
    finally:
        proxy.stop()


def test_a_ranged_get_answered_416_reads_the_shard_again(service, tmp_path):
    make_array(service, "range")
    tiles = {(i, j): tile(4000 + i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    proxy = FaultProxy(service.endpoint)
    (tmp_path / "m").mkdir()
    try:
        with shardfs.mount(url(service, "range"), tmp_path / "m", endpoint_url=proxy.endpoint,
                           log_file=tmp_path / "m.log") as mnt:
            write_chunks(mnt, {k: v for k, v in tiles.items() if k[0] < 6})
            proxy.control([{"method": "GET", "key": r"/range/c/0/0$", "range": True, "fault": "status",
                            "status": 416, "times": 2}])
            write_chunks(mnt, {k: v for k, v in tiles.items() if k[0] >= 6})
            assert proxy.control()["applied"][0] >= 1
    finally:
        proxy.stop()
    check(service, "range", tiles)


def test_eight_daemons_writing_an_eighth_of_every_shard_meet_no_error(service, tmp_path):
    shards = (1, 2)
    make_array(service, "eighths", shards)
    tiles = {(i, j): tile(6000 + i * 64 + j) for i in range(SIDE) for j in range(SIDE * shards[1])}
    writers = 8
    ready = threading.Barrier(writers)

    def machine(writer):
        mnt = tmp_path / f"m{writer}"
        mnt.mkdir()
        with shardfs.mount(url(service, "eighths"), mnt, endpoint_url=service.endpoint,
                           log_file=tmp_path / f"m{writer}.log") as view:
            ready.wait(timeout=120)
            # Row `writer` of every shard: each shard is written by all eight at once.
            write_chunks(view, {(i, j): t for (i, j), t in tiles.items() if i == writer})

    with concurrent.futures.ThreadPoolExecutor(writers) as pool:
        for done in [pool.submit(machine, w) for w in range(writers)]:
            done.result(timeout=300)
    for s in range(shards[1]):
        check(service, "eighths", {(i, j - s * SIDE): t for (i, j), t in tiles.items() if j // SIDE == s},
              key=f"c/0/{s}", origin=(0, s * SIDE))
    left = [m["path"] for batch in obstore.list(service.objects(), prefix="eighths/__shardfs/") for m in batch]
    assert [k for k in left if "/delta-" in k or k.endswith("/lease")] == []
    for n in range(writers):
        log = (tmp_path / f"m{n}.log").read_text()
        assert "ERROR" not in log, log


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    server = Azure()
    with serving(server, tmp_path_factory.mktemp("azure-env")):
        yield server


def blob(azure, key):
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient(azure.endpoint, credential={"account_name": Azure.ACCOUNT, "account_key": Azure.KEY})
    return client.get_blob_client(BUCKET, key)


def sent_bytes(metrics_address):
    """What the daemon counted as sent to the store (`shardfs_store_sent_bytes_total`)."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics") as r:
        for family in text_string_to_metric_families(r.read().decode()):
            if family.name == "shardfs_store_sent_bytes":
                return sum(sample.value for sample in family.samples)
    raise AssertionError("no shardfs_store_sent_bytes_total")


def test_azurite_copies_into_a_block_only_the_range_and_the_version_named(azure):
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobBlock, BlobSasPermissions, generate_blob_sas

    client = blob(azure, "copies/k")
    data = os.urandom(PART + 1000)
    version = client.upload_blob(data)["etag"]
    sas = generate_blob_sas(Azure.ACCOUNT, BUCKET, "copies/k", account_key=Azure.KEY,
                            permission=BlobSasPermissions(read=True),
                            expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    source = f"{client.url}?{sas}"
    ids = [base64.b64encode(b"%032d" % n).decode() for n in range(3)]
    client.stage_block_from_url(ids[0], source, source_offset=10, source_length=PART,
                                headers={"x-ms-source-if-match": version})
    with pytest.raises(HttpResponseError) as refused:
        client.stage_block_from_url(ids[1], source, source_offset=0, source_length=1,
                                    headers={"x-ms-source-if-match": '"0x8D000000000000"'})
    assert refused.value.status_code == 412
    with pytest.raises(HttpResponseError) as refused:
        client.stage_block_from_url(ids[1], source, source_offset=0, source_length=1,
                                    headers={"x-ms-source-if-none-match": version})
    assert refused.value.status_code == 412
    client.stage_block(ids[2], b"tail")
    client.commit_block_list([BlobBlock(ids[0]), BlobBlock(ids[2])], headers={"If-Match": version},
                             metadata={"shardfsnote": "n"})
    assert client.download_blob().readall() == data[10:10 + PART] + b"tail"
    assert client.get_blob_properties().metadata == {"shardfsnote": "n"}
    with pytest.raises(HttpResponseError) as refused:
        client.stage_block(ids[2], b"tail")
        client.commit_block_list([BlobBlock(ids[2])], headers={"If-Match": version})
    assert refused.value.status_code == 412
    assert client.download_blob().readall() == data[10:10 + PART] + b"tail"


def test_on_azure_a_commit_into_a_big_shard_copies_the_old_bytes_and_sends_only_its_new_chunks(azure, tmp_path):
    make_array(azure, "big")
    tiles = {(i, j): tile(4000 + i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    first = {k: v for k, v in tiles.items() if k[0] < 5}
    metrics = f"127.0.0.1:{free_port()}"
    (tmp_path / "m").mkdir()
    with shardfs.mount(url(azure, "big"), tmp_path / "m", endpoint_url=azure.endpoint,
                       log_file=tmp_path / "m.log", metrics_address=metrics) as mnt:
        # Below 5 MiB each commit writes the shard whole (one Put Blob: no blocks); from 5 MiB on
        # it extends it.
        write_chunks(mnt, {k: v for k, v in first.items() if k[0] < 2})
        assert len(shard_bytes(azure, "big")) < PART
        write_chunks(mnt, {k: v for k, v in first.items() if k[0] >= 2})
        before = shard_bytes(azure, "big")
        assert len(before) >= PART
        assert blob(azure, "big/c/0/0").get_block_list("committed")[0] == []
        check(azure, "big", first)
        sent = sent_bytes(metrics)
        write_chunks(mnt, {k: v for k, v in tiles.items() if k[0] >= 5})
        sent = sent_bytes(metrics) - sent
        after = shard_bytes(azure, "big")
        kept = len(before) - INDEX
        # Two blocks: the old chunk bytes copied inside the server, untouched, and the new ones.
        blocks = blob(azure, "big/c/0/0").get_block_list("committed")[0]
        assert [b.size for b in blocks] == [kept, len(after) - kept]
        assert after[:kept] == before[:kept]
        assert len(after) == kept + 3 * SIDE * CHUNK * CHUNK * 2 + 16 + INDEX  # 16: the nonce
        # What crossed the network: the new block, and the few small objects of the commit's turn
        # (its lease), not the 5 MiB kept.
        assert len(after) - kept <= sent < len(after) - kept + (64 << 10), (sent, len(after) - kept)
        check(azure, "big", tiles)
    check(azure, "big", tiles)


def test_on_azure_eight_daemons_extending_the_same_shards_at_once_lose_nothing(azure, tmp_path):
    shards = (1, 2)
    array = make_array(azure, "eighths", shards)
    tiles = {(i, j): tile(8000 + i * 64 + j) for i in range(SIDE) for j in range(SIDE * shards[1])}
    # Six rows of each shard written directly: 6 MiB, so that every commit below extends it.
    array[:6 * CHUNK, :] = np.vstack([np.hstack([tiles[i, j] for j in range(SIDE * shards[1])]) for i in range(6)])
    writers = 8
    ready = threading.Barrier(writers)

    def machine(writer):
        mnt = tmp_path / f"m{writer}"
        mnt.mkdir()
        with shardfs.mount(url(azure, "eighths"), mnt, endpoint_url=azure.endpoint,
                           log_file=tmp_path / f"m{writer}.log") as view:
            ready.wait(timeout=120)
            # Column `writer` of rows 6 and 7 of every shard: each shard is extended by all eight.
            write_chunks(view, {(i, j): t for (i, j), t in tiles.items() if i >= 6 and j % SIDE == writer})

    with concurrent.futures.ThreadPoolExecutor(writers) as pool:
        for done in [pool.submit(machine, w) for w in range(writers)]:
            done.result(timeout=300)
    for s in range(shards[1]):
        check(azure, "eighths", {(i, j - s * SIDE): t for (i, j), t in tiles.items() if j // SIDE == s},
              key=f"c/0/{s}", origin=(0, s * SIDE))
        # The last commit extended the shard: the old bytes copied, the new ones sent.
        assert len(blob(azure, f"eighths/c/0/{s}").get_block_list("committed")[0]) == 2
    left = [m["path"] for batch in obstore.list(azure.objects(), prefix="eighths/__shardfs/") for m in batch]
    assert [k for k in left if "/delta-" in k or k.endswith("/lease")] == []
    for n in range(writers):
        log = (tmp_path / f"m{n}.log").read_text()
        assert "ERROR" not in log, log


def test_on_azure_a_copy_whose_version_was_replaced_meanwhile_is_read_again_and_loses_nothing(azure, tmp_path):
    array = make_array(azure, "raced")
    tiles = {(i, j): tile(6000 + i * SIDE + j) for i in range(SIDE) for j in range(SIDE)}
    array[:6 * CHUNK, :] = np.vstack([np.hstack([tiles[i, j] for j in range(SIDE)]) for i in range(6)])
    proxy = FaultProxy(f"http://127.0.0.1:{azure.port}")
    (tmp_path / "m").mkdir()
    try:
        with shardfs.mount(url(azure, "raced"), tmp_path / "m", endpoint_url=f"{proxy.endpoint}/{Azure.ACCOUNT}",
                           log_file=tmp_path / "m.log", verbose=True) as mnt:
            # The first block staged (the copy of the version read, or the new bytes sent beside
            # it) waits while zarr-python replaces the shard directly: the copy is refused, or the
            # block list committed over the version read.
            proxy.control([{"method": "PUT", "query": "comp=block&", "fault": "stall", "seconds": 3, "times": 1}])
            committing = threading.Thread(target=write_chunks, args=(mnt, {(6, j): tiles[6, j] for j in range(SIDE)}))
            committing.start()
            proxy.wait_applied(0)
            direct = tile(7000)
            array[7 * CHUNK:8 * CHUNK, 0:CHUNK] = direct
            committing.join(timeout=60)
            assert not committing.is_alive()
            assert proxy.control()["applied"] == [1]
        expected = {k: v for k, v in tiles.items() if k[0] < 7}
        expected[7, 0] = direct
        check(azure, "raced", expected)
        # The version stored was made by blocks again, over the one zarr-python wrote.
        assert len(blob(azure, "raced/c/0/0").get_block_list("committed")[0]) == 2
    finally:
        proxy.stop()
