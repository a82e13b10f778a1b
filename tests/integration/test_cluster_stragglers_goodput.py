"""Stragglers and goodput on the two-node test cluster (scripts/testcluster.sh): a rank slowed on purpose on one
ssh node is named with that node's host; a Slurm job's start gets its own goodput entry, with its job id and queue
wait, written by the job's batch script. Skipped, with the reason, where the cluster cannot be built."""

from __future__ import annotations

import json
import re

import pytest
from conftest import SMALL, read_rows, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
TWO_NODES = SMALL + ["train.global_batch_size=8", "train.micro_batch_size=2", "cluster.nnodes=2"]
PARTS = ("productive_s", "queue_s", "startup_s", "checkpoint_s", "lost_s", "restart_s", "shutdown_s")


@pytest.mark.exclusive  # compares the ranks' step times
def test_slowed_rank_on_the_second_ssh_node_is_named_with_its_host(cluster, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, "train.max_steps=12", "cluster=ssh",
                      f"cluster.hostfile={hostfile}", f"cluster.ssh_config={cluster.ssh_config}",
                      "launch.straggler_intervals=2", "+env.LLMTRAIN_INJECT_SLOWDOWN=1:2.0:3"],
                     env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    place = json.loads((run_dir / "logs" / "rank1.place").read_text())
    assert place["host"] in ("node1", "node2")
    lines = re.findall(r"llmtrain: straggler: rank (\d+) \(host (\S+), local rank (\d+)\) (\d+\.\d\d)x", result.stdout)
    assert lines, result.stdout[-3000:]
    assert {(rank, host, local) for rank, host, local, _ in lines} == {("1", place["host"], "0")}
    assert all(1.4 <= float(x) <= 2.6 for *_, x in lines), lines
    named = [r for r in read_rows(run_dir) if "stragglers" in r]
    assert named and all(r["stragglers"][0]["host"] == place["host"] for r in named)
    starts = json.loads((run_dir / "goodput.json").read_text())["starts"]
    assert len(starts) == 1 and starts[0]["lost_s"] == 0 and starts[0]["restarts"] == 0


def test_a_slurm_start_has_its_own_goodput_entry(cluster, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, "train.max_steps=6", "cluster=slurm",
                      "cluster.nproc_per_node=1", "cluster.gpus_per_node=0", "cluster.time=null",
                      "cluster.follow=true"], env=cluster.env, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    job = re.search(r"submitted Slurm job (\d+)", result.stdout)
    assert job, result.stdout[-3000:]
    starts = json.loads((run_dir / "goodput.json").read_text())["starts"]
    assert len(starts) == 1, starts
    entry = starts[0]
    assert entry["job_id"] == job[1] and entry["launch"] is None
    assert entry["queue_s"] >= 0 and entry["lost_s"] == 0 and entry["restarts"] == 0 and entry["requeues"] == 0
    assert 0 < entry["goodput"] < 1
    assert abs(sum(entry[k] for k in PARTS) - entry["allocated_s"]) <= 0.01, entry
    status = run_cli(["status", str(run_dir)], env=cluster.env)
    assert re.search(r"^goodput     \d+\.\d% = productive", status.stdout, re.M), status.stdout

