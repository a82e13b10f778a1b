"""What tests on the two-node cluster share: the ssh backend's overrides and the run's processes on the nodes."""

from __future__ import annotations

import os
import re
import subprocess

import psutil


def ssh_args(cluster, hostfile) -> list[str]:
    return ["cluster=ssh", f"cluster.hostfile={hostfile}", f"cluster.ssh_config={cluster.ssh_config}"]


def node_processes(run_dir) -> list[psutil.Process]:
    """Every process of this run on any node (namespaces share the PID space)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(run_dir) in cmd and p.pid != os.getpid() and (
                "-m llmtrain" in cmd or "llmtrain.launch.node.agent" in cmd or "torch.distributed.run" in cmd):
            out.append(p)
    return out


def node_agent(run_dir, node: int) -> psutil.Process:
    """The node agent of `node` (argv: ... node.agent RUN_DIR NODE -- torchrun ...)."""
    agents = [p for p in node_processes(run_dir) if "llmtrain.launch.node.agent" in p.cmdline()
              and p.cmdline()[p.cmdline().index("llmtrain.launch.node.agent") + 2] == str(node)]
    assert len(agents) == 1, agents
    return agents[0]


def scontrol(cluster, job: str) -> str:
    """`scontrol show job JOB`'s output on the cluster."""
    return subprocess.run(["scontrol", "show", "job", job], env=cluster.environ(), capture_output=True, text=True,
                          timeout=30).stdout


def state(cluster, job: str) -> str:
    found = re.search(r"JobState=(\S+)", scontrol(cluster, job))
    return found.group(1) if found else "UNKNOWN"
