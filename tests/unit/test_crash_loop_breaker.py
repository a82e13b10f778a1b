"""The end of a failed start of a Slurm job (slurm_job_end.py + slurm_requeue.py), with Slurm's commands faked:
the culprit host goes into nodes.json, the job requeues itself without its bad hosts (ExcNodeList set once Slurm
took the requeue), and the crash-loop breaker stops it after too many starts without a new checkpoint."""

from __future__ import annotations

import json
import socket

import pytest

from llmtrain.launch.node import slurm_job_end
from llmtrain.launch.node.slurm_requeue import start_began
from llmtrain.rundir.node_ledger import read_ledger, record_node_event
from llmtrain.slurm import client

ROOT_CAUSE = """llmtrain: job 12 on node2, rendezvous node2:20012 (restart {restart})
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_07:00:00
  host      : node2
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5)
srun: error: node2: task 0: Exited with exit code 1
"""


@pytest.fixture
def slurm(monkeypatch):
    calls = []
    monkeypatch.setattr(client, "show_job", lambda job, timeout=30: client.JobAnswer({"ExcNodeList": "node9"}, False))
    monkeypatch.setattr(client, "sinfo", lambda args, timeout: ("node1\nnode2\nnode9\n", None))
    monkeypatch.setattr(client, "requeue", lambda job, timeout=60: calls.append(("requeue", job)))
    monkeypatch.setattr(client, "update_job", lambda job, *fields, timeout=60: calls.append(("update", job, *fields)))
    monkeypatch.setenv("SLURM_JOB_PARTITION", "debug")
    return calls


def _run_dir(tmp_path, max_starts=3):
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.yaml").write_text(f"cluster:\n  nnodes: 1\n  bad_node_failures: 2\n"
                                          f"  max_starts_without_progress: {max_starts}\n")
    (tmp_path / "job.json").write_text(json.dumps({"launches": [{"launch": 1, "backend": "slurm", "job_id": None}]}))
    return str(tmp_path)


def _failed_start(run_dir, restart):
    """Start `restart` of job 12: rank 0 placed itself on node2, then exited 1."""
    start_began(run_dir, "12", restart)
    logs = f"{run_dir}/logs"
    with open(f"{logs}/rank0.place", "w") as f:
        json.dump({"rank": 0, "node": 0, "host": "node2", "local_rank": 0}, f)
    with open(f"{logs}/slurm-12.out", "a") as f:
        f.write(ROOT_CAUSE.format(restart=restart))


def test_a_failed_start_requeues_without_the_host_that_failed_twice(tmp_path, slurm, capsys):
    run_dir = _run_dir(tmp_path)
    record_node_event(run_dir, "node2", "failure", "rank 0 on node2 exited 1", job="11")  # an earlier launch
    _failed_start(run_dir, 0)
    assert slurm_job_end.job_end(run_dir, 1, 30, True, "12") == 0
    # The update after the requeue: Slurm refuses ExcNodeList for a running job.
    assert slurm == [("requeue", "12"), ("update", "12", "ExcNodeList=node9,node2")]
    out = capsys.readouterr().out.splitlines()
    assert out == ["llmtrain: this start failed (rank 0 on node2 exited 1)",
                   "llmtrain: requeue excludes node2 (2 failures: rank 0 on node2 exited 1)",
                   "llmtrain: requeueing job 12 to start again from the newest checkpoint"]
    ledger = read_ledger(run_dir)
    assert ledger["hosts"]["node2"]["failure"] == 2 and ledger["excluded"]["hosts"] == ["node9", "node2"]
    assert json.loads((tmp_path / "job.json").read_text())["launches"][0]["excluded_nodes"] == ["node9", "node2"]


def test_the_breaker_stops_the_requeue_after_the_limit(tmp_path, slurm, capsys):
    run_dir = _run_dir(tmp_path, max_starts=2)
    _failed_start(run_dir, 0)
    assert slurm_job_end.job_end(run_dir, 1, 30, True, "12") == 0
    _failed_start(run_dir, 1)
    assert slurm_job_end.job_end(run_dir, 1, 30, True, "12") == 1
    assert [c[0] for c in slurm] == ["requeue"]
    said = capsys.readouterr().out.splitlines()
    reason = "2 starts in a row saved no checkpoint (last: rank 0 on node2 exited 1)"
    assert said[-2:] == ["llmtrain: this start failed (rank 0 on node2 exited 1)", f"llmtrain: not requeued: {reason}"]
    assert read_ledger(run_dir)["stopped"]["reason"] == reason
    assert json.loads((tmp_path / "job.json").read_text())["launches"][0]["not_requeued"] == reason


def test_a_set_up_failure_that_would_leave_no_node_is_not_requeued(tmp_path, slurm, monkeypatch, capsys):
    run_dir = _run_dir(tmp_path)
    host = socket.gethostname()
    monkeypatch.setattr(client, "sinfo", lambda args, timeout: (f"{host}\n", None))
    monkeypatch.setattr(client, "show_job", lambda job, timeout=30: client.JobAnswer({"ExcNodeList": "(null)"}, False))
    (tmp_path / "logs" / "slurm-12.out").write_text(
        "llmtrain: node set-up failed: cluster.setup line 1 (false) exited with status 1\n")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("LLMTRAIN_SETUP_FAILED", "1")
    assert slurm_job_end.main([run_dir, "1", "30", "1", "0"]) == 1
    assert slurm == []
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (f"llmtrain: not requeued: excluding {host} would leave 0 of the partition's 1 node(s) for "
                       "cluster.nnodes=1")
    entry = read_ledger(run_dir)["hosts"][host]
    assert entry["startup"] == 1 and entry["last"][-1]["detail"] == \
        "cluster.setup line 1 (false) exited with status 1"


SETUP_LINE = """srun bash -c '[ "$(hostname)" != node2 ]'"""


@pytest.mark.parametrize("failed_on", [["node2"], ["node2", "node1"]])
def test_a_set_up_line_run_by_srun_is_blamed_on_the_nodes_srun_names(tmp_path, slurm, monkeypatch, capsys,
                                                                    failed_on):
    run_dir = _run_dir(tmp_path)
    log = ROOT_CAUSE.replace("node2", "node1").format(restart=0)  # an earlier start, which failed on node1
    log += "llmtrain: requeueing job 12 to start again from the newest checkpoint\n"
    log += "llmtrain: cluster.setup on node1 (job 12, restart 1)\n"  # the batch shell runs on node1
    log += "".join(f"srun: error: {host}: task {n}: Exited with exit code 1\n" for n, host in enumerate(failed_on))
    log += f"llmtrain: node set-up failed: cluster.setup line 1 ({SETUP_LINE}) exited with status 1\n"
    (tmp_path / "logs" / "slurm-12.out").write_text(log)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("LLMTRAIN_SETUP_FAILED", "1")
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    assert slurm_job_end.main([run_dir, "1", "30", "0", "0"]) == 1
    detail = f"cluster.setup line 1 ({SETUP_LINE}) exited with status 1"
    hosts = read_ledger(run_dir)["hosts"]
    assert sorted(hosts) == sorted(failed_on)
    assert all(hosts[h]["startup"] == 1 and hosts[h]["last"][-1]["detail"] == detail for h in failed_on)
    # With cluster.requeue: requeued without the failed hosts, while the partition has a node left for it.
    assert slurm_job_end.main([run_dir, "1", "30", "1", "0"]) == (0 if failed_on == ["node2"] else 1)
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"llmtrain: this start failed (start-up failure on {', '.join(failed_on)}: {detail})"
    if failed_on == ["node2"]:
        assert said[1] == f"llmtrain: requeue excludes node2 (2 start-up failures: {detail})"
    else:
        assert said[1] == ("llmtrain: not requeued: excluding node9,node1,node2 would leave 0 of the partition's "
                           "3 node(s) for cluster.nnodes=1")
