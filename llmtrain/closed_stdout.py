"""Output to a reader that stops early (`llmtrain plan | head -1`, a pager quit at once) is not an error.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError: a traceback, and exit 1, which for
`llmtrain plan` means "does not fit". Once stdout's reader is gone it is pointed at /dev/null instead, and the
command ends as it would have, with its own exit code. Only `follow`, whose output is all it does, stops then."""

from __future__ import annotations

import os
import sys


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
        except BrokenPipeError:
            self._discard()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self._stream, name)


def quiet_when_closed() -> None:
    """Make sys.stdout discard output once its reader has gone (the command line's entry point calls this)."""
    if not isinstance(sys.stdout, QuietWhenClosed) and sys.stdout is not None:
        sys.stdout = QuietWhenClosed(sys.stdout)


def stdout_reader_gone() -> bool:
    return isinstance(sys.stdout, QuietWhenClosed) and sys.stdout.reader_gone
