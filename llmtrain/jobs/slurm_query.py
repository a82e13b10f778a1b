"""A Slurm job as `llmtrain status/cancel/follow` read it: state, nodes, exit code, pending reason, restarts."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtrain.slurm import client
from llmtrain.slurm.job_states import ENDED_STATES, NOT_STARTED_STATES, exit_code


@dataclass
class SlurmJob:
    job_id: str
    state: str  # "UNKNOWN" once the job has left the controller
    nodes: list[str] = field(default_factory=list)
    exit_code: int | None = None
    reason: str = ""
    restarts: int = 0  # how many times Slurm requeued it

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def pending(self) -> bool:
        return self.state in NOT_STARTED_STATES


def query(job_id: str) -> SlurmJob | None:
    """The job as scontrol shows it; None when scontrol is not here to ask (or does not answer)."""
    answer = client.show_job(str(job_id), timeout=30)
    if answer is None:
        return None
    fields = answer.fields
    if "JobState" not in fields:
        return SlurmJob(str(job_id), "UNKNOWN")
    nodelist = fields.get("NodeList", "(null)")
    nodes = (client.hostnames(nodelist, timeout=30) or [nodelist]) if nodelist not in ("", "(null)") else []
    reason = fields.get("Reason", "None")
    restarts = fields.get("Restarts", "0")
    return SlurmJob(str(job_id), fields["JobState"], nodes, exit_code(fields), "" if reason == "None" else reason,
                    int(restarts) if restarts.isdigit() else 0)
