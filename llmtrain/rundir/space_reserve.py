"""Room kept aside on a run directory's storage for the few bytes that say how a job ended.

A full disk stops a job at the first write that does not fit; what says why (a rank's status, job.json's exit code)
must then still be written, on the same full disk. Their writers hold a small file of allocated space while the job
runs (RunPaths.rank_reserve, RunPaths.launcher_reserve) and delete it to make room when a write fails for lack of
it. A reserve that cannot be allocated (the disk is already full, or read-only) is simply not there.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import TypeVar

RESERVE_BYTES = 256 * 1024  # a status or job.json is a few KiB; filesystems allocate in blocks of up to 64 KiB
# What deleting a file can make room for: a full disk, an exceeded quota (not a read-only file system).
ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

T = TypeVar("T")


def hold(path: str, size: int = RESERVE_BYTES) -> bool:
    """Allocate `size` bytes in the file `path` (real blocks, not a sparse file); False when that failed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, size)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    finally:
        os.close(fd)


def release(path: str) -> bool:
    """Give the reserved room back; False when there was none."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def write_with_room(reserve: str, write: Callable[[], T]) -> T:
    """write(); when it fails for want of room and the reserve was there, once more after releasing it."""
    try:
        return write()
    except OSError as e:
        if e.errno not in ROOM_ERRNOS or not release(reserve):
            raise
    return write()
