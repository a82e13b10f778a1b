"""Files replaced whole: a temp file beside the target, fsync, rename; and signals held back while a pair of
such renames must happen together."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from typing import BinaryIO, Iterator

from llmtrain.rundir.atomic import fsync_dir

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then take effect as usual (their handlers run then), so
    what runs inside is not cut short. Handlers, not a signal mask: any thread may receive a process's signal."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and runs them)
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])


@contextlib.contextmanager
def atomic_write(path: str, prefix: str | None = None) -> Iterator[BinaryIO]:
    """Yield a temp file beside `path` (its name starting with `prefix`, default `.NAME.`); on success fsync it and
    rename it over `path`, else delete it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix or f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache should stay readable
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
