"""The time-limit notice, sent by the job itself: `python -m llmtrain.launch.slurm_notice JOB_ID NOTICE_S`, run in
the background by the batch script while srun runs.

Slurm's own `--signal=USR1@N` is kept, but a requeued job cannot count on it: on the two-node test cluster (Slurm
22.05) the second requeue of a job got its notice at once, at the start, and to the batch shell rather than to the
job's steps. So this process reads the job's EndTime when the job starts and, NOTICE_S before it, sends USR1 to the
job's steps (`scancel --signal=USR1`, as --signal does); a second notice is harmless (the workers' flag is set once).
"""

from __future__ import annotations

import subprocess
import sys
import time

from llmtrain.launch.slurm_job_end import seconds_left

POLL_S = 5.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m llmtrain.launch.slurm_notice JOB_ID NOTICE_S", file=sys.stderr)
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
