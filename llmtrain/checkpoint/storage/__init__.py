"""Where checkpoint folders live, behind one interface (base.CheckpointStorage): a local or shared filesystem
(local.LocalStorage) or an object store reached through fsspec (object_store.ObjectStorage)."""

from __future__ import annotations

import functools

from llmtrain.checkpoint.storage.base import CheckpointStorage
from llmtrain.checkpoint.storage.local import LocalStorage


def is_uri(location: str) -> bool:
    """An object-store location (s3://bucket/prefix): a scheme other than file://."""
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> str:
    """A file:// location as a plain path; anything else as it is."""
    return location[len("file://"):] if location.startswith("file://") else location


@functools.cache
def _object_storage(protocol: str) -> CheckpointStorage:
    from llmtrain.checkpoint.storage.object_store import ObjectStorage

    return ObjectStorage(f"{protocol}://")


def storage_for(location: str) -> CheckpointStorage:
    """The storage that holds `location` (a path, or a URI of an object store); a store whose client is not
    installed is an ObjectStoreError naming `location`."""
    if is_uri(location):
        from llmtrain.errors import ObjectStoreError

        try:
            return _object_storage(location.split("://", 1)[0])
        except ObjectStoreError as e:
            raise ObjectStoreError(location, e.message) from None
    return LOCAL


LOCAL = LocalStorage()
__all__ = ["CheckpointStorage", "LOCAL", "is_uri", "local_path", "storage_for"]
