"""How many nodes a Slurm start of a run that accepts fewer (cluster.min_nnodes) asks for.

Slurm's schedulers start a job of `--nodes=MIN-MAX` on MIN nodes when nothing asks for more (the backfill
scheduler does even with every node idle), and a run should not train on fewer nodes while healthy ones are only
busy: they free up. So each start is pinned to the partition's healthy nodes (up, not drained or down, not
excluded), at most cluster.nnodes and at least cluster.min_nnodes: at submission (sbatch --hold, the count, then
release) and at every requeue the job does itself. A start then shrinks only for nodes that are down, drained or
left out, and grows back once they return.
"""

from __future__ import annotations

from llmtrain.slurm.node_states import parse_sinfo, run_sinfo
from llmtrain.launch.shape.check import min_nnodes
from llmtrain.slurm import client

SLURM_TIMEOUT_S = 30


def healthy_count(partition: str | None, excluded: list[str]) -> int | None:
    """The partition's nodes a job can run on, less `excluded`; None when sinfo cannot say."""
    text, _ = run_sinfo(partition)
    if text is None:
        return None
    _, nodes = parse_sinfo(text, partition)
    return sum(1 for n in nodes if n.usable and n.name not in excluded)


def next_count(fewest: int, most: int, healthy: int | None) -> int:
    """The node count to pin: the healthy nodes within [fewest, most]; `most` when their number is not known."""
    if healthy is None:
        return most
    return max(fewest, min(most, healthy))


def set_node_count(job_id: str, count: int) -> str | None:
    """A pending job's node count; None when Slurm took it, else why not. One task per node (the node agent): the
    task count follows, or Slurm keeps asking for the old node count."""
    return client.update_job(job_id, f"NumNodes={count}", f"NumTasks={count}", timeout=SLURM_TIMEOUT_S)


def pin_node_count(job_id: str, fewest: int, most: int, partition: str | None, excluded: list[str]) -> str | None:
    """Set the pending job's node count for its next start; a line saying what went wrong, or None."""
    count = next_count(fewest, most, healthy_count(partition, excluded))
    why = set_node_count(job_id, count)
    return None if why is None else f"could not set job {job_id}'s node count to {count}: {why}"


def release_pinned(job_id: str, cfg) -> None:
    """A held job just submitted: pinned to the healthy nodes (its --exclude left out), then released. A failure to
    pin is said and the job released as it is (Slurm then picks within --nodes=MIN-MAX)."""
    from llmtrain.console import say

    c = cfg.cluster
    excluded = [n.strip() for n in (c.exclude or "").replace("@", ",").split(",") if n.strip()]
    why = pin_node_count(job_id, min_nnodes(cfg), c.nnodes, c.partition, excluded)
    if why:
        say(why)
    why = client.release(job_id, timeout=SLURM_TIMEOUT_S)
    if why:
        say(f"could not release held job {job_id} (scontrol release {job_id} starts it): {why}")
