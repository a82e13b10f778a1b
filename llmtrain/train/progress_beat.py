"""Each rank's heartbeat for hang detection: RUN_DIR/logs/rank{R}.progress, rewritten after every step with the
steps done in this attempt and the median time of its last MEDIAN_OF steps (the launcher's bound is a multiple of it). A file
per step and no collective: a hung rank must not be able to hold up its peers' heartbeats."""

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
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)  # an earlier attempt's steps are not this one's

    def step_done(self, step: int, step_s: float) -> None:
        self.step_times.append(step_s)
        self.steps += 1
        with contextlib.suppress(OSError):  # a full disk fails elsewhere, with a better message
            write_json(self.path, {"step": step, "steps": self.steps, "restart": self.restart,
                                   "median_step_s": statistics.median(self.step_times), "time": time.time()})
