"""What checkpoint code needs from where checkpoints live: one interface, a local and an object-store version.

A local folder publishes a finished save by renaming STEP.tmp to STEP; an object store has no rename, so a save
is written under its final name and meta.json, written last, is its commit marker (`renames`).
"""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import IO


class CheckpointStorage(ABC):
    # Whether a finished save is published by a rename (STEP.tmp -> STEP); without it, meta.json is the marker.
    renames: bool = True

    def join(self, base: str, *names: str) -> str:
        return posixpath.join(base, *names)

    def basename(self, path: str) -> str:
        return posixpath.basename(path.rstrip("/"))

    def parent(self, path: str) -> str:
        return posixpath.dirname(path.rstrip("/"))

    @abstractmethod
    def listdir(self, path: str) -> dict[str, bool]:
        """{name: is a folder} of the entries of `path`; {} when it does not exist."""

    @abstractmethod
    def sizes(self, path: str) -> dict[str, int]:
        """{name: bytes} of the files directly in `path`; {} when it does not exist."""

    @abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abstractmethod
    def isfile(self, path: str) -> bool: ...

    @abstractmethod
    def open(self, path: str, mode: str = "rb") -> IO: ...

    def read_bytes(self, path: str) -> bytes:
        with self.open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file."""
        with self.open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode()

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Whole or not at all: a reader never sees half of it."""

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def remove(self, path: str) -> None:
        """A folder and everything under it, or a file; nothing when it does not exist."""

    @abstractmethod
    def publish(self, staged: str, final: str) -> None:
        """Make a finished save visible under its final name (replacing one there)."""

    def staged_name(self, final: str) -> str:
        """Where a save of `final` is written until it is published."""
        return final + ".tmp" if self.renames else final

    def tree_bytes(self, path: str) -> int:
        return sum(size for _, size in self.walk_files(path))

    @abstractmethod
    def walk_files(self, path: str) -> Iterator[tuple[str, int]]:
        """(path relative to `path`, bytes) of every file under it."""

    @abstractmethod
    def move(self, path: str, new_path: str) -> None:
        """A folder to another name in the same storage."""

    @abstractmethod
    def put_file(self, local_path: str, path: str) -> None:
        """Copy a local file to `path`."""

    @abstractmethod
    def dcp_writer(self, path: str):
        """A torch.distributed.checkpoint StorageWriter for a checkpoint folder at `path`."""

    @abstractmethod
    def dcp_reader(self, path: str):
        """A torch.distributed.checkpoint StorageReader for the checkpoint folder at `path`."""

    def free_bytes(self, path: str) -> int | None:
        """Room left where `path` is written; None where that is not known (an object store)."""
        return None

    def shown(self, path: str) -> str:
        """`path` as a message names it."""
        return path
