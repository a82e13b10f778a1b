"""The Slurm job's own hang watch: `python -m llmtrain.launch.node.slurm_hang_watch RUN_DIR NNODES NPROC_PER_NODE
HANG_TIMEOUT_S EVIDENCE_WAIT_S`, run in the background by the batch script (on the job's first node) while srun runs.

A Slurm job runs on whether anyone follows it or not, so the job watches itself, as a launcher that owns its
processes does: the same detection (supervision/hang_watch.py), evidence and verdict (hang_report.py), said in the
job's log and written to the launch's entry in RUN_DIR/job.json ("hang"). Then it ends the job's steps with SIGKILL
(`scancel --signal=KILL JOB.STEP`: a hung rank answers no gentler signal, and the SIGCONT a plain scancel sends first
would wake a stopped rank into a stop that looks like a preemption) and exits EXIT_HUNG. The batch script hands
that to the job's end (slurm_job_end.py), which fails the start, or requeues it as it does any failed start
(cluster.requeue). A collective timeout ends the step by itself: its verdict is said, nothing is stopped, and the
watch ends. SIGTERM (srun has ended) stops the watch between two looks; once a hang is being handled it is ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from llmtrain.launch.launch_record import note_job
from llmtrain.launch.supervision.hang_report import collect, judge
from llmtrain.launch.supervision.hang_watch import HangWatch
from llmtrain.slurm import client

EXIT_HUNG = 3  # to the batch script: this watch stopped the job's steps
HUNG = "hung: "  # how the line saying so begins (after `llmtrain: `): a follower tells the stop by it
CHECK_S = 1.0  # as the launcher's own watch (monitor.HANG_CHECK_S)
SLURM_TIMEOUT_S = 60


def say(message: str) -> None:
    print(f"llmtrain: {message}", flush=True)


def end_steps(job_id: str) -> str | None:
    """SIGKILL every step srun started in the job (the batch step, which runs the job's end, is left); None when
    that worked, else why not."""
    steps = client.job_steps(job_id, SLURM_TIMEOUT_S)
    if not steps:
        return "squeue did not answer" if steps is None else "squeue lists no running step"
    failed = [why for step in steps if (why := client.cancel("--signal=KILL", step, timeout=SLURM_TIMEOUT_S))]
    return failed[0] if failed else None


def watch(run_dir: str, job_id: str, nnodes: int, world_size: int, timeout_s: float, evidence_wait_s: float,
          stop: threading.Event) -> int:
    hangs = HangWatch(run_dir, world_size, timeout_s)
    while not stop.wait(CHECK_S):
        why = hangs.poll()
        if why is None:
            continue
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the verdict and the stop are not cut short half-way
        say(f"hang suspected: {why}; gathering stacks and collective traces")
        folder = collect(run_dir, nnodes, evidence_wait_s)
        line = judge(run_dir, folder, world_size, nnodes, why)
        print(line, flush=True)
        say(f"hang evidence in {folder}")
        if hangs.reported_timeout:  # the timeout ends the step by itself
            return 0
        note_job(run_dir, job_id, hang=line)
        failed = end_steps(job_id)
        if failed is None:
            say(f"{HUNG}stopped job {job_id}'s steps (SIGKILL to every process srun started)")
        else:
            say(f"{HUNG}could not stop job {job_id}'s steps ({failed}): scancel {job_id} ends the job")
        return EXIT_HUNG
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_id = os.environ.get("SLURM_JOB_ID")
    if len(argv) != 5 or not job_id:
        print("usage (in a Slurm job): python -m llmtrain.launch.node.slurm_hang_watch RUN_DIR NNODES "
              "NPROC_PER_NODE HANG_TIMEOUT_S EVIDENCE_WAIT_S", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a preemption notice to the batch shell is for the workers
    run_dir, nnodes, nproc = argv[0], int(argv[1]), int(argv[2])
    return watch(run_dir, job_id, nnodes, nnodes * nproc, float(argv[3]), float(argv[4]), stop)


if __name__ == "__main__":
    sys.exit(main())
