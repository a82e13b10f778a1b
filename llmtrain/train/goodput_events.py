"""Rank 0's timeline for the goodput ledger: RUN_DIR/logs/goodput-events.jsonl, one line per event, wall clock.

Events: `train` (the loop begins, at the step resumed from), `step` (a logged step done), `save` (a checkpoint
save returned; `blocked_s` is how long training waited for it) and `end` (the loop finished). Each carries the
torchrun restart (`attempt`) and the Slurm requeue count. Lines are appended unbuffered, so a rank killed mid-run
leaves every event before it. The launcher side turns them into RUN_DIR/goodput.json (llmtrain.rundir.goodput).
"""

from __future__ import annotations

import json
import os
import time

from llmtrain.rundir.goodput import events_path

class GoodputEvents:
    def __init__(self, run_dir: str, enabled: bool):
        """enabled: on rank 0 only (one timeline per job)."""
        self.path = events_path(run_dir) if enabled else None
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.requeue = int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    def record(self, event: str, step: int, **extra) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "t": time.time(), "step": step, "attempt": self.attempt,
                           "requeue": self.requeue, **extra}) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:  # a full disk costs the ledger an event, never the training
            pass
