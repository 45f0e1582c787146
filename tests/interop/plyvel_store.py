"""A LevelDB as a zarr-python 2 store, through plyvel: a MutableMapping of the Zarr keys (UTF-8)
to their values, the layout plyvel users write and `shardfs` mounts. zarr-python ships no
LevelDB store; this minimal one is what its users would write. The database is open while the
store is (LevelDB lets one process at a time open it): close it before mounting.
"""

from collections.abc import MutableMapping


class PlyvelStore(MutableMapping):
    def __init__(self, path):
        import plyvel

        self.db = plyvel.DB(str(path), create_if_missing=True)

    def __getitem__(self, key):
        value = self.db.get(key.encode())
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value):
        self.db.put(key.encode(), bytes(value), sync=True)

    def __delitem__(self, key):
        if self.db.get(key.encode()) is None:
            raise KeyError(key)
        self.db.delete(key.encode(), sync=True)

    def __iter__(self):
        return (k.decode() for k in self.db.iterator(include_value=False))

    def __len__(self):
        return sum(1 for _ in self.db.iterator(include_value=False))

    def items(self):
        return {k.decode(): v for k, v in self.db.iterator()}.items()

    def close(self):
        self.db.close()
