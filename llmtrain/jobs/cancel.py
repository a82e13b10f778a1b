"""`llmtrain cancel RUN_DIR [--now]`: stop the job behind a run directory.

By default the job checkpoints and stops, as on preemption: its launcher gets SIGTERM (it asks the workers to
checkpoint at the next step boundary and stops them after launch.preempt_grace_s), a Slurm job's steps get USR1
(`scancel --signal=USR1`, as the launcher sends on preemption; not --full: the batch shell has no handler and would
die of it, ending the job before the workers saved); a pending Slurm job has nothing to save and is cancelled. --now stops it at once: two Ctrl-C (SIGINT) to the launcher, which then kills every
process of the job, and SIGKILL for what is left of it on this node; `scancel` for a Slurm job.

A run directory with no live job has nothing to cancel: that is said in one line, and the exit status is 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

from llmtrain.console import say
from llmtrain.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CancelError
from llmtrain.jobs import named_run_dir
from llmtrain.slurm.client import cancel as scancel
from llmtrain.jobs.job_state import UNKNOWN, JobState, describe_launcher, job_state, launcher_owned
from llmtrain.launch.supervision.line_follower import LineFollower
from llmtrain.rundir.paths import RunPaths

GRACE_MARGIN_S = 30  # beyond launch.preempt_grace_s: the launcher's own clean-up after the workers saved
NOW_WAIT_S = 60  # --now: time for the launcher to kill everything, or for Slurm to end the job
POLL_S = 0.5
SECOND_SIGINT_S = 0.5  # the second Ctrl-C must reach the launcher's clean-up, not coalesce with the first


def _signal_launcher(holder: dict, now: bool) -> str:
    """Signal the launcher named by the lock; what was done, in words."""
    pid, host = int(holder.get("pid", -1)), holder.get("host")
    if host != socket.gethostname():
        raise CancelError(f"the job's {describe_launcher(holder)} runs on another host: run llmtrain cancel there")
    try:
        os.kill(pid, signal.SIGINT if now else signal.SIGTERM)
    except ProcessLookupError:
        return f"the {describe_launcher(holder)} has just exited"
    except PermissionError:
        raise CancelError(f"not allowed to signal the {describe_launcher(holder)} (another user's job)") from None
    if not now:
        return f"asked the {describe_launcher(holder)} to checkpoint and stop (SIGTERM)"
    time.sleep(SECOND_SIGINT_S)
    with contextlib.suppress(ProcessLookupError):  # a launcher that stopped at the first one is gone already
        os.kill(pid, signal.SIGINT)
    return f"interrupted the {describe_launcher(holder)} twice (SIGINT): it kills every process of the job"


def _cancel_slurm(job: JobState, now: bool) -> str:
    job_id = job.holder["job"]
    if now or (job.slurm is not None and job.slurm.pending):
        error = scancel(job_id)
        did = f"cancelled Slurm job {job_id}" + ("" if now else f" ({job.slurm.state}: nothing ran, nothing to save)")
    else:
        error = scancel("--signal=USR1", job_id)
        did = f"asked Slurm job {job_id} to checkpoint and stop (USR1 to its workers)"
    if error:
        raise CancelError(f"could not cancel Slurm job {job_id}: {error}")
    return did


def stop_holder(job: JobState, now: bool) -> str:
    return _cancel_slurm(job, now) if job.holder.get("job") else _signal_launcher(job.holder, now)


def _holder_key(holder: dict) -> tuple:
    return holder.get("job"), holder.get("pid"), holder.get("host")


def wait_until_stopped(run_dir: str, job: JobState, now: bool, timeout_s: float) -> JobState:
    """Stop each holder the lock names in turn (a Slurm launcher hands the lock to its job as it exits) and wait
    until none is left or timeout_s passes; the trainer's own notes (preemption received, checkpoint saved) are
    passed on meanwhile."""
    log = LineFollower(RunPaths(run_dir).rank_log(0), from_end=True)
    deadline, stopped = time.monotonic() + timeout_s, set()
    while job.live and time.monotonic() < deadline:
        if _holder_key(job.holder) not in stopped:
            stopped.add(_holder_key(job.holder))
            say(stop_holder(job, now) + f"; waiting up to {timeout_s:.0f} s for the job to end")
            if job.state == UNKNOWN:
                return job  # scontrol cannot tell when it ends
        for line in log.new_lines():
            if line.startswith("llmtrain:"):
                print(f"  rank 0: {line}", flush=True)
        time.sleep(POLL_S)
        job = job_state(run_dir)
    return job


def run_cancel(args) -> int:
    from llmtrain.launch.supervision import processes
    from llmtrain.launch.run import checkpoint_state

    run_dir, cfg = named_run_dir.load(args.run_dir)
    job = job_state(run_dir)
    owned = launcher_owned(job.launch.get("backend") or cfg.cluster.name)
    if not job.live:
        left = processes.kill_all(cfg.run.dir) if args.now and owned else 0
        say(f"nothing to cancel: no job runs in {run_dir} ({job.state}: {job.reason})"
            + (f"; killed {left} leftover process(es) of it on this node" if left else ""))
        return EXIT_OK
    timeout = NOW_WAIT_S if args.now else cfg.launch.preempt_grace_s + GRACE_MARGIN_S
    try:
        job = wait_until_stopped(run_dir, job, args.now, timeout)
    except CancelError as e:
        say(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        say(f"stopped waiting; the job is still stopping (llmtrain status {run_dir} tells how it ends)")
        return EXIT_INTERRUPTED
    if job.state == UNKNOWN:
        say(f"{job.reason}: cannot tell when it ends; llmtrain status {run_dir} shows it later")
        return EXIT_OK
    if job.live:
        say(f"the job still runs after {timeout:.0f} s ({job.reason})"
            + ("" if args.now else f"; llmtrain cancel --now {run_dir} stops it at once"))
        return EXIT_FAILED
    left = processes.kill_all(cfg.run.dir) if args.now and owned else 0
    if left:
        say(f"killed {left} leftover process(es) of the job on this node (SIGKILL)")
    say(f"the job ended: {job.state}: {job.reason}")
    say(checkpoint_state(run_dir))
    return EXIT_OK
