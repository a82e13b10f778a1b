"""The trainer's writer of metrics.jsonl (the file's format and its readers: llmtrain.rundir.metrics_file), which
also hands every row to TensorBoard and the experiment trackers. Rows are appended and flushed as they happen so
the launcher's live view and `tail -f` see them at once. A file deleted mid-run is recreated at the next row from
the rows the writer's open file still holds, so no row is lost.
"""

from __future__ import annotations

import os

from llmtrain.rundir.metrics_file import append_row, encode_row, keep_rows_until

from llmtrain.train.trackers.base import scalars
from llmtrain.rundir.atomic import atomic_write_bytes


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
            from llmtrain.train.trackers.tensorboard import TensorBoardWriter

            self.tensorboard = TensorBoardWriter(tensorboard_dir)
        if not path:
            return
        keep_rows_until(path, keep_until_step)
        self.file = open(path, "a+b", buffering=0)

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        self._follow_path()
        clean, line = encode_row(row)
        append_row(self.file.fileno(), line, self.path)
        if self.tensorboard is not None:
            self.tensorboard.add_scalars(row["step"], scalars(row))
            self.tensorboard.flush()
        if self.trackers is not None:
            self.trackers.log(clean)

    def event(self, row: dict, rewind_to: int | None = None) -> None:
        """An event row (a loss-spike rollback: {"step", "event", ...}) for the file alone, not the trackers;
        `rewind_to`: first drop the rows past that step, as a resume from it would (their steps are trained
        again)."""
        if self.file is None:
            return
        self._follow_path()
        if rewind_to is not None:
            keep_rows_until(self.path, rewind_to)
            self.file.close()  # rows out of order make it rewrite the file: write on the new one
            self.file = open(self.path, "a+b", buffering=0)
        append_row(self.file.fileno(), encode_row(row)[1], self.path)

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
            atomic_write_bytes(self.path, held)
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
