"""Faults a Slurm job handles by itself, on the two-node test cluster (scripts/testcluster.sh):
- a rank stopped with SIGSTOP: the job's own hang watch (launch/node/slurm_hang_watch.py) judges it, writes the
  verdict to its log and job.json and ends the job, followed or not (a follower shows the same verdict and exits
  1); no process of the job is left, and `llmtrain status` says the verdict. Two jobs at once, one followed;
- a cluster.setup line wrapped in srun that fails on node2 only: the start-up failure is node2's, in the job's log
  and in RUN_DIR/nodes.json, not that of node1, where the batch shell runs.
Skipped, with the reason, where the cluster cannot be built."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import psutil
import pytest
from conftest import SMALL, read_rows, run_cli, wait_for
from helpers.cluster_nodes import node_processes, scontrol, state

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
# DP2 across the two nodes, one CPU of each per job, so that two jobs run at once.
TWO_NODES = [*SMALL, "train.global_batch_size=8", "train.micro_batch_size=2", "cluster=slurm", "cluster.nnodes=2",
             "cluster.nproc_per_node=1", "cluster.gpus_per_node=0", "cluster.cpus_per_node=1", "cluster.time=null"]
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED")
# Where rank 1 stops decides which collective rank 0 waits in: the gradient all_reduce or the straggler watch's all_gather.
VERDICT = (r"llmtrain: hang: rank 1 \(node (\d), host (node[12]), local rank 0\) never entered "
           r"(?:all_reduce|all_gather) #\d+ on the dp group; rank 0 waits in it; "
           r"rank 1 did not answer the stack request \(process stopped\)")
END_BOUND_S = 90  # from the SIGSTOP to no process of the job left: 5 s bound + evidence (<= 15 s) + the kill


def squeue_steps(cluster, job: str) -> str:
    """The job's lines and its steps' lines in squeue; '' once nothing of it runs."""
    return subprocess.run(["squeue", "--noheader", "--steps", f"--jobs={job}"], env=cluster.environ(),
                          capture_output=True, text=True, timeout=30).stdout.strip()


def job_id(run_dir) -> str | None:
    found = [p.name for p in (run_dir / "logs").glob("slurm-*.out")] if (run_dir / "logs").is_dir() else []
    return re.search(r"slurm-(\d+)\.out", found[0])[1] if found else None


def rank_worker(run_dir, rank: int) -> psutil.Process:
    workers = [p for p in node_processes(run_dir) if "llmtrain.worker" in p.cmdline()
               and p.environ().get("RANK") == str(rank)]
    assert len(workers) == 1, workers
    return workers[0]


@pytest.fixture(scope="module")
def hung_jobs(cluster, tmp_path_factory):
    """Two jobs, one followed (cluster.follow=true) and one not; rank 1 of each SIGSTOPped once it trains:
    {name: (run dir, job id, seconds from the stop to no process left, follower's output and exit code)}."""
    tmp = tmp_path_factory.mktemp("hang")
    args = [*TWO_NODES, "train.max_steps=100000", "launch.hang_timeout_s=5", "launch.hang_evidence_wait_s=15",
            "cluster.requeue=false"]
    detached = run_cli(["launch", f"run.dir={tmp / 'detached'}", *args], env=cluster.env, timeout=120)
    assert detached.returncode == 0, detached.stdout[-3000:] + detached.stderr[-2000:]
    follower = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={tmp / 'followed'}", *args,
                                 "cluster.follow=true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=cluster.environ())
    runs = {"detached": tmp / "detached", "followed": tmp / "followed"}
    stopped: list[psutil.Process] = []
    out = {}
    try:
        for run_dir in runs.values():
            assert wait_for(lambda: read_rows(run_dir), timeout=240), f"{run_dir} never trained"
        stop_at = {}
        for name, run_dir in runs.items():
            worker = rank_worker(run_dir, 1)
            worker.suspend()
            stopped.append(worker)
            stop_at[name] = time.monotonic()
        said, _ = follower.communicate(timeout=240)
        for name, run_dir in runs.items():
            job = job_id(run_dir)
            assert wait_for(lambda: not node_processes(run_dir) and state(cluster, job) not in LIVE,
                            timeout=END_BOUND_S + 60, interval=1), (state(cluster, job), node_processes(run_dir))
            took = time.monotonic() - stop_at[name]
            out[name] = (run_dir, job, took, said if name == "followed" else detached.stdout,
                         follower.returncode if name == "followed" else None)
    finally:
        follower.kill()
        for job in filter(None, (job_id(run_dir) for run_dir in runs.values())):
            subprocess.run(["scancel", job], env=cluster.environ(), capture_output=True, timeout=30)
        for worker in stopped:  # a job that was not ended: its stopped rank must not outlive the test
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass
    return out


@pytest.mark.parametrize("name", ["detached", "followed"])
def test_a_hung_slurm_job_ends_itself_with_the_verdict(hung_jobs, cluster, name):
    run_dir, job, took, _, _ = hung_jobs[name]
    log = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    verdicts = [ln for ln in log.splitlines() if ln.startswith("llmtrain: hang: ")]
    assert len(verdicts) == 1 and (found := re.fullmatch(VERDICT, verdicts[0])), log[-3000:]
    assert (found[1], found[2]) in (("0", "node1"), ("1", "node2"))
    assert f"llmtrain: hung: stopped job {job}'s steps (SIGKILL to every process srun started)" in log
    # The job ended failed within the bound, and nothing of it runs: no step, no process on either node.
    assert took <= END_BOUND_S, f"the job's processes ended {took:.0f} s after the stop"
    assert state(cluster, job) == "FAILED" and "ExitCode=1:0" in scontrol(cluster, job)
    assert squeue_steps(cluster, job) == "" and node_processes(run_dir) == []
    launch = json.loads((run_dir / "job.json").read_text())["launches"][-1]
    assert launch["hang"] == verdicts[0]
    status = run_cli(["status", str(run_dir)], env=cluster.env, timeout=60)
    assert status.returncode == 0, status.stderr
    assert f"state       failed: {verdicts[0][len('llmtrain: '):]}" in status.stdout.splitlines(), status.stdout
    ledger = json.loads((run_dir / "nodes.json").read_text())
    assert {h: e["hang"] for h, e in ledger["hosts"].items() if e["hang"]} == {found[2]: 1}  # (stragglers aside)
    suspected = next(ln for ln in log.splitlines() if ln.startswith("llmtrain: hang suspected: "))
    print(f"{name}: the job's processes ended {took:.1f} s after the SIGSTOP; {suspected}")


def test_the_follower_of_a_hung_job_shows_its_verdict_and_exits_1(hung_jobs):
    run_dir, job, _, said, code = hung_jobs["followed"]
    assert code == 1, said[-3000:]
    log = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    watch = [ln for ln in log.splitlines() if ln.startswith(("llmtrain: hang", "llmtrain: hung: "))]
    assert [ln for ln in said.splitlines() if ln.startswith(("llmtrain: hang", "llmtrain: hung: "))] == watch
    assert len(watch) == 4 and "failed (" not in said and "Traceback" not in said, said[-3000:]


def test_a_setup_line_failing_under_srun_on_node2_blames_node2(cluster, tmp_path):
    check = tmp_path / "not_on_node2.sh"
    check.write_text('[ "$(hostname)" != node2 ]\n')
    run_dir = tmp_path / "run"
    line = f"srun sh {check}"
    result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, "train.max_steps=4", "cluster.follow=true",
                      f"cluster.setup=['{line}']"], env=cluster.env, timeout=300)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    job = job_id(run_dir)
    log = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert re.search(r"^srun: error: node2: task 1: Exited with exit code 1$", log, re.MULTILINE), log
    detail = f"cluster.setup line 1 ({line}) exited with status 1"
    said = [ln for ln in log.splitlines() if ln.startswith(("llmtrain: this start failed", "llmtrain: not requeued"))]
    # cluster.requeue (the default) would leave node2 out, and then too few nodes are left for two.
    assert said == [f"llmtrain: this start failed (start-up failure on node2: {detail})",
                    "llmtrain: not requeued: excluding node2 would leave 1 of the partition's 2 node(s) for "
                    "cluster.nnodes=2"], log
    ledger = json.loads((run_dir / "nodes.json").read_text())
    assert list(ledger["hosts"]) == ["node2"] and ledger["hosts"]["node2"]["startup"] == 1
    assert ledger["hosts"]["node2"]["last"][-1]["detail"] == detail
    assert not read_rows(run_dir) and state(cluster, job) == "FAILED"
