"""The warning for a run-directory record the launcher could not write (a full disk): one line on stderr, and the
launcher goes on to report how the job ended and exit with its code."""

from __future__ import annotations

import sys

from llmtrain.errors import STORAGE_ERRNOS


def unwritten_line(path: str, err: OSError, what: str = "") -> str:
    """`llmtrain: warning: could not write PATH (what it would have held): no space left on device`."""
    reason = STORAGE_ERRNOS.get(err.errno) or (err.strerror or str(err)).lower()
    return f"llmtrain: warning: could not write {path}{f' ({what})' if what else ''}: {reason}"


def warn_unwritten(path: str, err: OSError, what: str = "") -> None:
    try:
        print(unwritten_line(path, err, what), file=sys.stderr, flush=True)
    except OSError:  # stderr on the same full disk, or a closed terminal: nothing more to say it with
        pass
