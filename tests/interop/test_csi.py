"""`shardfs csi`, the Kubernetes CSI node plugin, driven as kubelet and the CSI sidecars drive it:
gRPC over its unix socket, with stubs made here from the spec's own proto/csi.proto
(grpcio-tools). The Identity and Node cases of csi-sanity (the Kubernetes CSI project's
conformance suite, a Go program that cannot be built here) that apply to a node-only driver of
static volumes, ported to pytest (docs/testing.md lists each case, ported or why not), and the
full path: probe, info, publish of a real sharded store into a fresh target directory, processes
reading a chunk file byte for byte and writing one, unpublish (the write then in the store),
idempotency of both, a conflicting publish, a driver killed and started again in the middle, a
credential Secret that reaches the daemon's environment and no command line or log line, and a
publish of an S3 store (moto) whose only credentials are the Secret's.

Every case stops its driver and unmounts what it mounted, however it ends.

Runs in target/venv (grpcio, grpcio-tools, zarr-python 3.1.6, moto); alone:
``SHARDFS_REQUIRE_FUSE=1 target/venv/bin/python -m pytest tests/interop/test_csi.py``.
"""

import contextlib
import errno
import importlib.resources
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
import zarr
from conftest import BINARY, ROOT

DRIVER = "shardfs.csi.zarr.dev"
SHAPE, CHUNKS, SHARDS = (64, 64), (8, 8), (32, 32)
# The variables the driver must not have itself: the volumes' credentials come from Secrets.
CREDENTIAL_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_")


@pytest.fixture(scope="module")
def csi(tmp_path_factory):
    """The generated modules `csi_pb2` and `csi_pb2_grpc` of proto/csi.proto."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("csi_stubs")
    includes = importlib.resources.files("grpc_tools") / "_proto"
    status = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{includes}", f"--python_out={out}",
                          f"--grpc_python_out={out}", "csi.proto"])
    assert status == 0, "protoc failed on proto/csi.proto"
    sys.path.insert(0, str(out))
    import csi_pb2
    import csi_pb2_grpc

    return csi_pb2, csi_pb2_grpc


def shardfs_mounts(path):
    """How many FUSE mounts the mount table shows at `path` (type `fuse` where root mounts
    directly, `fuse.shardfs` through fusermount3)."""
    path = str(path)
    count = 0
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point = fields[4].replace("\\040", " ")
        if point == path and fields[fields.index("-") + 1] in ("fuse", "fuse.shardfs"):
            count += 1
    return count


def daemons_at(path):
    """The mount daemons serving (or that served) `path`: the processes of `shardfs mount`
    whose command line names it."""
    pids = []
    for pid, line in all_command_lines().items():
        args = line.split(b"\0")
        if b"mount" in args and str(path).encode() in args:
            pids.append(pid)
    return pids


def force_unmount(path):
    """`path` unmounted, whatever state it is in, and its daemons ended: a daemon whose commit
    cannot finish (its server stopped) would otherwise try on after the test."""
    daemons = daemons_at(path)
    for command in (["fusermount3", "-u", str(path)], ["umount", "-l", str(path)]):
        if shardfs_mounts(path) == 0:
            break
        subprocess.run(command, capture_output=True)
    deadline = time.monotonic() + 10
    for pid in daemons:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Driver:
    """`shardfs csi` on a socket in a fresh directory (short: a socket path is at most 107
    bytes), with the gRPC stubs of its services, its log in `log`, and an environment without
    credentials."""

    def __init__(self, csi, node_id="node-1"):
        self.pb, self.grpc = csi
        self.node_id = node_id
        self.dir = Path(tempfile.mkdtemp(prefix="shardfs-csi."))
        self.socket = self.dir / "csi.sock"
        self.log = self.dir / "driver.log"
        self.process = None
        self.channel = None

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(CREDENTIAL_PREFIXES)}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [BINARY, "csi", "--endpoint", f"unix://{self.socket}", "--node-id", self.node_id],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        # gRPC's C core sends the socket's path as the :authority, which the driver's HTTP/2
        # server (hyper) refuses as no authority at all; kubelet and the sidecars (grpc-go) send
        # "localhost", as this does.
        self.channel = grpc.insecure_channel(f"unix://{self.socket}", options=[("grpc.default_authority", "localhost")])
        self.identity = self.grpc.IdentityStub(self.channel)
        self.node = self.grpc.NodeStub(self.channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.identity.Probe(self.pb.ProbeRequest(), timeout=1)
                return self
            except grpc.RpcError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"shardfs csi did not start: {self.log.read_text()}")
                time.sleep(0.05)

    def kill(self):
        """Ends the driver at once, as a crash would: its mounts stay."""
        if self.channel:
            self.channel.close()
            self.channel = None
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def capability(self, flags=(), mode=None):
        pb = self.pb
        mode = pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER if mode is None else mode
        return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(mount_flags=list(flags)),
                                   access_mode=pb.VolumeCapability.AccessMode(mode=mode))

    def publish(self, volume_id, target, store, flags=(), readonly=False, secrets=None, mode=None):
        return self.node.NodePublishVolume(self.pb.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=str(target), volume_capability=self.capability(flags, mode),
            readonly=readonly, volume_context={"store": str(store)}, secrets=secrets or {}), timeout=120)

    def unpublish(self, volume_id, target):
        return self.node.NodeUnpublishVolume(
            self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)), timeout=120)

    def logs(self):
        """The driver's log and every mount daemon's log (kept beside the socket)."""
        return "".join(p.read_text(errors="replace") for p in [self.log, *self.dir.glob("volumes/*.log")]
                       if p.exists())


@pytest.fixture
def driver(csi, tmp_path):
    """A running driver; stopped, and every mount below the case's directories undone, however
    the case ends."""
    d = Driver(csi).start()
    try:
        yield d
    finally:
        d.kill()
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split(" ")[4].replace("\\040", " ")
            if point.startswith((str(tmp_path), str(d.dir))):
                force_unmount(point)
        for pid, line in all_command_lines().items():
            if str(tmp_path).encode() in line and b"mount" in line.split(b"\0"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(d.dir)])


def code_of(call):
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code(), raised.value.details()


def sharded_store(path):
    """A local sharded store with one array `a` of uint16, raw chunks (so that a chunk file's
    bytes are the array's), every value its index."""
    data = np.arange(np.prod(SHAPE), dtype="uint16").reshape(SHAPE)
    array = zarr.create_array(store=str(path), name="a", shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint16",
                              compressors=None, fill_value=0)
    array[...] = data
    return data


def run(*command):
    """A command run as another process, as a pod's would: its output."""
    return subprocess.run(command, check=True, capture_output=True).stdout


# Identity (csi-sanity: "Identity Service").

def test_identity_names_the_driver_and_is_ready(driver):
    pb = driver.pb
    info = driver.identity.GetPluginInfo(pb.GetPluginInfoRequest())
    assert info.name == DRIVER
    assert len(info.name) <= 63 and re.fullmatch(r"[a-zA-Z][A-Za-z0-9\-._]{0,61}[a-zA-Z]", info.name)
    assert info.vendor_version
    capabilities = driver.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities
    # A node plugin alone: no controller service, no topology constraints, no expansion.
    assert [c for c in capabilities if c.WhichOneof("type")] == []
    probe = driver.identity.Probe(pb.ProbeRequest())
    assert not probe.HasField("ready") or probe.ready.value


# Node (csi-sanity: "Node Service").

def test_node_info_and_capabilities(driver):
    pb = driver.pb
    info = driver.node.NodeGetInfo(pb.NodeGetInfoRequest())
    assert info.node_id == "node-1"
    assert info.max_volumes_per_node >= 0
    known = set(pb.NodeServiceCapability.RPC.Type.values())
    capabilities = driver.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest()).capabilities
    for capability in capabilities:
        assert capability.rpc.type in known
    # Nothing to stage: NodeStageVolume is not advertised, and not served.
    assert pb.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME not in [c.rpc.type for c in capabilities]
    code, _ = code_of(lambda: driver.node.NodeStageVolume(pb.NodeStageVolumeRequest(volume_id="v")))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    code, _ = code_of(lambda: driver.node.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id="v")))
    assert code == grpc.StatusCode.UNIMPLEMENTED


def test_missing_and_bad_arguments_are_invalid(driver, tmp_path):
    pb, node = driver.pb, driver.node
    store = tmp_path / "store.zarr"
    sharded_store(store)
    target = tmp_path / "target"
    publish = pb.NodePublishVolumeRequest
    cases = {
        "no volume id": publish(target_path=str(target), volume_capability=driver.capability(),
                                volume_context={"store": str(store)}),
        "no target path": publish(volume_id="v1", volume_capability=driver.capability(),
                                  volume_context={"store": str(store)}),
        "no capability": publish(volume_id="v1", target_path=str(target), volume_context={"store": str(store)}),
        "block": publish(volume_id="v1", target_path=str(target), volume_context={"store": str(store)},
                         volume_capability=pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume())),
        "no store": publish(volume_id="v1", target_path=str(target), volume_capability=driver.capability()),
        "unknown attribute": publish(volume_id="v1", target_path=str(target), volume_capability=driver.capability(),
                                     volume_context={"store": str(store), "bucket": "b"}),
        "bad flag": publish(volume_id="v1", target_path=str(target),
                            volume_capability=driver.capability(["zarr-format=4"]),
                            volume_context={"store": str(store)}),
        "unknown flag": publish(volume_id="v1", target_path=str(target),
                                volume_capability=driver.capability(["no-such-option"]),
                                volume_context={"store": str(store)}),
        "not a credential": publish(volume_id="v1", target_path=str(target), volume_capability=driver.capability(),
                                    volume_context={"store": str(store)}, secrets={"PATH": "/evil"}),
    }
    for case, request in cases.items():
        code, message = code_of(lambda: node.NodePublishVolume(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (case, message)
        assert "\n" not in message, (case, message)
        if request.volume_id:
            assert message.startswith("volume v1: "), (case, message)
    code, message = code_of(lambda: driver.publish("v1", target, tmp_path / "missing.zarr"))
    assert code == grpc.StatusCode.NOT_FOUND and "missing.zarr" in message, message
    code, _ = code_of(lambda: node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(target_path=str(target))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = code_of(lambda: node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="v1")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert shardfs_mounts(target) == 0, "nothing was mounted"


def test_publish_read_write_unpublish(driver, tmp_path):
    store, target = tmp_path / "store.zarr", tmp_path / "pod/volumes/pv/mount"
    data = sharded_store(store)
    driver.publish("v1", target, store)
    assert shardfs_mounts(target) == 1
    # A chunk file read by another process, byte for byte the array's chunk.
    assert run("cat", str(target / "a/c/1/2")) == data[8:16, 16:24].tobytes()
    # Written by another process: chunk-aligned, inside a shard other chunks of which stay.
    written = np.full(CHUNKS, 7, dtype="uint16")
    (tmp_path / "chunk").write_bytes(written.tobytes())
    run("cp", str(tmp_path / "chunk"), str(target / "a/c/7/7"))
    assert (target / "a/c/7/7").read_bytes() == written.tobytes()
    # The same publish again is done already; another at the same target is refused.
    driver.publish("v1", target, store)
    assert shardfs_mounts(target) == 1, "a second identical publish mounted again"
    code, message = code_of(lambda: driver.publish("v1", target, store, readonly=True))
    assert code == grpc.StatusCode.ALREADY_EXISTS and message.startswith("volume v1: "), message
    code, message = code_of(lambda: driver.publish("v1", target, store, flags=["zarr-format=2"]))
    assert code == grpc.StatusCode.ALREADY_EXISTS, message
    # Unpublished: unmounted, the target removed (csi-sanity: "should remove target path"), the
    # write committed into its shard.
    driver.unpublish("v1", target)
    assert shardfs_mounts(target) == 0
    assert not target.exists()
    expected = data.copy()
    expected[56:64, 56:64] = 7
    np.testing.assert_array_equal(zarr.open_array(str(store / "a"), mode="r")[...], expected)
    # Idempotent: unpublished again, and a target never published.
    driver.unpublish("v1", target)
    driver.unpublish("v2", tmp_path / "never/published")
    assert "published" in driver.logs() and "unpublished" in driver.logs()


def test_each_volume_serves_its_own_metrics(driver, tmp_path):
    """A PersistentVolume's `metrics-address` flag (issue 63: metrics per volume): each volume's
    daemon serves its own numbers, which `shardfs status TARGET` finds; a read through one volume
    moves its numbers and not the other's."""
    targets = {}
    for name in ("m1", "m2"):
        store, target = tmp_path / f"{name}.zarr", tmp_path / f"pod/volumes/{name}/mount"
        sharded_store(store)
        driver.publish(name, target, store, flags=["metrics-address=127.0.0.1:0"])
        targets[name] = target

    def status(target):
        """Where the volume's daemon serves its metrics, and the bytes it has read from its store."""
        shown = subprocess.run([BINARY, "status", str(target)], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        received = [line for line in lines if line.startswith("shardfs_store_received_bytes_total ")]
        return lines[0].split("served at ", 1)[1], float(received[0].split()[1])

    (first, before), (second, other) = status(targets["m1"]), status(targets["m2"])
    assert first != second, "two volumes, two daemons, two addresses"
    chunk = run("cat", str(targets["m1"] / "a/c/1/2"))
    assert status(targets["m1"])[1] >= before + len(chunk)
    assert status(targets["m2"])[1] == other
    for name, target in targets.items():
        driver.unpublish(name, target)
        assert shardfs_mounts(target) == 0


def test_read_only_from_the_request_or_the_access_mode(driver, tmp_path):
    pb = driver.pb
    store = tmp_path / "store.zarr"
    data = sharded_store(store)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    reader = pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY
    for n, kwargs in enumerate([{"readonly": True}, {"mode": reader}, {"flags": ["read-only"]}]):
        target = tmp_path / f"ro{n}"
        driver.publish(f"ro{n}", target, store, **kwargs)
        try:
            assert (target / "a/c/0/1").read_bytes() == data[0:8, 8:16].tobytes()
            with pytest.raises(OSError) as raised:
                (target / "a/c/0/1").write_bytes(b"x" * 128)
            assert raised.value.errno == errno.EROFS, kwargs
        finally:
            driver.unpublish(f"ro{n}", target)
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


def test_a_restarted_driver_finds_its_mounts(driver, tmp_path):
    store, target = tmp_path / "store.zarr", tmp_path / "target"
    data = sharded_store(store)
    driver.publish("v1", target, store)
    written = np.full(CHUNKS, 9, dtype="uint16")
    (target / "a/c/0/0").write_bytes(written.tobytes())
    driver.kill()
    # The mount outlives the driver, and its daemon serves on.
    assert shardfs_mounts(target) == 1
    assert (target / "a/c/0/1").read_bytes() == data[0:8, 8:16].tobytes()
    driver.start()
    assert "published before at" in driver.log.read_text()
    driver.publish("v1", target, store)
    assert shardfs_mounts(target) == 1, "a restarted driver mounted a second time"
    code, _ = code_of(lambda: driver.publish("v1", target, store, readonly=True))
    assert code == grpc.StatusCode.ALREADY_EXISTS, "the record of the settings was lost"
    driver.unpublish("v1", target)
    assert shardfs_mounts(target) == 0 and not target.exists()
    np.testing.assert_array_equal(zarr.open_array(str(store / "a"), mode="r")[0:8, 0:8], written)


def all_command_lines():
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                lines[int(entry.name)] = (entry / "cmdline").read_bytes()
    return lines


def environment_holders(value):
    holders = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if value.encode() in (entry / "environ").read_bytes():
                    holders.append(int(entry.name))
    return holders


def test_a_secret_reaches_the_daemon_environment_alone(driver, tmp_path):
    store, target = tmp_path / "store.zarr", tmp_path / "target"
    sharded_store(store)
    secret = f"secret-{uuid.uuid4().hex}"
    driver.publish("v1", target, store, secrets={"AWS_SECRET_ACCESS_KEY": secret, "key_id": "AKIATEST"})
    try:
        holders = environment_holders(secret)
        # The daemon serving the mount holds it (this test process holds it too, in its own
        # memory, not in its environment).
        assert holders, "the secret reached no process's environment"
        for pid in holders:
            assert b"mount" in Path(f"/proc/{pid}/cmdline").read_bytes()
        for pid, line in all_command_lines().items():
            assert secret.encode() not in line, f"the secret is on the command line of process {pid}"
    finally:
        driver.unpublish("v1", target)
    # A refused secret is named by its key, never by its value.
    code, message = code_of(lambda: driver.publish("v2", tmp_path / "t2", store, secrets={"LD_PRELOAD": secret}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "LD_PRELOAD" in message and secret not in message
    logs = driver.logs()
    assert "v1" in logs, "the driver logged nothing"
    assert secret not in logs, "the secret is in a log line"


def test_an_s3_store_with_the_secret_as_its_credentials(csi, tmp_path):
    import object_stores

    work = tmp_path / "s3"
    work.mkdir()
    with object_stores.serving(object_stores.S3(), work) as s3:
        array = zarr.create_array(store=object_stores.zarr_store(s3, "data.zarr"), name="a", shape=SHAPE,
                                  chunks=CHUNKS, shards=SHARDS, dtype="uint16", compressors=None, fill_value=0)
        data = np.arange(np.prod(SHAPE), dtype="uint16").reshape(SHAPE)
        array[...] = data
        # Started now: the driver leaves the credentials the server set out of its environment.
        driver = Driver(csi).start()
        target = tmp_path / "target"
        secret = f"s3-{uuid.uuid4().hex}"
        try:
            driver.publish("s3-volume", target, "s3://interop/data.zarr",
                           flags=[f"endpoint-url={s3.endpoint}", "region us-east-1", "metadata-ttl=500"],
                           secrets={"key_id": "test", "access_key": secret})
            assert run("cat", str(target / "a/c/3/4")) == data[24:32, 32:40].tobytes()
            written = np.full(CHUNKS, 5, dtype="uint16")
            (tmp_path / "chunk").write_bytes(written.tobytes())
            run("cp", str(tmp_path / "chunk"), str(target / "a/c/2/2"))
            for pid, line in all_command_lines().items():
                assert secret.encode() not in line, f"the secret is on the command line of process {pid}"
            driver.unpublish("s3-volume", target)
            assert shardfs_mounts(target) == 0
            stored = zarr.open_array(store=object_stores.zarr_store(s3, "data.zarr"), path="a", mode="r")[...]
            expected = data.copy()
            expected[16:24, 16:24] = 5
            np.testing.assert_array_equal(stored, expected)
            assert secret not in driver.logs()
        finally:
            driver.kill()
            force_unmount(target)
            subprocess.run(["rm", "-rf", str(driver.dir)])
