"""The job commands from the real binary: status after a stop, no torch import, status/follow/cancel of a real local launch, a run stopped by train.stop_at_step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL, read_rows, run_cli, wait_for
from helpers.fake_run import make_run
from helpers.job_records import cli, launch_entry, OK  # noqa: F401


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("exit_code,killed,said", [
    (130, False, "interrupted: stopped by Ctrl-C or llmtrain cancel --now"),
    (None, True, "interrupted: its launcher ended without recording how (it was killed)"),
    (143, False, "preempted: stopped at step 4; checkpoint saved"),
])
def test_status_after_a_stop(tmp_path, capsys, exit_code, killed, said):
    preempted = {"status": "preempted", "step": 4, "saved": True}
    entry = launch_entry(exit_code=exit_code, ended=None if killed else "later")
    lock = None
    if killed:  # a launcher killed with SIGKILL leaves its lock behind, and its launch never ended
        entry["launcher"]["pid"] = _dead_pid()
        lock = dict(entry["launcher"])
    run_dir = make_run(tmp_path, statuses={0: preempted}, launches=[entry], lock=lock)
    code, out, _ = cli(capsys, "status", str(run_dir))
    assert code == 0 and f"state       {said}" in out, out


def test_job_commands_do_not_import_torch(tmp_path):
    run_dir = make_run(tmp_path, statuses={0: OK}, launches=[launch_entry()])
    script = ("import sys; from llmtrain.cli import main\n"
              f"codes = [main([c, {str(run_dir)!r}]) for c in ('status', 'follow', 'cancel')]\n"
              "print(codes, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "[0, 0, 0] False", result.stdout + result.stderr


JOB = SMALL + ["data=synthetic", "cluster.nproc_per_node=1", "train.max_steps=100000", "train.global_batch_size=4",
               "train.micro_batch_size=4", "launch.preempt_grace_s=60"]


def _status(run_dir: Path) -> dict:
    result = run_cli(["status", str(run_dir), "--json"], timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_status_follow_and_cancel_of_a_local_launch(tmp_path):
    run_dir = tmp_path / "run"
    launcher_out = open(tmp_path / "launch.txt", "w")
    launcher = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *JOB],
                                stdout=launcher_out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: len(read_rows(run_dir)) >= 2, timeout=180), (tmp_path / "launch.txt").read_text()
        facts = _status(run_dir)
        assert facts["state"] == "running" and facts["step"] > 0 and facts["launcher"]["pid"] == launcher.pid
        assert facts["backend"] == "local" and facts["launch"] == 1 and facts["nodes"] == [socket.gethostname()]
        assert f"run.dir={run_dir}" in facts["overrides"]

        # follow streams rank 0's step lines; Ctrl-C detaches and leaves the job running.
        follow_out = tmp_path / "follow.txt"
        with open(follow_out, "w") as out:
            follower = subprocess.Popen([sys.executable, "-m", "llmtrain", "follow", str(run_dir)], stdout=out,
                                        stderr=subprocess.STDOUT)
            assert wait_for(lambda: follow_out.read_text().count("\nstep ") >= 3, timeout=60), follow_out.read_text()
            follower.send_signal(signal.SIGINT)
            assert follower.wait(timeout=30) == 0, follow_out.read_text()
        assert "llmtrain: stopped following; the job keeps running" in follow_out.read_text()
        assert launcher.poll() is None

        # A reader that has gone (`llmtrain follow RUN | head -1`, head done) detaches it too, quietly.
        read_end, write_end = os.pipe()
        follower = subprocess.Popen([sys.executable, "-m", "llmtrain", "follow", str(run_dir)], stdout=write_end,
                                    stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        os.close(read_end)
        assert follower.wait(timeout=60) == 0 and follower.stderr.read() == ""
        assert launcher.poll() is None

        # cancel: the job checkpoints and ends; the launcher exits 143.
        result = run_cli(["cancel", str(run_dir)], timeout=150)
        assert result.returncode == 0, result.stdout + result.stderr
        assert launcher.wait(timeout=30) == 143, (tmp_path / "launch.txt").read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher_out.close()
    assert f"asked the launcher pid {launcher.pid} on {socket.gethostname()} to checkpoint and stop" in result.stdout
    assert "the job ended: preempted" in result.stdout and "saved in" in result.stdout, result.stdout
    facts = _status(run_dir)
    assert facts["state"] == "preempted" and facts["checkpoint"] is not None, facts
    assert Path(facts["checkpoint"]["path"], "meta.json").is_file()
    assert f"checkpoint step {facts['checkpoint']['step']} saved in {facts['checkpoint']['path']}" in result.stdout
    assert facts["launches"][0]["exit_code"] == 143 and facts["step"] >= facts["checkpoint"]["step"]
    again = run_cli(["cancel", str(run_dir)], timeout=60)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout


@pytest.mark.slow
def test_a_run_stopped_by_stop_at_step_is_stopped_not_finished(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", *JOB, "train.max_steps=10", "train.stop_at_step=3"])
    assert result.returncode == 0, result.stdout + result.stderr
    said = "stopped at step 3 (train.stop_at_step); 7 steps left; the same command continues"
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"llmtrain: {said}"), result.stdout[-2000:]
    assert "job finished" not in result.stdout and "llmtrain: done," not in result.stdout, result.stdout[-2000:]
    facts = _status(run_dir)
    assert facts["state"] == "stopped" and facts["reason"].startswith(said) and facts["step"] == 3, facts
