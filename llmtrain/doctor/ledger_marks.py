"""`llmtrain doctor`'s note of the hosts a run's RUN_DIR/nodes.json holds bad (the rules of
launch/node/requeue_policy.py), so a preflight before relaunching a troubled run says which nodes failed it before.
Advice only: the hosts are still checked, and a bad mark is no problem of the preflight."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from llmtrain.launch.node.requeue_policy import bad_hosts
from llmtrain.rundir.node_ledger import ledger_path, read_ledger


def ledger_lines(cfg: DictConfig) -> list[str]:
    """One line per host the configured run.dir's nodes.json holds bad; [] when there is none."""
    run_dir = cfg.run.dir
    if not run_dir or not os.path.exists(ledger_path(run_dir)):
        return []
    bad = bad_hosts(read_ledger(run_dir), cfg.cluster.bad_node_failures)
    return [f"llmtrain doctor: {host} is marked bad in {ledger_path(run_dir)} ({why}); the run's Slurm requeue "
            "leaves it out (cluster.exclude_bad_nodes)" for host, why in bad.items()]
