"""A Slurm start's shape (called by node/slurm_job_start.py in the batch shell, before srun): the nodes Slurm
granted (SLURM_NNODES, between cluster.min_nnodes and cluster.nnodes), the layout re-planned for them, recorded in
job.json for the workers, and one line in the job's log when it differs from the config's."""

from __future__ import annotations

import os
import signal

from llmtrain.config import load_run_config
from llmtrain.config.errors import ConfigError
from llmtrain.slurm.node_states import parse_sinfo, run_sinfo, split_hosts
from llmtrain.launch.launch_record import job_launch, note_job
from llmtrain.launch.shape.check import elastic
from llmtrain.launch.shape.slurm_node_count import SLURM_TIMEOUT_S, healthy_count, next_count, set_node_count
from llmtrain.launch.shape.replan import degrees, replan, shape_line
from llmtrain.launch.shape.start_record import record_facts
from llmtrain.rundir.paths import RunPaths
from llmtrain.slurm import client


def missing_words(partition: str | None, hosts: list[str] | None, excluded: str | None) -> str | None:
    """Why the partition's other nodes are not in this start, as sinfo and the job's exclusions tell."""
    text, _ = run_sinfo(partition)
    _, nodes = parse_sinfo(text, partition) if text else (None, [])
    left_out = set(split_hosts(excluded))
    out = [n.line() + (" (excluded)" if n.name in left_out else "") for n in nodes
           if n.name not in (hosts or []) and (not n.usable or n.name in left_out)]
    return "not in this start: " + "; ".join(out) if out else None


def grow_to(cfg, granted: int, excluded: str | None) -> int | None:
    """A start on fewer nodes than asked while more are healthy again (one came back since the job was requeued):
    the node count to start again on; None to go on with this one."""
    if granted >= cfg.cluster.nnodes:
        return None
    healthy = healthy_count(cfg.cluster.partition, split_hosts(excluded))
    count = next_count(granted, cfg.cluster.nnodes, healthy)
    return count if healthy is not None and count > granted else None


def record_slurm_start(run_dir: str, job_id: str, job_fields: dict[str, str],
                       grow: bool = True) -> tuple[str | None, int | None]:
    """Record this start's shape: (its line, None when the start has the nodes the config asks for and the previous
    start had too; the node count to requeue on first, when healthy nodes came back). Raises ConfigError when no
    layout fits the nodes granted."""
    try:
        cfg = load_run_config(RunPaths(run_dir).config)
    except ConfigError:  # no (readable) config.yaml: the workers say so themselves
        return None, None
    granted = int(os.environ.get("SLURM_NNODES", cfg.cluster.nnodes))
    more = grow_to(cfg, granted, job_fields.get("ExcNodeList")) if grow and elastic(cfg) else None
    if more is not None:
        return f"llmtrain: {more} of {cfg.cluster.nnodes} nodes are healthy now, {granted} in this start: " \
               f"requeueing job {job_id} to start on {more}", more
    hosts = client.hostnames(os.environ.get("SLURM_JOB_NODELIST", ""), timeout=30)
    shape = replan(cfg, granted)
    entry = job_launch(run_dir, job_id)
    previous = (entry.get("starts") or [None])[-1]
    note_job(run_dir, job_id, **record_facts(cfg, shape, hosts, entry))
    if not elastic(cfg) or (granted == cfg.cluster.nnodes and (previous or {}).get("nnodes", granted) == granted):
        return None, None
    if granted == cfg.cluster.nnodes:  # every node is back
        return (f"llmtrain: this start has all {granted} nodes again ({', '.join(hosts or [])}): "
                f"{previous['layout']} -> {degrees(cfg)} as configured"), None
    return shape_line(cfg, shape, hosts, missing_words(cfg.cluster.partition, hosts,
                                                       job_fields.get("ExcNodeList"))), None


def requeue_to_grow(job_id: str, count: int) -> str | None:
    """Requeue this job and pin its next start to `count` nodes (Slurm takes a node count only from a pending
    job); None when done, else why not. The requeue stops this process too: not before the pin."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        why = client.requeue(job_id, timeout=SLURM_TIMEOUT_S)
        if why is None:
            why = set_node_count(job_id, count)
    finally:
        signal.signal(signal.SIGTERM, before)
    return why
