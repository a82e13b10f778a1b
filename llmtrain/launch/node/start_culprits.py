"""Which host a failed start of a Slurm job blames, and how, for RUN_DIR/nodes.json: read at the job's end from its
log (this start's part of it), the ranks' status and place files, and srun's own account.

- A cluster.setup line that failed in the batch shell: a start-up failure of the hosts srun names in its
  per-node error lines for that line (`srun: error: node2: task 1: Exited with exit code 1`: a line wrapped in
  `srun` fails on the nodes whose task failed), else of the job's first node (the batch shell runs there).
- No rank recorded its place in this start: a start-up failure of the node srun or torchrun names (the node agent,
  torchrun or the worker's imports failed there).
- Otherwise the culprit rank of launch/supervision/failures.py, on the host it ran on: a failure.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from llmtrain.launch.supervision.failures import agent_failures, failed_ranks, rank_statuses
from llmtrain.launch.supervision.placement import read_places
from llmtrain.rundir.paths import RunPaths

# The batch script's line at each start (slurm.py); the job's log is appended to by every start.
_START = re.compile(r"^llmtrain: job \d+ on \S+, rendezvous \S+ \(restart \d+\)$", re.MULTILINE)
_SRUN_EXITED = re.compile(r"srun: error: (\S+): tasks? [\d,-]+: Exited with exit code (\d+)")
# srun's line for each node whose task failed: exited, or killed by a signal (`task 1: Killed`).
_SRUN_TASK_FAILED = re.compile(r"^srun: error: ([^\s:]+): tasks? [\d,-]+: ", re.MULTILINE)
SETUP_BEGINS = "llmtrain: cluster.setup on "  # the batch script's line before the set-up lines of each start
SETUP_FAILED = "llmtrain: node set-up failed: "


@dataclass(frozen=True)
class Culprit:
    host: str
    kind: str  # "startup" or "failure" (node_ledger.KINDS)
    detail: str  # `rank 1 on node2 exited 1`; for a start-up failure, what failed (the host is said apart)
    also: tuple[str, ...] = ()  # other hosts where the same failed (a set-up line srun ran on several nodes)

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.host, *self.also)

    def summary(self) -> str:
        """The failure in a few words, host(s) included."""
        return self.detail if self.kind == "failure" else \
            f"start-up failure on {', '.join(self.hosts)}: {self.detail}"


def this_start(job_output: str) -> str:
    """The part of the job's log written by its newest start."""
    starts = list(_START.finditer(job_output))
    return job_output[starts[-1].start():] if starts else job_output


def _placed_since(run_dir: str, since: float) -> dict[int, dict]:
    out = {}
    for rank, place in read_places(run_dir).items():
        try:
            if os.path.getmtime(RunPaths(run_dir).rank_place(rank)) >= since:
                out[rank] = place
        except OSError:
            continue
    return out


def _how(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited {code}"


def setup_culprit(job_output: str, host: str) -> Culprit:
    """The hosts whose task srun said failed in the newest start's set-up (after its SETUP_BEGINS line, up to
    its failure line), else `host`, the batch shell's."""
    setup = job_output[job_output.rfind(SETUP_BEGINS):] if SETUP_BEGINS in job_output else this_start(job_output)
    failed_at = setup.rfind(SETUP_FAILED)
    said = setup[failed_at:].splitlines()[0][len(SETUP_FAILED):] if failed_at >= 0 else "cluster.setup failed"
    hosts = list(dict.fromkeys(m[1] for m in _SRUN_TASK_FAILED.finditer(setup[:max(failed_at, 0)])))
    return Culprit(hosts[0], "startup", said, tuple(hosts[1:])) if hosts else Culprit(host, "startup", said)


def start_culprit(run_dir: str, job_output: str, started_s: float, srun_exit: int) -> Culprit | None:
    """The host this start's failure blames, or None when nothing names one."""
    output = this_start(job_output)
    failures, statuses = agent_failures(output), rank_statuses(run_dir)
    placed = _placed_since(run_dir, started_s)
    ranks = failed_ranks(run_dir, output)
    if placed and ranks:
        rank = ranks[0]
        failure, status = failures.get(rank), statuses.get(rank, {})
        host = status.get("host") or placed.get(rank, {}).get("host") or (failure.host if failure else None)
        if host:
            how = _how(failure.code) if failure else f"failed (job exit code {srun_exit})"
            return Culprit(host, "failure", f"rank {rank} on {host} {how}")
    for rank in ranks:  # torchrun ran, no worker got as far as recording its place
        failure = failures.get(rank)
        if failure and failure.host:
            return Culprit(failure.host, "startup", f"rank {rank} {_how(failure.code)} before it started")
    exited = _SRUN_EXITED.findall(output)
    if exited and not placed:
        host, code = exited[0]
        return Culprit(host, "startup", f"the node's task exited {code} before any rank started")
    return None


def record_launch_failure(run_dir: str, agent_output: str, code: int, host: str) -> None:
    """For a launcher that watched its nodes (ssh, local): the culprit rank's host, else the node `host` whose
    agent failed, into nodes.json."""
    from llmtrain.rundir.node_ledger import record_node_event

    culprit = start_culprit(run_dir, agent_output, 0.0, code)
    if culprit is None or culprit.kind != "failure":
        culprit = Culprit(host, "failure", f"the node agent on {host} exited {code}")
    record_node_event(run_dir, culprit.host, culprit.kind, culprit.detail)
