"""metrics.jsonl, a run directory's record of training: one JSON object per logged step (and per eval), non-finite
numbers written as null. The trainer writes it (llmtrain.train.metrics); the launcher's live view, `llmtrain status`,
`report` and `compare` read it here.

The file is only ever appended to, a whole row at a time (append_row: a write that fails, a full disk, is cut back
off, so no half row is left); a resume cuts off just the tail of rows past the resumed step. A malformed line is
skipped by every reader with a one-line warning and left in the file; an unfinished last line (a row being
written, or half a row left by an older writer that failed mid-row) is skipped quietly.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator

from llmtrain.errors import STORAGE_ERRNOS, StorageError
from llmtrain.rundir.atomic import atomic_writer


def encode_row(row: dict) -> tuple[dict, bytes]:
    """(the row with NaN and infinities as None, its line in the file)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    return clean, (json.dumps(clean) + "\n").encode()


def append_row(fd: int, line: bytes, path: str) -> None:
    """Append one encoded row (encode_row's line) to the file open at `fd` (O_APPEND), durably, whole or not at all:
    a write that fails partway (a full disk writes what fits, then refuses the rest) is cut back to the file's
    length before it. A full, over-quota or read-only storage raises StorageError naming `path`."""
    start = os.fstat(fd).st_size
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as e:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # a read-only file system: nothing was written either
        if e.errno in STORAGE_ERRNOS:
            raise StorageError(path, e) from e
        raise


def _lines(path: str) -> Iterator[tuple[int, int, bytes, dict | None]]:
    """(line number, byte offset, raw line, row or None if malformed) of every line of the file."""
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield number, offset, raw, _parse(raw)
            offset += len(raw)


def _parse(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _unfinished(raw: bytes, row: dict | None) -> bool:
    """The last line of a file still being written (or of a writer that was killed mid-line)."""
    return row is None and not raw.endswith(b"\n")


def _warn(path: str, numbers: list[int]) -> None:
    if numbers:
        shown = ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
        print(f"llmtrain: warning: {path}: skipped malformed line(s) {shown} (left in the file)", file=sys.stderr,
              flush=True)


def keep_rows_until(path: str, step: int) -> None:
    """Drop the rows past `step` (written after the checkpoint a run resumes from; a fresh start, step 0, keeps
    nothing), and nothing else: rows are in step order, so that is cutting the file's tail; only rows out of
    order make it rewrite the file."""
    if not os.path.exists(path) or step == 0:
        open(path, "w").close()
        return
    cut, stray, bad = None, False, []
    for number, offset, raw, row in _lines(path):
        if _unfinished(raw, row) or (row is not None and _step(row) > step):
            cut = offset if cut is None else cut
        elif cut is not None and row is not None:
            stray = True  # a row of a kept step after the cut: cutting would lose it
        elif row is None and cut is None and raw.strip():
            bad.append(number)
    _warn(path, bad)
    if stray:
        _rewrite_until(path, step)
    elif cut is not None:
        os.truncate(path, cut)
    _end_line(path)


def _end_line(path: str) -> None:
    """A kept last row without its newline (a writer killed between the two) must not run into the next row."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                f.write(b"\n")


def _step(row: dict) -> int:
    step = row.get("step")
    return step if isinstance(step, int) else 0


def _rewrite_until(path: str, step: int) -> None:
    with atomic_writer(path, "wb") as f:
        for _, _, raw, row in _lines(path):
            if not _unfinished(raw, row) and (row is None or _step(row) <= step):
                f.write(raw)


def read_metrics(path: str) -> list[dict]:
    """Every row of metrics.jsonl; a malformed line is skipped with a warning, one still being written quietly."""
    rows, bad = [], []
    try:
        for number, _, raw, row in _lines(path):
            if row is not None:
                rows.append(row)
            elif raw.strip() and not _unfinished(raw, row):
                bad.append(number)
    except FileNotFoundError:
        pass
    _warn(path, bad)
    return rows
