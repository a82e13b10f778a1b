"""The time-limit notice, sent by the job itself: `python -m llmtrain.launch.node.slurm_notice JOB_ID NOTICE_S`, run in
the background by the batch script while srun runs.

Slurm's own `--signal=USR1@N` does this for a job's first start, but not for a requeued one: on the two-node test
cluster (Slurm 22.05) every requeued start got its notice at once, so it checkpointed and stopped again after a few
steps (or, before srun started, the batch shell died of it). So the job sends it itself: this process reads the
job's EndTime when the job starts and, NOTICE_S before it, sends USR1 to the job's steps (`scancel
--signal=USR1`, which is what --signal does).
"""

from __future__ import annotations

import subprocess
import sys
import time

from llmtrain.launch.node.slurm_job_end import seconds_left

POLL_S = 5.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m llmtrain.launch.node.slurm_notice JOB_ID NOTICE_S", file=sys.stderr)
        return 2
    job_id, notice_s = argv[0], float(argv[1])
    left = seconds_left(job_id)
    if left is None:
        return 0  # no time limit
    due = time.monotonic() + left - notice_s
    while time.monotonic() < due:
        time.sleep(min(POLL_S, max(0.0, due - time.monotonic())))
    subprocess.run(["scancel", "--signal=USR1", job_id], capture_output=True, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
