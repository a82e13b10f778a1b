"""Files replaced whole: a temp file beside the target, fsync, rename over it, fsync the folder. A reader sees the
old content or the new one, never half of it; a writer that fails midway leaves the old content and no temp file.

Temp files are named `.NAME.XXXXXXXX.tmp` (unique per writer, so two writers never share one) and get the
permissions a plain open() would give (0666 less the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from llmtrain.errors import STORAGE_ERRNOS, StorageError


def process_umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def fsync_dir(directory: str | os.PathLike) -> None:
    """Persist a rename in `directory`; not every filesystem supports fsync on a folder, which is then skipped."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _raise_named(path: str | os.PathLike, err: OSError) -> None:
    """A full, over-quota or read-only storage is raised naming the file it kept from being written (the temp
    file's name, or none, is all the OSError has); any other OSError as it is."""
    if err.errno in STORAGE_ERRNOS and not isinstance(err, StorageError):
        raise StorageError(str(path), err) from err
    raise err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = True) -> Iterator[str]:
    """Yield a temp file's name beside `path` for a writer that wants a name (a library's save(name)); when the
    block ends it is fsynced and renamed over `path`; when the block raises it is deleted and `path` is untouched.
    durable=False skips the fsyncs: still whole for readers, but a crash may lose it (a heartbeat, rewritten every
    step, is worth nothing after a crash and should not cost a disk flush per step)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
        _raise_named(path, e)
    os.close(fd)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~process_umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            _raise_named(path, e)
        raise
    if durable:
        fsync_dir(folder)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", durable: bool = True) -> Iterator[IO]:
    """Yield the open temp file ("wb" or "w") that replaces `path` when the block ends without an exception."""
    with atomic_path(path, durable) as tmp, open(tmp, mode) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    with atomic_writer(path, "w", durable) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, value, **dumps) -> None:
    """json.dumps(value, **dumps) (indent=, sort_keys=: each file keeps its own layout), written atomically."""
    atomic_write_text(path, json.dumps(value, **dumps))


def publish_dir(tmp_dir: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a finished folder (written under a temp name) to its final name, and persist the rename."""
    os.replace(tmp_dir, final)
    fsync_dir(os.path.dirname(os.path.abspath(final)))
