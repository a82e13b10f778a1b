"""What the user sees while a job runs: a live rich progress line (step/total, loss, tokens/s, MFU when the row has
one to show (rundir/mfu_field.py), ETA) fed by metrics.jsonl, and rank 0's log streamed above it. Which rank failed
is worked out in failures.py.

Until the first worker exists, a torchrun agent under this launcher waits in its rendezvous; one that cannot
complete (a port someone else holds, a node that never joins) would wait silently, so the monitor says where it
waits after a while and gives up after launch.rendezvous_timeout_s. Once training steps, a rank that stops
completing them is a hang (hang_watch.py): the monitor gathers its evidence and verdict (hang_report.py) before
anything is stopped.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from llmtrain.console import get_console, plain, say
from llmtrain.launch.supervision import processes
from llmtrain.launch.supervision.combined_log import CombinedLog
from llmtrain.launch.supervision.hang_report import HangDetected, collect, judge
from llmtrain.launch.supervision.hang_watch import HangWatch
from llmtrain.launch.supervision.line_follower import LineFollower
from llmtrain.launch.supervision.restarts import RestartNotices
from llmtrain.rundir.mfu_field import shown_mfu
from llmtrain.rundir.paths import RunPaths

# Seconds without a worker before the launcher says it is still waiting for the rendezvous.
RENDEZVOUS_NOTICE_S = 30.0
# Seconds between two looks at the ranks' progress files (a thousand ranks are a thousand files).
HANG_CHECK_S = 1.0


class RendezvousTimeout(Exception):
    """No worker started within launch.rendezvous_timeout_s: the rendezvous did not complete."""


def _flag(argv: list[str], name: str) -> str | None:
    """The value of torchrun's --name=VALUE in argv."""
    prefix = f"--{name}="
    return next((a[len(prefix):] for a in argv if a.startswith(prefix)), None)


class RendezvousWatch:
    """Watches this launcher's own torchrun agents (cluster=local) until their first worker appears. Backends
    whose agents run elsewhere (ssh, Slurm) have none here, so the watch never fires for them."""

    def __init__(self, timeout_s: float | None, console: Console):
        self.timeout_s = timeout_s
        self.console = console
        self.start = time.monotonic()
        self.done = not timeout_s
        self.noticed = False

    def poll(self) -> None:
        if self.done:
            return
        agents, started = self._agents()
        if started:
            self.done = True
            return
        if not agents:
            return
        waited = time.monotonic() - self.start
        endpoint, nnodes = _flag(agents[0], "rdzv-endpoint"), _flag(agents[0], "nnodes")
        where = f"the rendezvous at {endpoint} ({nnodes} node(s) must join it)"
        if waited > self.timeout_s:
            raise RendezvousTimeout(f"no worker started within {self.timeout_s:g} s (launch.rendezvous_timeout_s): "
                                    f"{where} did not complete; check that the port is free and every node was "
                                    "started; stopping the job")
        if waited > min(RENDEZVOUS_NOTICE_S, self.timeout_s / 2) and not self.noticed:
            self.noticed = True
            say(f"waiting for {where}: no worker has started yet (giving up after "
                f"{self.timeout_s:g} s)", console=self.console)

    @staticmethod
    def _agents() -> tuple[list[list[str]], bool]:
        """argv of each torchrun agent under this launcher, and whether any worker runs."""
        agents, started = [], False
        for p in processes.job_processes():
            try:
                argv = p.cmdline()
            except psutil.Error:
                continue
            if any(argv[i] == "-m" and argv[i + 1] == "torch.distributed.run" for i in range(len(argv) - 1)):
                agents.append(argv)
            elif processes.is_worker(p):
                started = True
        return agents, started


def progress_mfu(row: dict) -> str:
    """The progress line's MFU field: empty when the row has none to show (no known peak)."""
    mfu = shown_mfu(row)
    return f"MFU {mfu:.1%}" if mfu is not None else ""


class Monitor:
    def __init__(self, run_dir: str, max_steps: int, console: Console | None = None, stream_rank: int = 0,
                 nnodes: int = 1, max_restarts: int = 0, rendezvous_timeout_s: float | None = None,
                 nproc_per_node: int = 1, combined_log: bool = False, hang_timeout_s: float | None = None,
                 hang_evidence_wait_s: float = 30.0):
        """combined_log: write logs/combined.log while following (the launcher of a job whose processes it
        owns; a Slurm job's batch script writes its own). hang_timeout_s: launch.hang_timeout_s; None: no hang
        detection. hang_evidence_wait_s: launch.hang_evidence_wait_s."""
        self.run_dir = run_dir
        self.console = console or get_console()
        self.log = LineFollower(RunPaths(run_dir).rank_log(stream_rank), from_end=True)
        self.metrics = LineFollower(RunPaths(run_dir).metrics)
        self.restarts = RestartNotices(run_dir, nnodes, max_restarts, nproc_per_node)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("{task.fields[mfu]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=False, disable=not self.console.is_terminal)
        self.task = self.progress.add_task("train", total=max_steps, loss="-", tps="-", mfu="")
        self.last_row: dict = {}
        self.rendezvous = RendezvousWatch(rendezvous_timeout_s, self.console)
        self.combined = CombinedLog(run_dir) if combined_log else None
        self.nnodes = nnodes
        self.hangs = HangWatch(run_dir, nnodes * nproc_per_node, hang_timeout_s) if hang_timeout_s else None
        self.hang_checked = 0.0
        self.hang_evidence_wait_s = hang_evidence_wait_s

    def poll(self) -> None:
        if self.combined is not None:
            self.combined.poll()
        for line in self.restarts.poll():
            plain(line, console=self.console)
        for line in self.log.new_lines():
            plain(line, console=self.console)
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
                                     mfu=progress_mfu(row))

    def check_hang(self) -> None:
        """Gather a hang's evidence and verdict while every process is still there. A collective timeout ends the
        job by itself (its verdict is said first); a stalled step raises HangDetected: the caller stops the job."""
        if self.hangs is None or time.monotonic() - self.hang_checked < HANG_CHECK_S:
            return
        self.hang_checked = time.monotonic()
        why = self.hangs.poll()
        if why is None:
            return
        self.console.print(f"llmtrain: hang suspected: {why}; gathering stacks and collective traces",
                           markup=False, highlight=False, soft_wrap=True)
        folder = collect(self.run_dir, self.nnodes, self.hang_evidence_wait_s)
        line = judge(self.run_dir, folder, self.hangs.world_size, self.nnodes, why)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self.console.print(f"llmtrain: hang evidence in {folder}", markup=False, highlight=False, soft_wrap=True)
        if not self.hangs.reported_timeout:
            raise HangDetected(line)

    def follow(self, poll_exit: Callable[[], int | None], interval_s: float = 0.3,
               timeout_s: float | None = None) -> int | None:
        """Refresh until poll_exit() returns an exit code (returned), or timeout_s passes (None); raises
        RendezvousTimeout when no worker starts in time."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.progress:
            while True:
                code = poll_exit()
                self.poll()
                if code is not None:
                    self.poll()
                    return code
                self.rendezvous.poll()
                self.check_hang()
                if deadline is not None and time.monotonic() > deadline:
                    return None
                time.sleep(interval_s)
