"""The time-limit notice, sent by the job itself: `python -m llmtrain.launch.node.slurm_notice JOB_ID NOTICE_S`, run in
the background by the batch script while srun runs.

Slurm's own `--signal=USR1@N` is not used: a requeued job gets that notice at once when it starts again. So the
job sends it itself: this process reads the job's EndTime when the job starts and, NOTICE_S before it, sends USR1
to the job's steps (`scancel --signal=USR1`, which is what --signal does).
"""

from __future__ import annotations

import sys
import time

from llmtrain.launch.node.slurm_job_end import seconds_left
from llmtrain.slurm import client

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
    client.cancel("--signal=USR1", job_id, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
