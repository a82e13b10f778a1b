"""The end of a Slurm batch script: a run cut short by the time limit requeues its job, one stopped on request or
finished does not, and one that cannot be requeued fails saying it is unfinished."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from llmtrain.launch.node import slurm_job_end
from llmtrain.slurm import client


def _statuses(run_dir, status, step=40, saved=True):
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    for rank in range(2):
        (logs / f"rank{rank}.status").write_text(json.dumps({"status": status, "step": step, "saved": saved}))


@pytest.fixture
def slurm(monkeypatch):
    calls = {"requeued": []}

    def requeue(job, timeout=60):
        calls["requeued"].append(job)
        return calls.get("refuse")

    monkeypatch.setattr(client, "requeue", requeue)
    monkeypatch.setattr(client, "show_job", lambda job, timeout=30: None)
    monkeypatch.setattr(slurm_job_end, "seconds_left", lambda job: calls.get("left"))
    return calls


def test_time_limit_near_requeues(tmp_path, slurm, capsys):
    _statuses(tmp_path, "preempted")
    slurm["left"] = 25.0
    assert slurm_job_end.job_end(str(tmp_path), 0, 30, True, "12") == 0
    assert slurm["requeued"] == ["12"]
    assert "checkpoint at step 40 saved; requeueing job 12" in capsys.readouterr().out


@pytest.mark.parametrize("may_requeue,refuse,saved,why", [
    (False, None, True, "cluster.requeue=false"),
    (True, "Requeue of JobId=12 not allowed", True, "Requeue of JobId=12 not allowed"),
    (True, None, False, "no checkpoint was saved")])
def test_no_requeue_is_an_unfinished_failure(tmp_path, slurm, capsys, may_requeue, refuse, saved, why):
    _statuses(tmp_path, "preempted", saved=saved)
    slurm.update(left=25.0, refuse=refuse)
    assert slurm_job_end.job_end(str(tmp_path), 0, 30, may_requeue, "12") == slurm_job_end.EXIT_UNFINISHED
    out = capsys.readouterr().out
    assert "unfinished: stopped at step 40 before the time limit" in out and why in out


def test_stop_on_request_or_finished_run_is_not_requeued(tmp_path, slurm, capsys):
    _statuses(tmp_path / "asked", "preempted")
    slurm["left"] = 3000.0  # far from the limit: llmtrain cancel, or a preempting launcher
    assert slurm_job_end.job_end(str(tmp_path / "asked"), 0, 30, True, "12") == 0
    assert "not requeued" in capsys.readouterr().out
    _statuses(tmp_path / "done", "ok")
    slurm["left"] = 25.0
    assert slurm_job_end.job_end(str(tmp_path / "done"), 0, 30, True, "12") == 0
    # srun failed and cluster.requeue=false: its code (with requeue, tests/unit/test_crash_loop_breaker.py)
    assert slurm_job_end.job_end(str(tmp_path / "done"), 137, 30, False, "12") == 137
    assert slurm["requeued"] == []


def test_the_job_sends_its_own_time_limit_notice_before_the_end(tmp_path, monkeypatch):
    """slurm_notice reads EndTime once and sends USR1 to the job's steps NOTICE_S before it."""
    from llmtrain.launch.node import slurm_notice

    sent = []
    monkeypatch.setattr(slurm_notice, "seconds_left", lambda job: 1.5)
    def scancel(argv, **kw):
        sent.append((argv, time.monotonic()))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(client.subprocess, "run", scancel)
    start = time.monotonic()
    assert slurm_notice.main(["77", "1"]) == 0
    (argv, when), = sent
    assert argv == ["scancel", "--signal=USR1", "77"] and 0.4 <= when - start <= 1.5
    monkeypatch.setattr(slurm_notice, "seconds_left", lambda job: None)  # no time limit: nothing to send
    assert slurm_notice.main(["77", "1"]) == 0 and len(sent) == 1
