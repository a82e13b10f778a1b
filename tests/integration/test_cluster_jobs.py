"""Multi-node jobs on the two-node test cluster (scripts/testcluster.sh): a rendezvous port per Slurm job, a job
Slurm can never start stopped with its reason, Ctrl-C on a follower leaving the job running, cluster.setup lines on
every node, GLOO_SOCKET_IFNAME resolved per node, the job script submitted again by hand into a held run directory,
and a preemption notice to the batch shell. Skipped, with the reason, where the cluster cannot be built."""

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
from helpers.cluster_nodes import scontrol, ssh_args, state
from helpers.inprocess_run import train_in_process

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
# One process per node (the hostfile's slots=1 gives it for ssh); DP2 across the two nodes.
HEAD_ADDRESS = "10.200.0.1"  # the head node on the cluster's bridge (scripts/testcluster.sh)
TWO_NODES = SMALL + ["train.global_batch_size=8", "train.micro_batch_size=2", "cluster.nnodes=2"]
SLURM = ["cluster=slurm", "cluster.nproc_per_node=1", "cluster.gpus_per_node=0", "cluster.time=null"]
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED")


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text("node1 slots=1\nnode2 slots=1\n")
    return path


def _run_span(info: str) -> tuple[str, str]:
    """(StartTime, EndTime) of a job, as scontrol prints them (ISO times compare as strings)."""
    return re.search(r"StartTime=(\S+)", info)[1], re.search(r"EndTime=(\S+)", info)[1]


def scancel(cluster, job: str | None) -> None:
    if job:
        subprocess.run(["scancel", job], env=cluster.environ(), capture_output=True, timeout=30)


def submitted(stdout: str) -> tuple[str, str]:
    """(job id, rendezvous port) from the launcher's submission line."""
    found = re.search(r"submitted Slurm job (\d+) \(.*\); rendezvous on the job's first node, port (\d+)", stdout)
    assert found, stdout[-3000:]
    return found.group(1), found.group(2)


def test_two_slurm_jobs_sharing_the_nodes_both_finish(cluster, tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("each node needs 2 CPUs for two one-task jobs to run at once")
    jobs = {}
    try:
        for name in ("a", "b"):
            # One CPU per node each (not all of the node's, the default), so that both fit at once.
            result = run_cli(["launch", f"run.dir={tmp_path / name}", *TWO_NODES, *SLURM, "train.max_steps=60",
                              "cluster.cpus_per_node=1"], env=cluster.env, timeout=120)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
            assert "job finished" not in result.stdout
            jobs[name] = submitted(result.stdout)
        (_, port_a), (_, port_b) = jobs["a"], jobs["b"]
        assert port_a != port_b
        assert wait_for(lambda: all(state(cluster, j) not in LIVE for j, _ in jobs.values()), timeout=400)
        infos = {name: scontrol(cluster, job) for name, (job, _) in jobs.items()}
    finally:
        for job, _ in jobs.values():
            scancel(cluster, job)
    for name, info in infos.items():
        assert "JobState=COMPLETED" in info and "ExitCode=0:0" in info, info
        assert sorted(train_losses(tmp_path / name)) == list(range(1, 61))
    # They ran at the same time on the same nodes (each one's run began before the other's ended).
    (start_a, end_a), (start_b, end_b) = (_run_span(infos[name]) for name in ("a", "b"))
    assert start_a < end_b and start_b < end_a, infos


def test_job_that_can_never_start_is_cancelled_with_its_reason(cluster, tmp_path):
    start = time.monotonic()
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", *SMALL, "train.max_steps=4",
                      "train.global_batch_size=6", "train.micro_batch_size=2", *SLURM, "cluster.nnodes=3",
                      "cluster.follow=true"], env=cluster.env, timeout=120)
    took = time.monotonic() - start
    job, _ = submitted(result.stdout)
    scancel(cluster, job)  # in case the follower did not
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    # Slurm versions differ in the reason they give for it.
    assert re.search(rf"job {job} can never start \(Reason=(PartitionNodeLimit|PartitionConfig): cluster.nnodes=3, "
                     r"but partition debug has 2 node\(s\)\); cancelled it", result.stdout), result.stdout
    assert took < 45, f"stopped only after {took:.0f} s"
    assert state(cluster, job) in ("CANCELLED", "UNKNOWN")
    assert "job finished" not in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_ctrl_c_on_a_follower_leaves_the_job_running(cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *TWO_NODES, *SLURM,
                             "train.max_steps=100000", "cluster.follow=true", "cluster.requeue=false"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.environ())
    job = None
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=180), "training never started"
        job = re.search(r"slurm-(\d+)\.out", " ".join(p.name for p in (run_dir / "logs").iterdir())).group(1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-3000:]
        assert (f"llmtrain: stopped following job {job}; it keeps running (llmtrain cancel {run_dir} or scancel "
                f"{job} to stop it)") in out
        assert "stopping every process" not in out and "job finished" not in out and "Traceback" not in out
        assert state(cluster, job) == "RUNNING"
        rows = len(read_rows(run_dir))
        assert wait_for(lambda: len(read_rows(run_dir)) > rows, timeout=60), "training stopped with the follower"
    finally:
        proc.kill()
        scancel(cluster, job)
    assert wait_for(lambda: state(cluster, job) not in LIVE, timeout=120)


def _node_env(run_dir, node: int) -> str:
    return (run_dir / "logs" / f"node{node}.env").read_text()


def _gloo_interface(env: str) -> str:
    found = re.search(r"^GLOO_SOCKET_IFNAME=(.*)$", env, re.M)
    assert found, env
    return found.group(1)


def test_setup_lines_run_on_every_ssh_node_and_gloo_gets_an_interface(cluster, hostfile, tmp_path):
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    setup = f"cluster.setup=['export LLMTRAIN_SETUP_MARK=yes','touch {marks}/setup-$(uname -n)']"
    result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, "train.max_steps=4", *ssh_args(cluster, hostfile),
                      "network=ethernet", setup], env=cluster.env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"llmtrain: rendezvous at node1:\d+ \(a random port", result.stdout), result.stdout[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == ["setup-node1", "setup-node2"]
    for node in (0, 1):
        env = _node_env(run_dir, node)
        assert "LLMTRAIN_SETUP_MARK=yes" in env
        assert not _gloo_interface(env).startswith("^")  # the preset's ^lo,docker, resolved on the node
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4]


def test_failing_setup_line_stops_the_ssh_nodes_naming_it(cluster, hostfile, tmp_path):
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", *TWO_NODES, "train.max_steps=4",
                      *ssh_args(cluster, hostfile), "cluster.setup=['true','false']"], env=cluster.env, timeout=120)
    assert result.returncode not in (0, None)
    assert "llmtrain: node set-up failed: cluster.setup line 2 (false) exited with status 1" in result.stdout, \
        result.stdout[-3000:]
    assert not read_rows(tmp_path / "run")


def test_setup_lines_reach_every_slurm_node(cluster, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, "train.max_steps=4", *SLURM, "cluster.follow=true",
                      "network=ethernet", "cluster.setup=['export LLMTRAIN_SETUP_MARK=yes']"], env=cluster.env,
                     timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    job, port = submitted(result.stdout)
    assert f"llmtrain: job {job} RUNNING on " in result.stdout and f":{port}" in result.stdout
    assert "llmtrain: job finished" in result.stdout
    for node in (0, 1):
        env = _node_env(run_dir, node)
        assert "LLMTRAIN_SETUP_MARK=yes" in env and not _gloo_interface(env).startswith("^")
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4]


@pytest.fixture
def bridge_s3():
    """An S3 server on the head node's bridge address, which both nodes reach (tests/helpers/s3_server.py)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    from helpers import s3_server

    server = s3_server.start(address=HEAD_ADDRESS)
    yield server
    server.stop()


def test_time_limit_requeues_the_job_until_max_steps(cluster, tmp_path, bridge_s3):
    """A one-minute time limit with the notice 30 s before it: the workers checkpoint on the notice, the job
    requeues itself and resumes, the follower follows across the requeue, and the run reaches train.max_steps with
    the losses of an uninterrupted run. The checkpoints go to an S3 store (checkpoint.dir) that both nodes write
    to and the requeued start resumes from."""
    # Only the first start sleeps 2 s a step (a set-up line exports the slowdown while SLURM_RESTART_COUNT is unset
    # or 0): the notice, 30 s after the job starts, comes long before its step 30 whatever the load, and the
    # requeued start, unslowed, finishes well inside its own 30 s.
    steps = 30
    first_start_slow = ('case "$SLURM_RESTART_COUNT" in ""|0) export LLMTRAIN_INJECT_SLOWDOWN="*:2s:1";; esac')
    args = [*TWO_NODES, "train.log_interval=5", f"train.max_steps={steps}", "cluster=slurm",
            "cluster.nproc_per_node=1", "cluster.gpus_per_node=0", "cluster.time=00:01:00",
            "cluster.signal_before_end_s=30", "cluster.follow=true", f"cluster.setup=['{first_start_slow}']"]
    run_dir = tmp_path / "run"
    store = f"s3://{bridge_s3.bucket()}/run"
    # When the notice comes varies: allow for more attempts than the two it needs.
    result = run_cli(["launch", f"run.dir={run_dir}", *args, f"checkpoint.dir={store}"],
                     env={**cluster.env, **bridge_s3.env}, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"job \d+ requeued \(restart 1\); still following", result.stdout), result.stdout[-3000:]
    job_log = "".join(p.read_text() for p in (run_dir / "logs").glob("slurm-*.out"))
    assert "the time limit is near: checkpoint at step" in job_log, job_log[-3000:]
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert re.search(rf"requeued job \(restart 1\): resumed from {store}/step-\d{{7}} at step", rank0), rank0[-3000:]
    assert f"saved checkpoint step {steps} -> {store}/step-{steps:07d}" in rank0
    assert not (run_dir / "checkpoints").exists()
    reference = tmp_path / "reference"
    train_in_process(reference, *SMALL, "train.global_batch_size=8", "train.micro_batch_size=2",
                     "train.log_interval=5", f"train.max_steps={steps}")
    got, want = train_losses(run_dir), train_losses(reference)
    assert max(got) == steps
    assert max(abs(got[s] - want[s]) for s in want) <= 1e-5
    # The goodput ledger: one entry per start of the one job; a requeued start waited in the queue (Slurm holds a
    # requeued job), the checkpoint taken on the notice left no work to redo, and each start's parts add up.
    starts = json.loads((run_dir / "goodput.json").read_text())["starts"]
    assert len(starts) >= 2 and len({e["job_id"] for e in starts}) == 1, starts
    assert max(e["requeues"] for e in starts) >= 1 and starts[1]["queue_s"] >= 10, starts
    for e in starts:
        parts = e["productive_s"] + sum(e[k] for k in ("queue_s", "startup_s", "checkpoint_s", "lost_s",
                                                           "restart_s", "shutdown_s"))
        assert abs(parts - e["allocated_s"]) <= 0.01 and 0 < e["goodput"] < 1 and e["lost_s"] <= 5, e
    # Healthy starts leave the node ledger quiet: no host blamed for a failure, a hang or its start-up, none
    # excluded, the breaker never tripped. (A straggler note may come: both nodes share this machine's two cores
    # with the other test workers and the S3 server, so one rank's compute can lag the other's now and then.)
    ledger = json.loads((run_dir / "nodes.json").read_text())
    blamed = {host: {k: n for k, n in entry.items() if k in ("failure", "hang", "startup") and n}
              for host, entry in ledger["hosts"].items()}
    assert (blamed, ledger["excluded"], ledger["stopped"]) == ({h: {} for h in blamed}, {}, None), ledger
    assert ledger["starts"]["without_progress"] == 0 and "requeue excludes" not in job_log, ledger


def test_a_slurm_sweep_submits_a_job_per_combination_and_both_finish(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    jobs: list[str] = []
    try:
        result = run_cli(["launch", "-m", f"run.dir={sweep}", *TWO_NODES, *SLURM, "train.max_steps=6",
                          "train.lr=0.001,0.002"], env=cluster.env, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        jobs = re.findall(r"submitted Slurm job (\d+)", result.stdout)
        assert len(jobs) == 2 and jobs[0] != jobs[1], result.stdout[-3000:]
        assert wait_for(lambda: all(state(cluster, j) not in LIVE for j in jobs), timeout=600)
        assert [state(cluster, j) for j in jobs] == ["COMPLETED", "COMPLETED"]
    finally:
        for job in jobs:
            scancel(cluster, job)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["lr=0.001", "lr=0.002"]
    for run, lr in zip(runs, (0.001, 0.002)):
        assert f"  lr: {lr}\n" in (run / "config.yaml").read_text()
        assert sorted(train_losses(run)) == list(range(1, 7))
    # The two runs trained differently: each job ran its own combination.
    assert train_losses(runs[0])[6] != train_losses(runs[1])[6]


def test_the_job_script_submitted_again_refuses_while_the_first_job_runs(cluster, tmp_path):
    """`sbatch RUN_DIR/slurm/job.sbatch` while the launched job trains in that run directory (one with a space in
    its path): the second job ends at once with one line in its log, and the first finishes alone, 60 rows."""
    run_dir = tmp_path / "my runs" / "a"
    job = second = None
    try:
        # One CPU per node, so that the second job fits beside the first and really starts. Each step sleeps 0.5 s:
        # the first job outlasts the second's start by far without keeping a core busy meanwhile.
        result = run_cli(["launch", f"run.dir={run_dir}", *TWO_NODES, *SLURM, "train.max_steps=60",
                          "cluster.cpus_per_node=1", "+env.LLMTRAIN_INJECT_SLOWDOWN=*:0.5s:1"], env=cluster.env,
                         timeout=120)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        job, _ = submitted(result.stdout)
        assert wait_for(lambda: len(read_rows(run_dir)) >= 2, timeout=300), state(cluster, job)
        out = subprocess.run(["sbatch", "--parsable", str(run_dir / "slurm" / "job.sbatch")], env=cluster.environ(),
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        second = out.stdout.strip().split(";")[0]
        assert wait_for(lambda: state(cluster, second) not in LIVE, timeout=120)
        assert state(cluster, job) == "RUNNING"  # the refusal did not touch the first job
        info = scontrol(cluster, second)
        assert wait_for(lambda: state(cluster, job) not in LIVE, timeout=600)
        first = scontrol(cluster, job)
    finally:
        scancel(cluster, job)
        scancel(cluster, second)
    assert "JobState=FAILED" in info and "ExitCode=1:0" in info, info
    log = (run_dir / "logs" / f"slurm-{second}.out").read_text()
    assert log == (f"llmtrain: error: run.dir: Slurm job {second} does not start: {run_dir} is in use by Slurm job "
                   f"{job} (submitted from {os.uname().nodename}), since "
                   f"{json.loads((run_dir / '.lock').read_text())['started']}; wait for it to end, stop it, or use "
                   f"another run.dir (remove {run_dir}/.lock only if that job is gone)\n"), log
    assert "JobState=COMPLETED" in first, first
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 61))  # one job's rows, in order: nothing interleaved
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-0000060"]


def test_a_preemption_notice_to_the_batch_shell_checkpoints_and_requeues(cluster, tmp_path):
    """`scancel --batch --signal=USR1 JOB` to a followed job: the batch shell passes it on, the workers checkpoint,
    the job requeues itself and resumes to train.max_steps; while Slurm holds it, `llmtrain status` says pending
    with Slurm's reason and the requeue. The job's task got every CPU of a node (cluster.cpus_per_node unset)."""
    run_dir = tmp_path / "run"
    steps = 40
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *TWO_NODES, *SLURM,
                             f"train.max_steps={steps}", "cluster.follow=true"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cluster.environ())
    job = None
    try:
        lock = run_dir / ".lock"
        assert wait_for(lambda: lock.exists() and json.loads(lock.read_text()).get("job"), timeout=120)
        job = json.loads(lock.read_text())["job"]
        assert wait_for(lambda: len(read_rows(run_dir)) >= 2, timeout=300), state(cluster, job)
        cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], env=cluster.environ(), capture_output=True, text=True,
                              timeout=30).stdout.split()[0]
        assert f"CPUs/Task={cpus} " in scontrol(cluster, job)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=cluster.environ(), check=True, timeout=30)
        assert wait_for(lambda: "Restarts=1" in scontrol(cluster, job) and state(cluster, job) == "PENDING",
                        timeout=300), scontrol(cluster, job)
        status = run_cli(["status", str(run_dir)], env=cluster.env, timeout=60)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        scancel(cluster, job)
    assert f"state       pending: Slurm job {job} PENDING (BeginTime), requeued (restart 1)\n" in status.stdout, \
        status.stdout
    assert proc.returncode == 0, out[-3000:]
    assert f"job {job} requeued (restart 1); still following" in out, out[-3000:]
    log = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "llmtrain: preemption notice (USR1 to the batch shell): passed on to the job's steps\n" in log, log[-3000:]
    saved = re.search(r"llmtrain: a preemption notice came: checkpoint at step (\d+) saved; requeueing job", log)
    assert saved and 2 <= int(saved[1]) < steps, log[-3000:]
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert (f"requeued job (restart 1): resumed from {run_dir}/checkpoints/step-{int(saved[1]):07d} at step "
            f"{saved[1]} ") in rank0, rank0[-3000:]
    assert sorted(train_losses(run_dir)) == list(range(1, steps + 1))
