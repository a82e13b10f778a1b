"""The start of a Slurm job's batch script: `python -m llmtrain.launch.node.slurm_job_start RUN_DIR`.

One job per run directory, however the job was started: `llmtrain launch` takes RUN_DIR/.lock before it submits,
but the rendered script (RUN_DIR/slurm/job.sbatch) can be submitted again by hand. So the job itself takes the lock
before anything else runs (run_lock.claim_for_job): a job that finds the directory held by another job or launcher
says so in one line in its log and exits 1 before any worker starts. A requeued start of the same job is let in.
Then the start's goodput timeline begins (its queue wait from scontrol; slurm_job_end writes the ledger entry), and
an earlier start's hang verdict leaves the launch's entry in job.json (it stays in RUN_DIR/hangs/): a requeued start
has not hung.
"""

from __future__ import annotations

import os
import sys
import time

from llmtrain.config.errors import ConfigError
from llmtrain.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from llmtrain.launch.node.slurm_requeue import start_began
from llmtrain.launch.goodput_entry import close_unended_start, slurm_queue_s, slurm_start_began
from llmtrain.launch.launch_record import job_launch, note_job
from llmtrain.launch.run_lock import claim_for_job
from llmtrain.launch.shape.slurm_start import record_slurm_start, requeue_to_grow
from llmtrain.slurm import client

# How long a start that requeued itself to grow waits for Slurm to stop it (KillWait is 30 s by default).
GROW_WAIT_S = 120


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_id = os.environ.get("SLURM_JOB_ID")
    if len(argv) != 1 or not job_id:
        print("usage (in a Slurm job): python -m llmtrain.launch.node.slurm_job_start RUN_DIR", file=sys.stderr)
        return EXIT_USAGE
    try:
        claim_for_job(argv[0], job_id)
    except ConfigError as e:
        print(f"llmtrain: error: {e.key}: Slurm job {job_id} does not start: {e.message}", flush=True)
        return EXIT_FAILED  # the job fails before any worker starts; its submission was not bad input
    # The checkpoint this start begins from: the job's end tells progress by it (the crash-loop breaker).
    start_began(argv[0], job_id, int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))
    if job_launch(argv[0], job_id).get("hang"):
        note_job(argv[0], job_id, hang=None)
    close_unended_start(argv[0], job_id)  # before this start's shape is recorded: the entry takes the last one's
    answer = client.show_job(job_id, timeout=30)
    try:  # a start on fewer (or again all) nodes: the layout for the nodes granted, said in one line
        line, grow = record_slurm_start(argv[0], job_id, answer.fields if answer else {})
    except ConfigError as e:
        print(f"llmtrain: error: {e.key}: Slurm job {job_id} does not start: {e.message}", flush=True)
        return EXIT_FAILED
    if line:
        print(line, flush=True)
    if grow is not None:
        why = requeue_to_grow(job_id, grow)
        if why is None:
            time.sleep(GROW_WAIT_S)  # the requeue stops this start; srun must not run meanwhile
        print(f"llmtrain: this start goes on without the nodes that came back: {why or 'the requeue did not stop it'}",
              flush=True)
        line, _ = record_slurm_start(argv[0], job_id, answer.fields if answer else {}, grow=False)
        if line:
            print(line, flush=True)
    requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
    slurm_start_began(argv[0], slurm_queue_s(argv[0], answer.fields, requeued) if answer else 0.0)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
