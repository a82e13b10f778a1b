"""What a Slurm job's state (JobState, as `scontrol show job` prints it) means for llmtrain."""

from __future__ import annotations

import re

# The job has ended and will not run again by itself.
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                          "DEADLINE", "PREEMPTED"})
# UNKNOWN: the controller no longer knows the job (it ended long enough ago to be purged).
ENDED_STATES = FINAL_STATES | {"UNKNOWN"}
# Waiting or held, with no process started yet: nothing there can checkpoint, so stopping it means cancelling it.
NOT_STARTED_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                "RESV_DEL_HOLD"})


def exit_code(job: dict[str, str]) -> int | None:
    """ExitCode=code:signal as a shell's $? (a signal is 128 + its number); None when the job has none."""
    match = re.fullmatch(r"(\d+):(\d+)", job.get("ExitCode", ""))
    if not match:
        return None
    code, sig = int(match.group(1)), int(match.group(2))
    return code or (128 + sig if sig else 0)
