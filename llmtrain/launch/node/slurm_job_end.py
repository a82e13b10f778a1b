"""The end of a Slurm job's batch script: `python -m llmtrain.launch.node.slurm_job_end RUN_DIR SRUN_EXIT NOTICE_S
REQUEUE [NOTICED]`. It decides whether the run finished, and continues one that a time limit or a preemption notice
cut short (NOTICED=1: the batch shell got USR1, `--signal=B:USR1@N` or `scancel --batch --signal=USR1`, and passed
it on to the workers).

Before the time limit the job sends its steps USR1 (slurm_notice.py, NOTICE_S before it); the workers checkpoint and
exit cleanly, so
the job would end COMPLETED at a step short of train.max_steps and nothing would requeue it (`--requeue` acts on
node failures and preemption, not on a clean exit). So when the workers stopped on a signal with the time limit
near, the job requeues itself (`scontrol requeue`) and the requeued job resumes from that checkpoint. When it
cannot, the job fails with a message saying the run is unfinished and how to continue. A signal far from the time
limit (`llmtrain cancel`, a preempting launcher) is a stop the user asked for: not requeued.

A start that failed (a rank, a node's set-up) is recorded against its host in RUN_DIR/nodes.json and, with
cluster.requeue, requeued too: without the hosts the record holds bad, and not after
cluster.max_starts_without_progress starts in a row without a new checkpoint (slurm_requeue.py). A start that hung
(LLMTRAIN_HANG_WATCH=EXIT_HUNG: the job's hang watch stopped its steps, slurm_hang_watch.py) is a failed start
whose failure is the hang's verdict; the watch already recorded the hang against the culprit's host.
"""

from __future__ import annotations

import os
import sys
import time

from llmtrain.console import say
from llmtrain.launch.node import slurm_requeue
from llmtrain.errors import EXIT_FAILED
from llmtrain.launch.goodput_entry import slurm_start_ended
from llmtrain.launch.launch_record import job_launch
from llmtrain.launch.node.slurm_hang_watch import EXIT_HUNG
from llmtrain.launch.supervision.failures import rank_statuses
from llmtrain.rundir.paths import RunPaths
from llmtrain.slurm import client

EXIT_UNFINISHED = 3
# Slack on top of the notice: the save and the exit take a while after the signal.
NEAR_LIMIT_SLACK_S = 120


def seconds_left(job_id: str) -> float | None:
    """Seconds until the job's time limit, or None when it has none (or scontrol cannot tell)."""
    answer = client.show_job(job_id, timeout=30)
    if answer is None:
        return None
    try:
        end = time.mktime(time.strptime(answer.fields.get("EndTime", ""), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None  # EndTime=Unknown: no time limit
    return end - time.time()


def job_output(run_dir: str, job_id: str) -> str:
    try:
        with open(RunPaths(run_dir).slurm_output(job_id), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def failed_start(run_dir: str, srun_exit: int, may_requeue: bool, job_id: str, setup_failed: bool) -> int:
    """A start that failed: its culprit host goes into nodes.json, and with cluster.requeue the job requeues itself
    without the bad hosts, until the crash-loop breaker stops it. The launcher names the failed rank from the log."""
    if setup_failed:  # before slurm_job_start ran: this start was not noted yet
        slurm_requeue.start_began(run_dir, job_id, int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))
    culprit = slurm_requeue.failed_start(run_dir, job_id, job_output(run_dir, job_id), srun_exit, setup_failed)
    failure = culprit.summary() if culprit else f"the job's step exited {srun_exit}"
    return requeue_failed(run_dir, failure, srun_exit, may_requeue, job_id)


def hung_start(run_dir: str, may_requeue: bool, job_id: str) -> int:
    """A start the job's hang watch stopped: failed (EXIT_FAILED) with the verdict it wrote to job.json, or with
    cluster.requeue requeued as any failed start."""
    verdict = job_launch(run_dir, job_id).get("hang") or "llmtrain: hang: (no verdict recorded)"
    return requeue_failed(run_dir, verdict.removeprefix("llmtrain: "), EXIT_FAILED, may_requeue, job_id)


def requeue_failed(run_dir: str, failure: str, code: int, may_requeue: bool, job_id: str) -> int:
    """With cluster.requeue, requeue a failed start (0), unless the breaker or the bad hosts stop it (`code`)."""
    if not may_requeue:
        return code
    say(f"this start failed ({failure})")
    why = slurm_requeue.requeue_or_stop(run_dir, job_id, failure,
                                        f"requeueing job {job_id} to start again from the newest checkpoint")
    if why is None:
        return 0
    say(f"not requeued: {why}")
    return code


def job_end(run_dir: str, srun_exit: int, notice_s: float, may_requeue: bool, job_id: str,
            noticed: bool = False, setup_failed: bool = False, hung: bool = False) -> int:
    if hung:
        return hung_start(run_dir, may_requeue, job_id)
    if srun_exit != 0:
        return failed_start(run_dir, srun_exit, may_requeue, job_id, setup_failed)
    statuses = list(rank_statuses(run_dir).values())
    stopped = [s for s in statuses if s.get("status") == "preempted"]
    if not stopped:
        return 0  # every rank finished its steps
    step = max(int(s.get("step") or 0) for s in stopped)
    saved = all(s.get("saved", True) for s in stopped)
    left = None if noticed else seconds_left(job_id)
    if not noticed and (left is None or left > notice_s + NEAR_LIMIT_SLACK_S):
        say(f"stopped at step {step} on request (not the time limit); not requeued: the same llmtrain launch "
            "command continues from the newest checkpoint")
        return 0
    cause = "a preemption notice" if noticed else "the time limit"
    if may_requeue and saved:
        near = "came" if noticed else "is near"
        say(f"{cause} {near}: checkpoint at step {step} saved; requeueing job {job_id} to continue")
        why = slurm_requeue.requeue_or_stop(run_dir, job_id, None)
        if why is None:
            return 0
    else:
        why = "no checkpoint was saved" if not saved else "cluster.requeue=false"
    say(f"unfinished: stopped at step {step} before {cause}, and the job was not requeued ({why}); "
        "run the same llmtrain launch command to continue from the newest checkpoint")
    return EXIT_UNFINISHED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (4, 5):
        print("usage: python -m llmtrain.launch.node.slurm_job_end RUN_DIR SRUN_EXIT NOTICE_S REQUEUE [NOTICED]",
              file=sys.stderr)
        return 2
    run_dir, srun_exit, notice_s, may_requeue = argv[0], int(argv[1]), float(argv[2]), argv[3] == "1"
    noticed = argv[4:] == ["1"]
    # Set by the batch script when a cluster.setup line failed before srun (slurm.py).
    setup_failed = os.environ.get("LLMTRAIN_SETUP_FAILED") == "1"
    hung = os.environ.get("LLMTRAIN_HANG_WATCH") == str(EXIT_HUNG)
    slurm_start_ended(run_dir, os.environ.get("SLURM_JOB_ID", ""))  # before a requeue starts the next one
    return job_end(run_dir, srun_exit, notice_s, may_requeue, os.environ.get("SLURM_JOB_ID", ""), noticed,
                   setup_failed, hung)


if __name__ == "__main__":
    sys.exit(main())
