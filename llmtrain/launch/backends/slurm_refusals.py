"""What Slurm's refusals mean for a launch: the pending reasons after which a job can never start and sbatch's
refusals, each with the config key behind it. No subprocess here: slurm.py asks (through llmtrain.slurm.client),
this module reads the answers."""

from __future__ import annotations

from omegaconf import ListConfig

import re

# Pending reasons after which the job cannot start until someone changes it or the cluster's configuration, each
# with the config key behind it. Kept conservative: reasons that can clear by themselves (Resources, Priority,
# Dependency, ReqNodeNotAvail, per-user or per-account limits that other jobs free when they end, ...) are shown and
# waited out. PartitionNodeLimit and PartitionConfig (which some Slurm versions give for the same request) also
# show while a partition's nodes are down, so they only count when the partition has fewer nodes than the job asks.
NODE_COUNT_REASONS = ("PartitionNodeLimit", "PartitionConfig")
NEVER_STARTS = {
    "PartitionNodeLimit": "cluster.nnodes",
    "PartitionConfig": "cluster.nnodes",
    "PartitionTimeLimit": "cluster.time",
    "BadConstraints": "cluster.sbatch_extra",
    "InvalidAccount": "cluster.account",
    "AccountNotAllowed": "cluster.account",
    "InvalidQOS": "cluster.sbatch_extra",
    "QOSMaxNodePerJobLimit": "cluster.nnodes",
    "QOSMaxWallDurationPerJobLimit": "cluster.time",
    "QOSMaxGRESPerJob": "cluster.gpus_per_node",
    "QOSMaxCpuPerJobLimit": "cluster.cpus_per_node",
    "AssocMaxNodesPerJobLimit": "cluster.nnodes",
    "AssocMaxWallDurationPerJobLimit": "cluster.time",
    "DependencyNeverSatisfied": "cluster.sbatch_extra",
}

# sbatch's refusals, matched in this order against its message, and the config key behind each; "cluster" when the
# message is about the job's size without telling which of the sizes (REQUEST_KEYS) it is.
SBATCH_REFUSALS = (
    (r"violates accounting/qos policy", "cluster"),
    (r"\baccount\b", "cluster.account"),
    (r"time limit|--time\b|time specification", "cluster.time"),
    (r"gres|gpu", "cluster.gpus_per_node"),
    (r"partition", "cluster.partition"),
    (r"\bcpus?\b|cpus-per-task|processors", "cluster.cpus_per_node"),
    (r"node count|--nodes\b", "cluster.nnodes"),
    (r"qos|constraint|feature|memory|--mem|unrecognized option|invalid option|invalid directive",
     "cluster.sbatch_extra"),
    (r"requested node configuration is not available|more processors requested than permitted", "cluster"),
)
# What an ambiguous refusal may be about.
REQUEST_KEYS = ("cluster.nnodes", "cluster.gpus_per_node", "cluster.cpus_per_node", "cluster.time")


def refusal_key(stderr: str) -> str | None:
    """The config key behind an sbatch refusal; None when its message names none (it is not about the request)."""
    text = stderr.lower()
    return next((key for pattern, key in SBATCH_REFUSALS if re.search(pattern, text)), None)


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def too_few_nodes(job: dict[str, str], partition: dict[str, str] | None) -> str | None:
    """Why a job pending for its node count (NODE_COUNT_REASONS) can never start (it asks for more nodes than its partition has
    or allows per job), or None when that cannot be told (the partition may just have nodes down)."""
    nodes = _int(job.get("NumNodes", "").split("-")[0])
    if nodes is None or not partition:
        return None
    name = partition.get("PartitionName", job.get("Partition", "?"))
    total, most = _int(partition.get("TotalNodes")), _int(partition.get("MaxNodes"))
    if total is not None and nodes > total:
        return f"cluster.nnodes={nodes}, but partition {name} has {total} node(s)"
    if most is not None and nodes > most:
        return f"cluster.nnodes={nodes}, but partition {name} allows {most} node(s) per job"
    return None


def never_starts(job: dict[str, str], partition: dict[str, str] | None) -> str | None:
    """Why a pending job can never start, or None while it may (see NEVER_STARTS)."""
    reason = job.get("Reason", "")
    if reason not in NEVER_STARTS:
        return None
    if reason in NODE_COUNT_REASONS:
        why = too_few_nodes(job, partition)
        return f"Reason={reason}: {why}" if why else None
    return f"Reason={reason}: check {NEVER_STARTS[reason]}"


def shown(value) -> str:
    """A config value as a refusal names it: null, a list in brackets, else its text."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, ListConfig)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
