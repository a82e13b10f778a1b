"""What Slurm says about a job: `scontrol show job` (state, nodes, exit code) and `scancel`."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from llmtrain.launch.run_lock import SLURM_ENDED
from llmtrain.launch.backends.slurm_refusals import exit_code, parse_fields

# Not started yet: nothing runs, so there is nothing to checkpoint.
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


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
        return self.state in SLURM_ENDED

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES


def query(job_id: str) -> SlurmJob | None:
    """The job as scontrol shows it; None when scontrol is not here to ask (or does not answer)."""
    out = _scontrol("show", "job", str(job_id))
    if out is None:
        return None
    fields = parse_fields(out)
    if "JobState" not in fields:
        return SlurmJob(str(job_id), "UNKNOWN")
    nodelist = fields.get("NodeList", "(null)")
    nodes = _hostnames(nodelist) if nodelist not in ("", "(null)") else []
    reason = fields.get("Reason", "None")
    restarts = fields.get("Restarts", "0")
    return SlurmJob(str(job_id), fields["JobState"], nodes, exit_code(fields), "" if reason == "None" else reason,
                    int(restarts) if restarts.isdigit() else 0)


def _hostnames(nodelist: str) -> list[str]:
    """node[1-2] -> [node1, node2] (scontrol expands it); the list as given when that fails."""
    out = _scontrol("show", "hostnames", nodelist)
    return out.split() if out else [nodelist]


def _scontrol(*args: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return out.stdout


def scancel(*args: str) -> str | None:
    """Run scancel; None when it worked, else what went wrong, in one line."""
    try:
        out = subprocess.run(["scancel", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "scancel is not on PATH on this node"
    except subprocess.TimeoutExpired:
        return "scancel did not answer within 60 s"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout or "").strip().splitlines()
        return lines[-1] if lines else f"scancel exited with {out.returncode}"
    return None
