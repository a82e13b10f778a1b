"""What the user sees while a job runs: a live rich progress line (step/total, loss, tokens/s, ETA) fed by
metrics.jsonl, and rank 0's log streamed above it. Which rank failed is worked out in failures.py."""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from llmtrain.console import get_console
from llmtrain.launch.follow import LineFollower
from llmtrain.launch.restarts import RestartNotices


class Monitor:
    def __init__(self, run_dir: str, max_steps: int, console: Console | None = None, stream_rank: int = 0,
                 nnodes: int = 1, max_restarts: int = 0):
        self.run_dir = run_dir
        self.console = console or get_console()
        self.log = LineFollower(os.path.join(run_dir, "logs", f"rank{stream_rank}.log"), from_end=True)
        self.metrics = LineFollower(os.path.join(run_dir, "metrics.jsonl"))
        self.restarts = RestartNotices(run_dir, nnodes, max_restarts)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("MFU {task.fields[mfu]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=False, disable=not self.console.is_terminal)
        self.task = self.progress.add_task("train", total=max_steps, loss="-", tps="-", mfu="-")
        self.last_row: dict = {}

    def poll(self) -> None:
        for line in self.restarts.poll():
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in self.log.new_lines():
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in self.metrics.new_lines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in row:
                self.last_row = row
                loss = row["loss"]
                self.progress.update(self.task, completed=row["step"],
                                     loss=f"{loss:.4f}" if isinstance(loss, float) else str(loss),
                                     tps=f"{row.get('tokens_per_s', 0):,.0f}",
                                     mfu=f"{row['mfu']:.1%}" if isinstance(row.get("mfu"), float) else "-")

    def follow(self, poll_exit: Callable[[], int | None], interval_s: float = 0.3,
               timeout_s: float | None = None) -> int | None:
        """Refresh until poll_exit() returns an exit code (returned), or timeout_s passes (None)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.progress:
            while True:
                code = poll_exit()
                self.poll()
                if code is not None:
                    self.poll()
                    return code
                if deadline is not None and time.monotonic() > deadline:
                    return None
                time.sleep(interval_s)
