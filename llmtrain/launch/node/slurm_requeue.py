"""The Slurm job's own requeue, at the end of a start (slurm_job_end.py): record the start in RUN_DIR/nodes.json,
stop after too many starts without progress (the crash-loop breaker), leave the bad hosts out of the next start
(`scontrol update JobId=ID ExcNodeList=...`), then `scontrol requeue`. The rules are requeue_policy.py's.

The keys come from RUN_DIR/config.yaml (the run's frozen config), with the schema's defaults for a run directory
written before they existed.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass

from omegaconf import OmegaConf

from llmtrain.checkpoint.store import newest_step
from llmtrain.errors import ObjectStoreError
from llmtrain.launch.launch_record import note_job
from llmtrain.launch.node.requeue_policy import (breaker_reason, exclusion, note_end, note_start,
                                                 too_few_left)
from llmtrain.launch.node.start_culprits import Culprit, setup_culprit, start_culprit
from llmtrain.launch.shape.slurm_node_count import pin_node_count
from llmtrain.slurm.node_states import split_hosts
from llmtrain.rundir.node_ledger import add_event, now_text, read_ledger, update_ledger
from llmtrain.slurm import client

SLURM_TIMEOUT_S = 60


@dataclass(frozen=True)
class Policy:
    exclude_bad_nodes: bool = True
    bad_node_failures: int = 2
    max_starts_without_progress: int = 3
    nnodes: int = 1  # the fewest nodes a start may have
    nodes_key: str = "cluster.nnodes"
    most: int = 1  # cluster.nnodes: a run with most > nnodes is pinned to its healthy nodes at each requeue
    partition: str | None = None


def read_policy(run_dir: str) -> Policy:
    try:
        cluster = OmegaConf.load(os.path.join(run_dir, "config.yaml")).get("cluster") or {}
    except (OSError, ValueError):
        return Policy()
    fields = {k: cluster.get(k, getattr(Policy, k)) for k in Policy.__dataclass_fields__}
    # A run that accepts fewer nodes can be requeued while at least cluster.min_nnodes are left.
    fewest = ("cluster.min_nnodes", cluster.get("min_nnodes")) if cluster.get("min_nnodes") else \
        ("cluster.nnodes", fields["nnodes"])
    return Policy(bool(fields["exclude_bad_nodes"]), int(fields["bad_node_failures"]),
                  int(fields["max_starts_without_progress"]), int(fewest[1]), fewest[0], int(fields["nnodes"]),
                  cluster.get("partition"))


def say(message: str) -> None:
    print(f"llmtrain: {message}", flush=True)


def _newest_step(run_dir: str) -> int | None:
    """The newest checkpoint's step; a store that does not answer just now leaves it unknown (None), said in a
    warning, rather than ending the job's bookkeeping (and its requeue) with a traceback."""
    try:
        return newest_step(run_dir)
    except ObjectStoreError as e:
        say(f"warning: {e}; the newest checkpoint's step is unknown")
        return None


def start_began(run_dir: str, job_id: str, restart: int) -> None:
    """At each start of the job (slurm_job_start.py): the checkpoint it begins from, to tell progress by."""
    step = _newest_step(run_dir)
    update_ledger(run_dir, lambda ledger: note_start(ledger, job_id, restart, step))


def failed_start(run_dir: str, job_id: str, job_output: str, srun_exit: int, setup_failed: bool) -> Culprit | None:
    """Record the failed start's culprit host in nodes.json; returns it (None when nothing names one)."""
    if setup_failed:
        culprit = setup_culprit(job_output, socket.gethostname())
    else:
        started = read_ledger(run_dir).get("starts", {}).get("started_s", 0.0)
        culprit = start_culprit(run_dir, job_output, started, srun_exit)
    if culprit is not None:
        def record(ledger: dict) -> None:
            for host in culprit.hosts:
                add_event(ledger, host, culprit.kind, culprit.detail, job_id)
        update_ledger(run_dir, record)
    return culprit


def requeue_or_stop(run_dir: str, job_id: str, failure: str | None, announce: str | None = None) -> str | None:
    """Requeue the job, leaving out its bad hosts (`announce`: said just before the requeue); None when Slurm took
    it, else why it was not requeued (recorded in nodes.json and job.json for `llmtrain status`)."""
    policy = read_policy(run_dir)
    step = _newest_step(run_dir)
    counted = {}
    ledger = update_ledger(run_dir, lambda led: counted.setdefault("n", note_end(led, step, failure)))
    reason = breaker_reason(counted["n"], policy.max_starts_without_progress, failure)
    hosts, added = [], {}
    if reason is None and policy.exclude_bad_nodes:
        hosts, added, reason = _bad_hosts_left_out(job_id, ledger, policy)
    if reason is None:
        # Slurm stops the job's processes on the requeue, this one too; the ExcNodeList update comes after it
        # (Slurm takes it only from a job that is pending again), so the stop signal must not cut it short.
        before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            for host, bad in added.items():
                say(f"requeue excludes {host} ({bad})")
            if announce:
                say(announce)
            why = client.requeue(job_id, timeout=SLURM_TIMEOUT_S)
            if why is None and added:
                _exclude(run_dir, job_id, hosts, added)
            if why is None and policy.most > policy.nnodes:  # the next start asks for the healthy nodes
                _pin(job_id, policy, hosts)
        finally:
            signal.signal(signal.SIGTERM, before)
        if why is None:
            return None
        reason = f"scontrol requeue failed: {why}"
    stopped = {"time": now_text(), "job": job_id, "reason": reason}
    update_ledger(run_dir, lambda led: led.update(stopped=stopped))
    note_job(run_dir, job_id, not_requeued=reason)
    return reason


def partition_nodes(partition: str | None) -> list[str] | None:
    """The names of the partition's nodes (sinfo), or None when sinfo cannot say."""
    text, _ = client.sinfo(["-h", "-N", "-o", "%N", *(["-p", partition] if partition else [])], SLURM_TIMEOUT_S)
    names = sorted(set(text.split())) if text else []
    return names or None


def _bad_hosts_left_out(job_id: str, ledger: dict, policy: Policy) -> tuple[list[str], dict[str, str], str | None]:
    """(the job's ExcNodeList with the ledger's bad hosts added, the hosts added -> why, a reason not to requeue
    when that would leave too few nodes)."""
    answer = client.show_job(job_id, SLURM_TIMEOUT_S)
    current = split_hosts(answer.fields.get("ExcNodeList")) if answer else []
    hosts, added = exclusion(ledger, current, policy.bad_node_failures)
    if not added:
        return hosts, added, None
    return hosts, added, too_few_left(partition_nodes(os.environ.get("SLURM_JOB_PARTITION")), hosts, policy.nnodes,
                                       policy.nodes_key)


def _exclude(run_dir: str, job_id: str, hosts: list[str], added: dict[str, str]) -> None:
    why = client.update_job(job_id, f"ExcNodeList={','.join(hosts)}", timeout=SLURM_TIMEOUT_S)
    if why is not None:
        say(f"could not exclude {', '.join(added)} from the requeued job: {why}")
        return
    excluded = {"time": now_text(), "job": job_id, "hosts": hosts, "added": added}
    update_ledger(run_dir, lambda led: led.update(excluded=excluded))
    note_job(run_dir, job_id, excluded_nodes=hosts)


def _pin(job_id: str, policy: Policy, excluded: list[str]) -> None:
    if not excluded:
        answer = client.show_job(job_id, SLURM_TIMEOUT_S)
        excluded = split_hosts(answer.fields.get("ExcNodeList")) if answer else []
    why = pin_node_count(job_id, policy.nnodes, policy.most, policy.partition, excluded)
    if why:
        say(why)
