"""zarr-python's own store conformance suite (zarr.testing.store.StoreTests) for a LocalStore
rooted at SHARDFS_SUITE_ROOT: a directory inside a writable shardfs mount, or a plain directory
(the control run). Run by tests/interop/test_store_suite.py, which compares the two runs."""

import os
import pathlib
import uuid

import numpy as np
import pytest

import zarr
from zarr.core.buffer import Buffer, cpu
from zarr.storage import LocalStore
from zarr.testing.store import StoreTests


def fresh_root() -> pathlib.Path:
    return pathlib.Path(os.environ["SHARDFS_SUITE_ROOT"]) / f"t-{uuid.uuid4().hex[:12]}"


class TestLocalStore(StoreTests[LocalStore, cpu.Buffer]):
    store_cls = LocalStore
    buffer_cls = cpu.Buffer

    # The suite's own access to the store, bypassing LocalStore, as zarr's tests define it.
    async def get(self, store: LocalStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes((store.root / key).read_bytes())

    async def set(self, store: LocalStore, key: str, value: Buffer) -> None:
        (store.root / key).parent.mkdir(parents=True, exist_ok=True)
        (store.root / key).write_bytes(value.to_bytes())

    @pytest.fixture
    def store_kwargs(self) -> dict[str, str]:
        root = fresh_root()
        root.mkdir(parents=True)
        return {"root": str(root)}


# Beyond the suite: what zarr-python does with a LocalStore that the suite does not exercise.


@pytest.mark.parametrize("ndim", [0, 1, 2, 3])
async def test_move_keeps_every_chunk(ndim: int) -> None:
    """LocalStore.move is shutil.move of the store's directory (rename(2) of a directory)."""
    origin, destination = fresh_root(), fresh_root()
    store = await LocalStore.open(root=origin)
    data = np.arange(4**ndim).reshape((4,) * ndim) if ndim else np.arange(1)[0]
    array = zarr.create_array(store, data=data, chunks=(2,) * ndim or "auto")
    await store.move(str(destination))
    assert not origin.exists()
    assert np.array_equal(array[...], data)
    assert np.array_equal(zarr.open_array(LocalStore(destination), mode="r")[...], data)


def test_nested_groups_and_arrays_are_created_exclusively() -> None:
    """Implicit parent groups are written with set_if_not_exists: link(2), then unlink."""
    root = fresh_root()
    store = LocalStore(root)
    array = zarr.create_array(store, name="g1/g2/nested", shape=(6,), chunks=(2,), dtype="i4")
    array[:] = np.arange(6)
    group = zarr.open_group(store, mode="a")
    group.create_group("h1/h2")
    reopened = zarr.open_group(LocalStore(root), mode="r")
    assert np.array_equal(reopened["g1/g2/nested"][:], np.arange(6))
    assert isinstance(reopened["h1/h2"], zarr.Group)
    assert not [p for p in root.rglob("*") if ".partial" in p.name or p.name.startswith(".")]


async def test_list_and_delete_a_hierarchy() -> None:
    """The suite's listing tests store bytes that are not Zarr documents under zarr.json, which a
    mount refuses; this lists and deletes a hierarchy zarr-python wrote itself."""
    store = await LocalStore.open(root=fresh_root())
    group = zarr.open_group(store, mode="w")
    group.create_array("a/b", shape=(4, 4), chunks=(2, 2), dtype="u1", fill_value=0)[:] = 1
    group.create_group("a/g")
    chunks = [f"a/b/c/{i}/{j}" for i in range(2) for j in range(2)]
    expected = sorted(["zarr.json", "a/zarr.json", "a/b/zarr.json", "a/g/zarr.json", *chunks])
    assert sorted([k async for k in store.list()]) == expected
    assert sorted([k async for k in store.list_prefix("a/b/")]) == sorted(["a/b/zarr.json", *chunks])
    assert sorted([k async for k in store.list_dir("a")]) == ["b", "g", "zarr.json"]
    assert sorted([k async for k in store.list_dir("a/b/c")]) == ["0", "1"]
    assert await store.exists("a/b/c/1/1") and not await store.exists("a/b/c/2/0")
    await store.delete("a/b/c/1/1")
    assert not await store.exists("a/b/c/1/1")
    await store.delete_dir("a/b")
    assert sorted([k async for k in store.list()]) == ["a/g/zarr.json", "a/zarr.json", "zarr.json"]
