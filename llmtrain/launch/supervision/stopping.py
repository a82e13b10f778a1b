"""Stopping a job from the launcher: gracefully first (the workers may checkpoint), at once on a second Ctrl-C.

A graceful stop can take a while (a hung rank never answers SIGTERM); a second Ctrl-C then kills every process of
the job with SIGKILL instead of interrupting the clean-up half-way and leaving processes behind.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from rich.console import Console

from llmtrain.console import say
from llmtrain.launch.supervision import processes

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)  # SIGHUP: a closed terminal, handled alike


def _ignore(signals) -> None:
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def starting_workers(run_dir: str, sig: int) -> list:
    """This node's workers that do not handle sig yet: still starting (the trainer installs its preemption
    handler after the process group is up). Until then sig is ignored, or kills them: it must wait."""
    return [p for p in processes.job_processes(run_dir) if processes.is_worker(p) and processes.handles_signal(p.pid, sig) is False]


def wait_for_workers(run_dir: str, sig: int, timeout_s: float, poll: Callable[[], None]) -> None:
    """Wait (up to timeout_s) until every local worker handles sig; poll() meanwhile keeps the output flowing."""
    deadline = time.monotonic() + timeout_s
    while starting_workers(run_dir, sig) and time.monotonic() < deadline:
        poll()
        time.sleep(0.3)


def _scope(backend, run_dir: str) -> str | None:
    """Whose processes a stop may kill besides the launcher's own: the run's, unless the job belongs to a
    scheduler (a Slurm job's processes are Slurm's to end, even where this node can see them)."""
    return run_dir if backend.owns_processes else None


def kill_job(run_dir: str | None, console: Console) -> None:
    """SIGKILL every process of the job now, and say so."""
    _ignore([signal.SIGINT])  # a third Ctrl-C must not cut the kill short
    n = processes.kill_all(run_dir)
    say(f"interrupted again: killed the job's {n} remaining process(es) at once (SIGKILL)", console=console)


def stop_job(backend, run_dir: str, console: Console) -> bool:
    """backend.stop(), or kill_job() when Ctrl-C arrives during it; True when the job had to be killed.

    Another SIGTERM/SIGUSR1 asks for nothing new while the job stops, and once it is stopped the launcher only
    reports and exits: neither may end it with a traceback half-way."""
    _ignore(PREEMPT_SIGNALS)
    scope = _scope(backend, run_dir)
    try:
        backend.stop()
        processes.kill_all(scope)  # what the backend did not know of (a start cut short by the signal)
        killed = False
    except KeyboardInterrupt:
        kill_job(scope, console)
        killed = True
    _ignore([signal.SIGINT])
    return killed


def interrupted(backend, run_dir: str, console: Console) -> None:
    """Ctrl-C while the job runs: stop it gracefully; a second Ctrl-C kills it."""
    try:
        say("interrupted; stopping every process of the job (Ctrl-C again kills them at once)", console=console)
    except KeyboardInterrupt:
        kill_job(_scope(backend, run_dir), console)
        return
    stop_job(backend, run_dir, console)


def stopped_early(why: str, code: int, before_start: str = "stopped before any worker started") -> int:
    """A Ctrl-C or SIGTERM that reached the top of the launcher (it came before the job started, or between two
    steps of a stop): kill whatever the launcher started and say so in one line instead of a traceback."""
    _ignore((signal.SIGINT,) + PREEMPT_SIGNALS)
    n = processes.kill_all()
    said = f"killed the {n} process(es) it had started" if n else before_start
    say(f"{why}: {said}")
    return code
