"""What the user sees while a job runs: a live rich progress line (step/total, loss, tokens/s, ETA) fed by
metrics.jsonl, rank 0's log streamed above it, and, when a rank fails, which one and the tail of its log."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class LineFollower:
    """Yields the complete new lines of a file that may not exist yet and keeps growing."""

    def __init__(self, path: str, from_end: bool = False):
        """from_end: skip what the file already holds (a rank log appended to by an earlier launch)."""
        self.path = path
        self.offset = os.path.getsize(path) if from_end and os.path.exists(path) else 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "r", errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()
        return lines


class Monitor:
    def __init__(self, run_dir: str, max_steps: int, console: Console | None = None, stream_rank: int = 0):
        self.run_dir = run_dir
        self.console = console or Console()
        self.log = LineFollower(os.path.join(run_dir, "logs", f"rank{stream_rank}.log"), from_end=True)
        self.metrics = LineFollower(os.path.join(run_dir, "metrics.jsonl"))
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("MFU {task.fields[mfu]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=False, disable=not self.console.is_terminal)
        self.task = self.progress.add_task("train", total=max_steps, loss="-", tps="-", mfu="-")
        self.last_row: dict = {}

    def poll(self) -> None:
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


_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def agent_failures(agent_output: str) -> dict[int, int]:
    """rank -> exit code of every failure in torchrun's summary (negative: killed by that signal)."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(agent_output)}


def failed_ranks(run_dir: str, agent_output: str) -> list[int]:
    """Failed ranks, the likely culprit first. A rank killed by a signal, or one that died without writing its
    status, comes before ranks that recorded an error: those usually failed because a peer vanished (a reset
    connection), and under load torchrun may observe them first."""
    failures = agent_failures(agent_output)
    statuses = rank_statuses(run_dir)
    root = agent_output.split("Root Cause", 1)
    root_rank = [int(r) for r, _ in _FAILURE.findall(root[1])[:1]] if len(root) == 2 else []
    errored = sorted(r for r, st in statuses.items() if st.get("status") == "error")
    silent = sorted(r for r in failures if r not in statuses or failures[r] < 0)
    ordered: list[int] = []
    for r in silent + root_rank + sorted(failures) + errored:
        if r not in ordered:
            ordered.append(r)
    return ordered


def rank_statuses(run_dir: str) -> dict[int, dict]:
    logs = os.path.join(run_dir, "logs")
    out = {}
    try:
        names = os.listdir(logs)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("rank") and name.endswith(".status"):
            try:
                with open(os.path.join(logs, name)) as f:
                    out[int(name[4:-7])] = json.load(f)
            except (OSError, ValueError):
                continue
    return out


def tail(path: str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except FileNotFoundError:
        return []


def report_failure(console: Console, run_dir: str, agent_output: str, exit_code: int, nproc_per_node: int) -> None:
    ranks = failed_ranks(run_dir, agent_output)
    if not ranks:
        console.print(f"[bold red]llmtrain: the job failed with exit code {exit_code}[/] (no rank reported an "
                      f"error; see {os.path.join(run_dir, 'logs')})")
        return
    rank = ranks[0]
    code = agent_failures(agent_output).get(rank)
    how = f"job exit code {exit_code}" if code is None else f"exit code {code}"
    if code is not None and code < 0:
        how = f"signal {-code}"
    node, local = divmod(rank, nproc_per_node)
    log = os.path.join(run_dir, "logs", f"rank{rank}.log")
    console.print(f"[bold red]llmtrain: rank {rank} (node {node}, local rank {local}) failed ({how})[/]; "
                  f"last lines of {log}:")
    for line in tail(log):
        console.print(f"  {line}", markup=False, highlight=False)
