"""metrics.jsonl: one JSON object per logged step (and per eval), appended and flushed as it happens so the
launcher's live view and `tail -f` see it at once.

The file is only ever appended to; a resume cuts off just the tail of rows past the resumed step. A malformed
line is skipped by every reader with a one-line warning and left in the file. A file deleted mid-run is recreated
at the next row from the rows the writer's open file still holds, so no row is lost.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator

from llmtrain.train.trackers.base import scalars


class MetricsWriter:
    def __init__(self, path: str | None, keep_until_step: int = 0, tensorboard_dir: str | None = None,
                 trackers=None):
        """Open `path` keeping only rows with step <= keep_until_step (0: a fresh run starts an empty file);
        with tensorboard_dir, every row also goes to TensorBoard event files there, and with `trackers` (started
        experiment trackers, llmtrain.train.trackers.fanout.Trackers) to their runs."""
        self.file = None
        self.path = path
        self.tensorboard = None
        self.trackers = trackers
        if tensorboard_dir:
            from llmtrain.report.tensorboard import TensorBoardWriter

            self.tensorboard = TensorBoardWriter(tensorboard_dir)
        if not path:
            return
        keep_rows_until(path, keep_until_step)
        self.file = open(path, "a+b", buffering=0)

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        self._follow_path()
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.file.write((json.dumps(clean) + "\n").encode())
        os.fsync(self.file.fileno())
        if self.tensorboard is not None:
            self.tensorboard.add_scalars(row["step"], scalars(row))
            self.tensorboard.flush()
        if self.trackers is not None:
            self.trackers.log(clean)

    def _follow_path(self) -> None:
        """Write on where the path points now: a deleted file (or a folder cleaned up mid-run) is recreated with
        every row it held, which the open file still has; a file put in its place is appended to."""
        try:
            if os.path.samestat(os.fstat(self.file.fileno()), os.stat(self.path)):
                return
            what = "was replaced during the run; appending to the new file"
        except FileNotFoundError:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            held = os.pread(self.file.fileno(), os.fstat(self.file.fileno()).st_size, 0)
            tmp = f"{self.path}.tmp"
            with open(tmp, "wb") as f:
                f.write(held)
            os.replace(tmp, self.path)
            rows = held.count(b"\n")
            what = f"was deleted during the run; recreated it with the {rows} row(s) written so far"
        self.file.close()
        self.file = open(self.path, "a+b", buffering=0)
        print(f"llmtrain: warning: {self.path} {what}", flush=True)

    def close(self, status: str = "finished") -> None:
        """`status` (finished, failed, preempted): how the launch ended, for the trackers' runs. Closing twice
        is harmless: the first close decides."""
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.trackers is not None:
            self.trackers.finish(status)
            self.trackers = None


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
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        for _, _, raw, row in _lines(path):
            if not _unfinished(raw, row) and (row is None or _step(row) <= step):
                f.write(raw)
    os.replace(tmp, path)


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
