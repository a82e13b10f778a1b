"""Multi-node launch for real: two hosts as network namespaces with an sshd each and a two-node Slurm cluster
(scripts/testcluster.sh). Skipped, with the reason, where root or network namespaces are missing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import SMALL, read_rows, run_cli, train_losses, wait_for
from helpers.cluster_nodes import node_agent, node_processes, ssh_args
from helpers.inprocess_run import train_in_process

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
# One process per node; DP2 across the two nodes.
COMMON = SMALL + ["train.max_steps=8", "train.global_batch_size=8", "train.micro_batch_size=2",
                  "cluster.nnodes=2", "cluster.nproc_per_node=1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    train_in_process(run_dir, *SMALL, "train.max_steps=8", "train.global_batch_size=8", "train.micro_batch_size=2")
    return train_losses(run_dir)


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text("# two namespace hosts\nnode1 slots=1\nnode2 slots=1   # second node\n")
    return path


def start_long_run(run_dir, cluster, *args: str) -> subprocess.Popen:  # noqa: F811
    """`llmtrain launch` of a run too long to finish in a test, in the background, output captured."""
    return subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *COMMON,
                             "train.max_steps=100000", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **cluster.env})


def test_ssh_two_nodes_match_one_node(cluster, hostfile, reference, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *COMMON, *ssh_args(cluster, hostfile),
                      "+env.LLMTRAIN_TEST_MARK=propagated"], env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 9))
    assert max(abs(losses[s] - reference[s]) for s in reference) <= 1e-5
    assert "on 2 node(s) (node1, node2), backend ssh" in result.stdout
    assert "starting 2 node(s) over ssh: node1, node2" in result.stdout
    # Each node ran on its own host, with the env: extras propagated and recorded.
    for node, host in ((0, "node1"), (1, "node2")):
        env = (run_dir / "logs" / f"node{node}.env").read_text()
        assert f"host {host}" in env and "LLMTRAIN_TEST_MARK=propagated" in env
    # Every rank recorded where it ran, in the launcher's numbering of the nodes.
    places = {r: json.loads((run_dir / "logs" / f"rank{r}.place").read_text()) for r in (0, 1)}
    assert sorted((p["node"], p["host"], p["local_rank"]) for p in places.values()) == [(0, "node1", 0),
                                                                                      (1, "node2", 0)]
    combined = (run_dir / "logs" / "combined.log").read_text()
    assert re.search(rf"^\[{places[0]['node']}/0\] step +8/8 \| loss", combined, re.MULTILINE), combined[-2000:]
    assert not node_processes(run_dir)


def test_ssh_node_failure_stops_every_node(cluster, hostfile, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = start_long_run(run_dir, cluster, *ssh_args(cluster, hostfile))
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        # The worker under node 1's agent (argv: ... node.agent RUN_DIR 1 -- torchrun ...) runs on node2.
        agents = [p for p in node_processes(run_dir) if "llmtrain.launch.node.agent" in p.cmdline()
                  and p.cmdline()[p.cmdline().index("llmtrain.launch.node.agent") + 2] == "1"]
        assert len(agents) == 1
        victims = [c for c in agents[0].children(recursive=True) if "llmtrain.worker" in c.cmdline()
                   and "torch.distributed.run" not in c.cmdline()]
        assert len(victims) == 1
        victims[0].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None)
    assert re.search(r"node 1 \(host node2\) failed", out), out[-3000:]
    assert re.search(r"rank \d \(node 1, host node2, local rank 0\) failed \(signal 9\)", out), out[-3000:]
    assert wait_for(lambda: not node_processes(run_dir), timeout=30), node_processes(run_dir)


def test_ssh_node_agent_lost_mid_run_stops_the_job(cluster, hostfile, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = start_long_run(run_dir, cluster, *ssh_args(cluster, hostfile))
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        node_agent(run_dir, 1).send_signal(signal.SIGKILL)   # the agent, not a worker
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None), out[-3000:]
    assert "llmtrain: node 1 (host node2) lost its node agent or ssh connection (ssh exit code 255" in out, \
        out[-3000:]
    # Its torchrun went with it, so nothing trains on unsupervised.
    assert wait_for(lambda: not node_processes(run_dir), timeout=30), node_processes(run_dir)


def test_hostfile_with_shell_metacharacters_runs_nothing(cluster, tmp_path):  # noqa: F811
    marker = tmp_path / "pwned"
    bad = tmp_path / "hosts.txt"
    bad.write_text(f"node1 slots=1\nnode2;touch$IFS{marker} slots=1\n")
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", *COMMON, "cluster=ssh",
                      f"cluster.hostfile={bad}", f"cluster.ssh_config={cluster.ssh_config}"], env=cluster.env)
    assert result.returncode == 2 and "cluster.hostfile" in result.stderr and ":2:" in result.stderr
    time.sleep(1)
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_slurm_two_nodes_match_and_requeue_resumes(cluster, reference, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    args = [*COMMON, "cluster=slurm", "cluster.gpus_per_node=0", "cluster.time=null", "cluster.follow=true",
            "cluster.nnodes=2", "cluster.nproc_per_node=1"]
    result = run_cli(["launch", f"run.dir={run_dir}", *args], env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"submitted Slurm job \d+", result.stdout)
    losses = train_losses(run_dir)
    assert max(abs(losses[s] - reference[s]) for s in reference) <= 1e-5

    # A requeue mid-run (what preemption does) and the resume after it: test_cluster_shrink.py's Slurm job.


def test_a_mixture_of_experts_across_two_slurm_nodes_matches_one_process(cluster, tmp_path):  # noqa: F811
    """moe-tiny over the two nodes with expert parallel (ep2: each node holds half of every sparse layer's experts,
    the token-expert pairs cross between the nodes by all-to-all), in a Slurm job with a time limit: the routing
    statistics are summed across nodes (the same tokens per expert as one process) and the router's bias
    balancing, moved from those sums, keeps both nodes' routers equal, so the losses match one process."""
    moe = ["model=moe-tiny", "model.moe.bias_update_rate=0.001"]
    ref = [r for r in train_in_process(tmp_path / "ref", *COMMON[:-2], *moe, "cluster.nproc_per_node=1")
           if "loss" in r]
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *COMMON, *moe, "parallel.ep=2", "cluster=slurm",
                      "cluster.gpus_per_node=0", "cluster.time=00:10:00", "cluster.follow=true"],
                     env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    got = [r for r in read_rows(run_dir) if "loss" in r]
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, 9))
    for mine, want in zip(got, ref):
        assert abs(mine["loss"] - want["loss"]) <= 1e-5 and abs(mine["aux_loss"] - want["aux_loss"]) <= 1e-5
        assert mine["expert_tokens"] == want["expert_tokens"], mine["step"]
        assert mine["ep_tokens"] == [[sum(t[:4]), sum(t[4:])] for t in want["expert_tokens"]], mine["step"]


def test_doctor_across_both_nodes(cluster, hostfile, tmp_path):  # noqa: F811
    result = run_cli(["doctor", f"doctor.dir={tmp_path / 'd'}", *COMMON, *ssh_args(cluster, hostfile),
                      "--max-bytes", "1048576", "--iters", "2"], env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "node1" in result.stdout and "node2" in result.stdout and "busbw" in result.stdout
    assert "all ranks agree" in result.stdout


def test_slurm_killed_rank_is_named_from_the_job_log(cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = start_long_run(run_dir, cluster, "cluster=slurm", "cluster.gpus_per_node=0", "cluster.time=null",
                          "cluster.follow=true", "cluster.requeue=false")
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        workers = [p for p in node_processes(run_dir) if "llmtrain.worker" in p.cmdline()
                   and "torch.distributed.run" not in p.cmdline()]
        assert len(workers) == 2
        next(p for p in workers if p.environ().get("RANK") == "1").send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
        for log in (run_dir / "logs").glob("slurm-*.out"):
            subprocess.run(["scancel", log.name[6:-4]], env={**os.environ, **cluster.env}, capture_output=True)
    assert proc.returncode not in (0, None)
    # Rank 0 only lost its peer and recorded an error; the rank killed by the signal is the one named.
    assert re.search(r"rank 1 \(node [01], host node[12], local rank 0\) failed \(signal 9\)", out), out[-3000:]
    assert wait_for(lambda: not node_processes(run_dir), timeout=60), node_processes(run_dir)


def test_slurm_job_holds_the_run_dir_after_its_launcher_exits(cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    env = {**os.environ, **cluster.env}
    submitted = run_cli(["launch", f"run.dir={run_dir}", *COMMON, "train.max_steps=100000", "cluster=slurm",
                         "cluster.gpus_per_node=0", "cluster.time=null", "cluster.requeue=false"], env=cluster.env)
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    job = re.search(r"submitted Slurm job (\d+)", submitted.stdout)[1]
    try:
        # The launcher is gone; the job holds the run directory, and a second launch is refused naming it.
        second = run_cli(["launch", f"run.dir={run_dir}", *COMMON, "cluster.nnodes=1", "cluster.nproc_per_node=2"],
                         env=cluster.env)
        assert second.returncode == 2 and f"is in use by Slurm job {job}" in second.stderr, second.stderr
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True)

    def ended():
        out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
        return "JobState=PENDING" not in out and "JobState=RUNNING" not in out and "COMPLETING" not in out

    assert wait_for(ended, timeout=120)
    assert wait_for(lambda: not node_processes(run_dir), timeout=60), node_processes(run_dir)
    # Once the job has ended its lock is stale: the next launch takes it over and says whose it was.
    third = run_cli(["launch", f"run.dir={run_dir}", *COMMON, "cluster.nnodes=1", "cluster.nproc_per_node=2",
                     "train.max_steps=100000", "train.stop_at_step=1", "checkpoint.resume=none",
                     "run.overwrite=true"], env=cluster.env)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert f"took over the lock of Slurm job {job}" in third.stdout
