"""Checkpoint folders on a local or shared POSIX filesystem: a save is STEP.tmp renamed to STEP once finished."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import IO

from llmtrain.checkpoint.storage.base import CheckpointStorage
from llmtrain.rundir.atomic import atomic_write_bytes, publish_dir


class LocalStorage(CheckpointStorage):
    renames = True

    def join(self, base: str, *names: str) -> str:
        return os.path.join(base, *names)

    def basename(self, path: str) -> str:
        return os.path.basename(os.path.normpath(path))

    def parent(self, path: str) -> str:
        return os.path.dirname(os.path.normpath(path))

    def listdir(self, path: str) -> dict[str, bool]:
        try:
            with os.scandir(path) as entries:
                return {e.name: e.is_dir() for e in entries}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    def sizes(self, path: str) -> dict[str, int]:
        try:
            with os.scandir(path) as entries:
                return {e.name: e.stat().st_size for e in entries if e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def open(self, path: str, mode: str = "rb") -> IO:
        return open(path, mode)

    def write_bytes(self, path: str, data: bytes) -> None:
        atomic_write_bytes(path, data)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)

    def publish(self, staged: str, final: str) -> None:
        if os.path.exists(final):  # a finished save of the same step from an earlier attempt
            shutil.rmtree(final)
        publish_dir(staged, final)

    def walk_files(self, path: str) -> Iterator[tuple[str, int]]:
        for root, _, files in os.walk(path):
            for name in files:
                full = os.path.join(root, name)
                yield os.path.relpath(full, path), os.path.getsize(full)

    def move(self, path: str, new_path: str) -> None:
        os.makedirs(os.path.dirname(new_path), exist_ok=True)
        os.rename(path, new_path)

    def put_file(self, local_path: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(local_path, path)

    def dcp_writer(self, path: str):
        from torch.distributed.checkpoint import FileSystemWriter  # torch only where a checkpoint is read or written

        return FileSystemWriter(path)

    def dcp_reader(self, path: str):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)

    def free_bytes(self, path: str) -> int | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize
