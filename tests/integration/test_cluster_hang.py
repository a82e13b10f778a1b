"""Hang triage across two nodes (ssh, scripts/testcluster.sh): a rank on node 1 blocked in data loading while node
1's agent is stopped (SIGSTOP) still gets a verdict, from node 0's evidence and the ranks' traces, naming the node
that did not answer."""

from __future__ import annotations

import re
import subprocess
import sys
import os

import psutil
import pytest
from conftest import SMALL, read_rows, wait_for
from helpers.cluster_nodes import node_agent, node_processes, ssh_args

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text("node1 slots=1\nnode2 slots=1\n")
    return path


def test_a_stopped_node_agent_is_named_and_the_verdict_still_comes(cluster, hostfile, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    # The fault reaches the remote worker through the run's env: (ssh passes no environment).
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *SMALL,
                             "data=synthetic", "train.max_steps=100000", "cluster.nnodes=2",
                             "cluster.nproc_per_node=1", "launch.hang_timeout_s=5",
                             "launch.hang_evidence_wait_s=15",
                             "+env.LLMTRAIN_INJECT_HANG=block_data:6:1", *ssh_args(cluster, hostfile)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **cluster.env})
    agent = None
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        agent = node_agent(run_dir, 1)
        agent.suspend()
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
        if agent is not None:
            try:
                agent.resume()  # it sees its launcher gone and stops its tree
            except psutil.NoSuchProcess:
                pass
    assert proc.returncode == 1, out[-3000:]
    verdicts = [line for line in out.splitlines() if line.startswith("llmtrain: hang: ")]
    assert len(verdicts) == 1, out[-3000:]
    assert re.fullmatch(r"llmtrain: hang: rank 1 \(node 1, host node2, local rank 0\) never entered all_reduce #\d+ "
                        r"on the dp group; rank 0 waits in it; rank 1 did not answer the stack request; node\(s\) 1 "
                        r"did not answer \(their agent is stopped or unreachable\)", verdicts[0]), verdicts[0]
    assert wait_for(lambda: not node_processes(run_dir), timeout=60), node_processes(run_dir)
