"""Checkpoint folders on an object store (s3://, gs://, ... through fsspec): no rename, so a save is written under
its final name and its meta.json, written last, commits it.

Credentials and the endpoint come from where the store's own client looks (for S3: AWS_ACCESS_KEY_ID and friends,
~/.aws/config and credentials, AWS_ENDPOINT_URL for S3-compatible stores), never from llmtrain's config. Listings
are not cached: another rank or a background upload changes the folder between two looks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

from llmtrain.checkpoint.storage.base import CheckpointStorage
from llmtrain.checkpoint.storage.failures import answered
from llmtrain.errors import ObjectStoreError


def filesystem(uri: str, **options):
    """The fsspec filesystem of `uri`, without listing caches; one that is not installed, or a scheme fsspec does
    not know, is an ObjectStoreError saying what to install."""
    from llmtrain.checkpoint.storage.probe import install_problem

    problem = install_problem(uri)
    if problem:
        raise ObjectStoreError(uri, problem)
    import fsspec

    cls = fsspec.get_filesystem_class(uri.split("://", 1)[0])
    return cls(use_listings_cache=False, skip_instance_cache=True, **options)


# DCP reads each stored item with one read of its length; the client's default read-ahead (50 MiB for s3fs) would
# fetch that much more for every small item. Writes keep the client's part size (S3 allows 10,000 parts a file).
READ_AHEAD_BYTES = 4 << 20


def read_options(mode: str) -> dict:
    return {"block_size": READ_AHEAD_BYTES} if "r" in mode else {}


class ObjectStorage(CheckpointStorage):
    renames = False

    def __init__(self, uri: str):
        self.protocol = uri.split("://", 1)[0]
        self.fs = filesystem(uri)

    def _key(self, path: str) -> str:
        return self.fs._strip_protocol(path)

    def _uri(self, key: str) -> str:
        return f"{self.protocol}://{key}"

    def _entries(self, path: str) -> list[dict]:
        try:
            with answered(path):
                return self.fs.ls(self._key(path), detail=True)
        except FileNotFoundError:
            return []

    def listdir(self, path: str) -> dict[str, bool]:
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: e["type"] == "directory" for e in self._entries(path)}

    def sizes(self, path: str) -> dict[str, int]:
        return {e["name"].rsplit("/", 1)[-1]: int(e["size"]) for e in self._entries(path) if e["type"] == "file"}

    def isdir(self, path: str) -> bool:
        with answered(path):
            return self.fs.isdir(self._key(path))

    def isfile(self, path: str) -> bool:
        with answered(path):
            return self.fs.isfile(self._key(path))

    def open(self, path: str, mode: str = "rb") -> IO:
        with answered(path):
            return self.fs.open(self._key(path), mode, **read_options(mode))

    def read_bytes(self, path: str) -> bytes:
        with answered(path):
            return self.fs.cat_file(self._key(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """One ranged request, not the client's read-ahead block (tens of MiB) for a header of a few KiB."""
        with answered(path):
            return self.fs.cat_file(self._key(path), start=start, end=end)

    def write_bytes(self, path: str, data: bytes) -> None:
        with answered(path):
            self.fs.pipe_file(self._key(path), data)  # one PUT: there or not

    def makedirs(self, path: str) -> None:
        """Folders are key prefixes: nothing to make."""

    def remove(self, path: str) -> None:
        key = self._key(path)
        try:
            with answered(path):
                self.fs.rm(key, recursive=True)
        except FileNotFoundError:
            pass

    def publish(self, staged: str, final: str) -> None:
        """Written under its final name already; meta.json, written last, was the commit."""

    def walk_files(self, path: str) -> Iterator[tuple[str, int]]:
        root = self._key(path).rstrip("/") + "/"
        try:
            with answered(path):
                found = self.fs.find(root, detail=True)
        except FileNotFoundError:
            return
        for key, info in sorted(found.items()):
            if info.get("type") == "file":
                yield key[len(root):], int(info["size"])

    def move(self, path: str, new_path: str) -> None:
        """A copy inside the store, then the original removed: an object store renames nothing."""
        with answered(path):
            self.fs.copy(self._key(path).rstrip("/") + "/", self._key(new_path).rstrip("/") + "/", recursive=True)
        self.remove(path)

    def put_file(self, local_path: str, path: str) -> None:
        with answered(path):
            self.fs.put_file(local_path, self._key(path))

    def dcp_writer(self, path: str):
        from llmtrain.checkpoint.storage.dcp_io import CountingFsspecWriter

        return CountingFsspecWriter(path, self.fs)

    def dcp_reader(self, path: str):
        from llmtrain.checkpoint.storage.dcp_io import StoreReader

        return StoreReader(path, self.fs, read_options("rb"))
