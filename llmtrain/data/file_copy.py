"""Copying a byte range of one open file to the end of another inside the kernel (copy_file_range, else sendfile),
with a plain read/write loop where neither is available. Offsets and counts are Python ints: no 4 GiB limit."""

from __future__ import annotations

import errno
import os

# Bytes per system call: well under the 2 GiB a single call may move on Linux.
_STEP = 1 << 30
_BUFFER = 1 << 20
# Errors that mean "this call cannot copy between these files" (old kernel, other filesystem, sandbox).
_UNSUPPORTED = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF}
_usable = {"copy_file_range": hasattr(os, "copy_file_range"), "sendfile": hasattr(os, "sendfile")}


def copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> None:
    """Append `count` bytes of `src_fd` from `offset` at `dst_fd`'s current position (which moves past them)."""
    while count > 0:
        step = min(count, _STEP)
        copied = _copy_once(src_fd, dst_fd, offset, step)
        if copied == 0:
            raise OSError(errno.EIO, f"file ended {count} bytes early while copying")
        offset += copied
        count -= copied


def _copy_once(src_fd: int, dst_fd: int, offset: int, count: int) -> int:
    if _usable["copy_file_range"]:
        try:
            return os.copy_file_range(src_fd, dst_fd, count, offset_src=offset)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _usable["copy_file_range"] = False
    if _usable["sendfile"]:
        try:
            return os.sendfile(dst_fd, src_fd, offset, count)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _usable["sendfile"] = False
    data = os.pread(src_fd, min(count, _BUFFER), offset)
    view, written = memoryview(data), 0
    while written < len(data):
        written += os.write(dst_fd, view[written:])
    return len(data)
