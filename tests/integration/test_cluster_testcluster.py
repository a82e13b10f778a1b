"""The two-node test cluster itself (scripts/testcluster.sh): Slurm across both nodes, ssh to each node, and a
2-node torchrun rendezvous (c10d + gloo all_reduce) across the network namespaces."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from cluster_fixture import REPO

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_srun_spans_both_nodes(cluster):
    r = subprocess.run(["srun", "-N2", "hostname"], capture_output=True, text=True, timeout=60, env=cluster.environ())
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["node1", "node2"]


def test_srun_job_sees_same_python_and_torch(cluster):
    code = "import socket, torch; print(socket.gethostname())"
    r = subprocess.run(["srun", "-N2", sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                       cwd=REPO, env=cluster.environ(OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["node1", "node2"]


def test_ssh_reaches_each_node(cluster):
    for node in ("node1", "node2"):
        r = cluster.ssh(node, "hostname", timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == node


def test_torchrun_rendezvous_across_nodes(cluster):
    script = cluster.state_dir / "allreduce_check.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.distributed as d

        d.init_process_group("gloo")
        t = torch.ones(1)
        d.all_reduce(t)
        assert t.item() == 2, t
        print("rank", d.get_rank(), "ok", flush=True)
        d.destroy_process_group()
        """))
    torchrun = (f"cd {REPO} && OMP_NUM_THREADS=1 exec {sys.executable} -m torch.distributed.run --nnodes 2 "
                f"--nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint node1:29400 --rdzv-id t1 {script}")
    procs = {node: subprocess.Popen(cluster.ssh_argv(node, torchrun), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for node in ("node1", "node2")}
    outputs = {}
    try:
        for node, p in procs.items():
            outputs[node] = p.communicate(timeout=120)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    for node, p in procs.items():
        assert p.returncode == 0, f"{node} exited {p.returncode}:\n{outputs.get(node, '')[-3000:]}"
    assert "ok" in outputs["node1"] and "ok" in outputs["node2"]
