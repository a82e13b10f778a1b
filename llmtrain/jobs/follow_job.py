"""`llmtrain follow RUN_DIR`: the launcher's live view of a job, attached from any terminal of the head node.

Rank 0's log and the progress line come from the run directory (launch's Monitor), until the job ends: its lock
is released, its holder is gone, or its Slurm job reached a final state. Ctrl-C only detaches, and so does a
closed pipe (`llmtrain follow RUN | head`).
"""

from __future__ import annotations

import time

from llmtrain.closed_stdout import ReaderGone, stdout_reader_gone
from llmtrain.console import get_console, plain, say
from llmtrain.errors import EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED
from llmtrain.jobs import named_run_dir
from llmtrain.jobs.job_state import (FAILED, FINISHED, HUNG_UP, INTERRUPTED, PREEMPTED, STOPPED, UNKNOWN, JobState,
                                    job_state)
from llmtrain.jobs.status import facts

EXIT_BY_STATE = {FINISHED: EXIT_OK, STOPPED: EXIT_OK, FAILED: EXIT_FAILED, INTERRUPTED: EXIT_INTERRUPTED,
                 PREEMPTED: EXIT_PREEMPTED, HUNG_UP: EXIT_HANGUP, UNKNOWN: EXIT_FAILED}
SLURM_POLL_S = 2.0  # how often scontrol is asked, as the launcher does


def summary(run_dir: str, cfg, job: JobState) -> str:
    """One line: how the job ended (or stands), the step it reached and its newest checkpoint."""
    f = facts(run_dir, cfg, job)
    checkpoint = f"checkpoint step {f['checkpoint']['step']} in {f['checkpoint']['path']}" if f["checkpoint"] \
        else "no checkpoint"
    return f"llmtrain: {job.state}: {job.reason}; step {f['step']}/{f['max_steps']}; {checkpoint}"


class JobWatch:
    """Tells the monitor when the job has ended, and says when its state changes (a Slurm job that starts)."""

    def __init__(self, run_dir: str, console, job: JobState):
        self.run_dir = run_dir
        self.console = console
        self.job = job
        self.checked = time.monotonic()

    def _slurm(self) -> bool:
        return self.job.slurm is not None or bool(self.job.holder.get("job"))

    def poll(self) -> int | None:
        if self._slurm() and time.monotonic() - self.checked < SLURM_POLL_S:
            return None
        self.checked = time.monotonic()
        job = job_state(self.run_dir)
        if job.live and (job.state, job.job_id) != (self.job.state, self.job.job_id):
            say(f"{job.state}: {job.reason}", console=self.console)
        self.job = job
        return None if job.live else EXIT_BY_STATE.get(job.state, EXIT_FAILED)


def run_follow(args) -> int:
    from llmtrain.launch.supervision.monitor import Monitor

    run_dir, cfg = named_run_dir.load(args.run_dir)
    console = get_console()
    job = job_state(run_dir)
    if job.state == UNKNOWN:
        say(f"cannot follow: {job.reason}", console=console)
        return EXIT_BY_STATE[UNKNOWN]
    if not job.live:
        plain(summary(run_dir, cfg, job), console=console)
        return EXIT_BY_STATE.get(job.state, EXIT_FAILED)
    say(f"following {run_dir}: {job.state}, {job.reason} (Ctrl-C stops following; the job "
        "keeps running)", console=console)
    monitor = Monitor(run_dir, cfg.train.max_steps, console, nnodes=cfg.cluster.nnodes,
                      max_restarts=cfg.launch.max_restarts, nproc_per_node=cfg.cluster.nproc_per_node)
    watch = JobWatch(run_dir, console, job)

    def poll() -> int | None:
        if stdout_reader_gone():  # `llmtrain follow RUN | head`: nobody reads any more, so stop as on Ctrl-C
            raise ReaderGone
        return watch.poll()

    try:
        monitor.follow(poll)
    except (KeyboardInterrupt, ReaderGone):
        say("stopped following; the job keeps running", console=console)
        return EXIT_OK
    plain(summary(run_dir, cfg, watch.job), console=console)
    return EXIT_BY_STATE.get(watch.job.state, EXIT_FAILED)
