"""Output to a reader that stops early (`llmtrain plan | head -1`, a pager quit at once) is not an error.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError: a traceback, and exit 1, which for
`llmtrain plan` means "does not fit". Once stdout's reader is gone it is pointed at /dev/null instead, and the
command ends as it would have, with its own exit code. Only `follow`, whose output is all it does, stops then.
A closed terminal is the same for stdout and stderr: writes to it fail with EIO, and a launcher that got SIGHUP
must still stop its job, record how it ended and exit with its code."""

from __future__ import annotations

import errno
import os
import sys

# A closed pipe; a terminal that was closed (hung up).
_READER_GONE = (errno.EPIPE, errno.EIO)


class ReaderGone(Exception):
    """Raised by a command that only produces output (follow) to stop once nobody reads it."""


class QuietWhenClosed:
    """A stand-in for sys.stdout: writes go to `stream` until its reader is gone, then to /dev/null."""

    def __init__(self, stream):
        self._stream = stream
        self.reader_gone = False

    def _discard(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # what is still buffered, and the flush at exit, go there
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno not in _READER_GONE:
                raise
            self._discard()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in _READER_GONE:
                raise
            self._discard()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self._stream, name)


def quiet_when_closed() -> None:
    """Make sys.stdout and sys.stderr discard output once their reader has gone (the command line's entry point
    calls this)."""
    if not isinstance(sys.stdout, QuietWhenClosed) and sys.stdout is not None:
        sys.stdout = QuietWhenClosed(sys.stdout)
    if not isinstance(sys.stderr, QuietWhenClosed) and sys.stderr is not None:
        sys.stderr = QuietWhenClosed(sys.stderr)


def stdout_reader_gone() -> bool:
    return isinstance(sys.stdout, QuietWhenClosed) and sys.stdout.reader_gone
