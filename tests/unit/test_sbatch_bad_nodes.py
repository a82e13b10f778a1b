"""The sbatch script's part in the bad-node record: cluster.exclude as --exclude (the requeue keeps it), and a
failing cluster.setup line that ends the start through the job's end (slurm_job_end with LLMTRAIN_SETUP_FAILED=1),
run by bash with a stand-in Python."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from helpers.fake_slurm import slurm_cfg

from llmtrain.config import ConfigError
from llmtrain.launch.backends.slurm import SlurmBackend


def test_cluster_exclude_becomes_sbatch_exclude():
    script = SlurmBackend(slurm_cfg("cluster.cpus_per_node=2", "cluster.exclude=node3@node4"), "/tmp/r").script()
    assert '#SBATCH --exclude="node3,node4"' in script.splitlines()


def test_a_failing_setup_line_ends_the_start_through_the_jobs_end(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "job end: $* setup_failed=$LLMTRAIN_SETUP_FAILED"\nexit 5\n')
    python.chmod(0o755)

    def run(*setup: str) -> subprocess.CompletedProcess:
        cfg = slurm_cfg("cluster.cpus_per_node=2", f"cluster.python={python}", "cluster.signal_before_end_s=30",
                        f"cluster.setup=[{','.join(repr(s) for s in setup)}]")
        lines = SlurmBackend(cfg, str(tmp_path / "run"))._setup_lines()
        return subprocess.run(["bash", "-c", "\n".join(["set -euo pipefail", *lines, "echo after set-up"])],
                              capture_output=True, text=True, timeout=30, env={**os.environ, "SLURM_JOB_ID": "12",
                                                                               "SLURM_RESTART_COUNT": "1"})

    # Where this start's set-up begins in the job's log: its failure is blamed on the nodes srun names after it.
    begins = f"llmtrain: cluster.setup on {socket.gethostname()} (job 12, restart 1)\n"
    failed = run("true", "false")
    assert failed.returncode == 5
    assert failed.stdout == begins + (f"job end: -m llmtrain.launch.node.slurm_job_end {tmp_path}/run 1 30 1 0 "
                                      "setup_failed=1\n")
    assert failed.stderr == "llmtrain: node set-up failed: cluster.setup line 2 (false) exited with status 1\n"
    passed = run("true")
    assert (passed.returncode, passed.stdout) == (0, begins + "after set-up\n")  # the trap is gone after set-up


@pytest.mark.parametrize("override,line", [
    ("cluster.bad_node_failures=0", "cluster.bad_node_failures: must be >= 1 (got 0)"),
    ("cluster.max_starts_without_progress=-1", "cluster.max_starts_without_progress: must be >= 0 (got -1)")])
def test_bad_node_keys_out_of_range_are_refused_naming_the_key(override, line):
    with pytest.raises(ConfigError) as refused:
        slurm_cfg(override)
    assert f"{refused.value.key}: {refused.value.message}" == line
