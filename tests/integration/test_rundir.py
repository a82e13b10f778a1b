"""A run directory holds one run and one job: a different run is refused (or moved aside with run.overwrite), a
second launch is refused while the first holds the lock, and no worker outlives a killed launcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SMALL, read_rows, run_cli, wait_for, worker_processes
from helpers.inprocess_run import train_in_process

from llmtrain.config import ConfigError
from llmtrain.launch.run_lock import RunDirLock

TINY = SMALL + ["data=synthetic", "train.max_steps=4", "cluster.nproc_per_node=1", "train.global_batch_size=4",
                "train.micro_batch_size=4"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---- the lock, without processes -----------------------------------------------------------------------------
def test_second_holder_is_refused_and_named(tmp_path):
    first = RunDirLock(str(tmp_path))
    assert first.acquire() is None
    with pytest.raises(ConfigError) as info:
        RunDirLock(str(tmp_path)).acquire()
    assert info.value.key == "run.dir" and f"pid {os.getpid()}" in str(info.value)
    first.release()
    assert not (tmp_path / ".lock").exists()
    assert RunDirLock(str(tmp_path)).acquire() is None  # free again


def test_stale_lock_is_taken_over_with_a_message(tmp_path):
    import socket

    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(),
                                                "started": "earlier"}))
    lock = RunDirLock(str(tmp_path))
    note = lock.acquire()
    assert note and "its process is gone" in note
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


def test_lock_of_a_slurm_job_holds_while_the_job_may_run(tmp_path, monkeypatch):
    (tmp_path / ".lock").write_text(json.dumps({"host": "login1", "pid": 1, "job": "4242", "started": "earlier"}))
    monkeypatch.setattr("llmtrain.launch.run_lock.slurm_job_state", lambda job: "RUNNING")
    with pytest.raises(ConfigError, match="Slurm job 4242"):
        RunDirLock(str(tmp_path)).acquire()
    monkeypatch.setattr("llmtrain.launch.run_lock.slurm_job_state", lambda job: "COMPLETED")
    assert "its job ended (COMPLETED)" in RunDirLock(str(tmp_path)).acquire()


# ---- one run per run directory -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train_in_process(run_dir, *TINY, "checkpoint.interval=2")
    return run_dir


def _snapshot(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.stat().st_size for p in run_dir.rglob("*")
            if p.is_file() and "logs" not in p.parts}


@pytest.mark.slow
@pytest.mark.parametrize("change,said", [("checkpoint.resume=none", "checkpoint.resume=none would start a new run"),
                                         ("train.seed=7", "train.seed 1234 -> 7 would start a new run")])
def test_a_different_run_in_a_used_dir_is_refused_and_nothing_changes(finished, tmp_path, change, said):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = _snapshot(run_dir)
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, "train.max_steps=8", change])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("llmtrain: error: run.dir:") and said in result.stderr
    assert "step-0000004" in result.stderr and "run.overwrite=true" in result.stderr
    assert _snapshot(run_dir) == before  # nothing written, pruned or replaced
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow
def test_overwrite_moves_the_earlier_run_aside_and_deletes_nothing(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    old_rows = read_rows(run_dir)
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, "checkpoint.resume=none", "run.overwrite=true",
                      "checkpoint.interval=2", "train.seed=7"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "run.overwrite=true: moved the earlier run (2 checkpoint(s))" in result.stdout
    (previous,) = (run_dir / "previous").iterdir()
    assert sorted(p.name for p in (previous / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    assert read_rows(previous) == old_rows
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    assert [r["step"] for r in read_rows(run_dir) if "loss" in r][0] == 1  # the new run started at step 1
    # A rollback to step 2 keeps it and moves only the newer checkpoint aside.
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, "train.seed=7",
                      f"checkpoint.resume={run_dir / 'checkpoints' / 'step-0000002'}"])
    assert result.returncode == 2 and "holds newer checkpoints (step-0000004)" in result.stderr
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, "train.seed=7", "run.overwrite=true",
                      f"checkpoint.resume={run_dir / 'checkpoints' / 'step-0000002'}", "train.max_steps=3"])
    assert result.returncode == 0, result.stdout[-2000:]
    assert len(list((run_dir / "previous").iterdir())) == 2
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-0000002", "step-0000003"]


def _files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")
            if p.is_file()}


def test_a_finished_run_relaunched_answers_before_any_worker_starts(finished, tmp_path, capsys):
    from llmtrain.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = _files(run_dir)
    started = time.monotonic()
    assert main(["launch", f"run.dir={run_dir}", *TINY, "checkpoint.interval=2"]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "llmtrain: nothing to do: already at step 4 (train.max_steps=4)", out
    assert "resuming from" in out and "ranks (dp=" not in out  # no start line: no job
    # No torchrun: no rank log or status written, no launch recorded in job.json, nothing else touched.
    assert _files(run_dir) == before and not (run_dir / "job.json").exists()
    assert took < 5, took  # a torchrun start alone takes ~10 s


@pytest.mark.slow
def test_a_finished_run_given_more_steps_trains_them(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, "checkpoint.interval=2", "train.max_steps=6"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "nothing to do" not in result.stdout and "train.max_steps: 4 -> 6" in result.stdout
    assert [r["step"] for r in read_rows(run_dir) if "loss" in r][-2:] == [5, 6]


# ---- one job per run directory -------------------------------------------------------------------------------
def _start(run_dir, *overrides):
    return subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_second_launch_is_refused_while_the_first_runs(tmp_path):
    run_dir = tmp_path / "run"
    first = _start(run_dir, *TINY, "train.max_steps=100000")
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=120), "training never started"
        config = (run_dir / "config.yaml").read_text()
        second = run_cli(["launch", f"run.dir={run_dir}", *TINY, "train.seed=99"], timeout=60)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"is in use by pid {first.pid}" in second.stderr
        assert (run_dir / "config.yaml").read_text() == config  # the running job's config is untouched
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert not (run_dir / ".lock").exists()  # released at exit


@pytest.mark.slow
def test_killed_launcher_leaves_no_worker_and_a_relaunch_continues(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, *TINY, "train.max_steps=100000", "checkpoint.interval=3")
    try:
        assert wait_for(lambda: any(r.get("step", 0) >= 4 for r in read_rows(run_dir)), timeout=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        started = time.monotonic()
        assert wait_for(lambda: not worker_processes(run_dir), timeout=30), worker_processes(run_dir)
        gone_after = time.monotonic() - started
    finally:
        proc.kill()
    assert gone_after < 20
    # The workers may have checkpointed on their way out (the agent stops them with SIGTERM): continue 2 past it.
    newest = max(int(p.name[5:]) for p in (run_dir / "checkpoints").iterdir() if not p.name.endswith(".tmp"))
    result = run_cli(["launch", f"run.dir={run_dir}", *TINY, f"train.max_steps={newest + 2}",
                      "checkpoint.interval=3"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "took over the lock of pid" in result.stdout and "its process is gone" in result.stdout
    assert f"step-{newest:07d}" in result.stdout and "resuming from" in result.stdout
    assert max(r["step"] for r in read_rows(run_dir) if "loss" in r) == newest + 2
