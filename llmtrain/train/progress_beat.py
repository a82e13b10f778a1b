"""Each rank's heartbeat for hang detection: RUN_DIR/logs/rank{R}.progress, rewritten after every step with the
steps done in this attempt and the median time of its last MEDIAN_OF steps (the launcher's bound is a multiple of it). A file
per step and no collective: a hung rank must not be able to hold up its peers' heartbeats. An eval or a checkpoint
save is a phase: its beat says so when it starts and again when it ends, and the launcher does not time a rank
in one by its step time (a large model's save can take minutes; a collective stuck in it still ends in a
process-group timeout, which counts as a hang)."""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import time

from llmtrain.rundir.hang_files import progress_path, write_json

MEDIAN_OF = 1000  # steps: enough to ride out slow ones, few enough to sort every step


class ProgressBeat:
    def __init__(self, run_dir: str, rank: int):
        self.path = progress_path(run_dir, rank)
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        self.step_times: collections.deque[float] = collections.deque(maxlen=MEDIAN_OF)
        self.steps = 0
        self.step = 0
        self.beats = 0
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)  # an earlier attempt's steps are not this one's

    def step_done(self, step: int, step_s: float) -> None:
        self.step_times.append(step_s)
        self.steps += 1
        self.step = step
        self._write(None)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Around an eval or a checkpoint save: the launcher sees the phase begin and end."""
        self._write(name)
        try:
            yield
        finally:
            self._write(None)

    def _write(self, phase: str | None) -> None:
        if not self.step_times:
            return  # before the first step the launcher does not watch
        self.beats += 1
        with contextlib.suppress(OSError):  # a full disk fails elsewhere, with a better message
            write_json(self.path, {"step": self.step, "steps": self.steps, "beats": self.beats, "phase": phase,
                                   "restart": self.restart, "median_step_s": statistics.median(self.step_times),
                                   "time": time.time()})
