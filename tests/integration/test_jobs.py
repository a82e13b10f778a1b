"""The job behind a run directory: the record a launch writes (job.json), `llmtrain status`, `follow` and `cancel`,
on fake run directories (fast, Slurm faked at subprocess.run) and on a real local launch (slow)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.fake_run import make_run
from helpers.job_records import cli, launch_entry, OK  # noqa: F401

from llmtrain.launch.launch_record import LaunchRecord, launch_overrides, read_launches
from llmtrain.launch.backends.ssh import SSHBackend


# ---- fake run directories ------------------------------------------------------------------------------------


def status_json(capsys, run_dir: Path) -> dict:
    code, out, _ = cli(capsys, "status", str(run_dir), "--json")
    assert code == 0 and out.count("\n") == 1, out
    return json.loads(out)


# ---- the record ------------------------------------------------------------------------------------------------
def stand_in_cfg(run_dir: Path):
    """What the record reads of a composed config (which always has run and train)."""
    return SimpleNamespace(run=SimpleNamespace(dir=str(run_dir)), train=SimpleNamespace(global_batch_size=16))


def test_each_launch_is_recorded_and_earlier_ones_are_kept(tmp_path, monkeypatch):
    cfg = stand_in_cfg(tmp_path)
    monkeypatch.setattr(sys, "argv", ["llmtrain", "launch", "--config-dir", "mine", "model=gpt-125m", "~env.X"])
    first = LaunchRecord.start(cfg, SimpleNamespace(name="local", host_names=lambda: [socket.gethostname()]),
                               batch_origin="default")
    (entry,) = read_launches(str(tmp_path))
    assert entry["launch"] == 1 and entry["backend"] == "local" and entry["ended"] is None
    assert entry["global_batch"] == {"size": 16, "origin": "default"}
    assert entry["launcher"] == {"host": socket.gethostname(), "pid": os.getpid()}
    assert entry["hosts"] == [socket.gethostname()] and entry["overrides"] == ["model=gpt-125m", "~env.X"]
    first.ended(143, None)
    second = LaunchRecord.start(cfg, SimpleNamespace(name="slurm", host_names=lambda: None))
    assert [e["launch"] for e in read_launches(str(tmp_path))] == [1, 2]
    assert read_launches(str(tmp_path))[1]["hosts"] is None  # Slurm picks them when the job starts
    second.ended(0, "4242")
    old, new = read_launches(str(tmp_path))
    assert old["exit_code"] == 143 and new["job_id"] == "4242" and new["exit_code"] == 0 and new["ended"]
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # written atomically: no temporary left


def test_ssh_hosts_come_from_the_hostfile(tmp_path):
    cfg = stand_in_cfg(tmp_path)
    hosts = [SimpleNamespace(name="node1"), SimpleNamespace(name="node2")]
    backend = SimpleNamespace(name="ssh", hosts=hosts)
    backend.host_names = lambda: SSHBackend.host_names(backend)
    LaunchRecord.start(cfg, backend)
    assert read_launches(str(tmp_path))[0]["hosts"] == ["node1", "node2"]


def test_overrides_are_those_of_launch_only():
    assert launch_overrides(["launch", "a=1", "--config-dir", "d", "+b=2"]) == ["a=1", "+b=2"]
    assert launch_overrides(["doctor", "a=1"]) == []


# ---- status ----------------------------------------------------------------------------------------------------
def test_status_of_a_finished_run(tmp_path, capsys):
    run_dir = make_run(tmp_path, statuses={0: OK, 1: OK}, launches=[launch_entry()])
    code, out, err = cli(capsys, "status", str(run_dir))
    assert code == 0 and not err
    lines = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(("last", " ")))
    assert lines["state"] == "finished: all 2 rank(s) finished"
    assert lines["step"] == "4 / 4"
    assert lines["checkpoint"] == f"step 4 in {run_dir / 'checkpoints' / 'step-0000004'}"
    assert lines["elapsed"] == "10.0 s"
    assert f"local, launch 1, launcher pid 1 on {socket.gethostname()}" in lines["job"]
    assert "last row    step 4: loss 4.0000 | 1,004 tok/s | MFU 12.5%" in out


def test_status_json_has_every_fact(tmp_path, capsys):
    run_dir = make_run(tmp_path, statuses={0: OK}, launches=[launch_entry(exit_code=143), launch_entry(2)])
    facts = status_json(capsys, run_dir)
    assert facts["state"] == "finished" and facts["backend"] == "local" and facts["launch"] == 2
    assert facts["step"] == 4 and facts["max_steps"] == 4 and facts["loss"] == 4.0
    assert facts["tokens_per_s"] == 1004.0 and facts["mfu"] == 0.125 and facts["elapsed_s"] == 10.0
    assert facts["checkpoint"] == {"step": 4, "path": str(run_dir / "checkpoints" / "step-0000004")}
    assert facts["nodes"] == [socket.gethostname()] and facts["job_id"] is None
    assert [e["exit_code"] for e in facts["launches"]] == [143, 0]
    assert {"reason", "launcher", "started", "overrides", "run_dir", "slurm_state"} <= set(facts)


def test_status_of_a_run_stopped_by_stop_at_step_says_stopped(tmp_path, capsys):
    stopped = {"status": "ok", "error": None, "step": 60, "max_steps": 300}
    run_dir = make_run(tmp_path, statuses={0: stopped, 1: stopped}, launches=[launch_entry()])
    said = "stopped at step 60 (train.stop_at_step); 240 steps left; the same command continues"
    facts = status_json(capsys, run_dir)
    assert facts["state"] == "stopped" and facts["reason"].startswith(said), facts
    code, out, _ = cli(capsys, "status", str(run_dir))
    assert code == 0 and f"state       stopped: {said}" in out, out
    assert cli(capsys, "follow", str(run_dir))[0] == 0  # a stop asked for is no failure


def test_status_of_a_failed_run_names_the_rank(tmp_path, capsys):
    run_dir = make_run(tmp_path, steps=2, checkpoint=None, launches=[launch_entry(exit_code=1)],
                       statuses={0: {"status": "error", "error": "RuntimeError: boom\nmore"}, 1: OK})
    code, out, _ = cli(capsys, "status", str(run_dir))
    assert code == 0 and "state       failed: rank 0 failed: RuntimeError: boom\n" in out
    assert "checkpoint  none" in out and "step        2 / 4" in out
    assert status_json(capsys, run_dir)["state"] == "failed"
    # Where the rank ran, as it recorded it, named as everywhere else.
    (run_dir / "logs" / "rank0.place").write_text('{"rank": 0, "node": 1, "host": "node2", "local_rank": 0}')
    code, out, _ = cli(capsys, "status", str(run_dir))
    assert "state       failed: rank 0 (node 1, host node2, local rank 0) failed: RuntimeError: boom\n" in out


@pytest.mark.parametrize("make,said", [(lambda p: p / "missing", "no such run directory"),
                                       (lambda p: p, "holds no config.yaml")])
def test_status_of_no_run_directory_is_one_line(tmp_path, capsys, make, said):
    code, out, err = cli(capsys, "status", str(make(tmp_path)))
    assert code == 2 and not out and err.count("\n") == 1 and said in err, err


def test_status_of_a_running_local_job(tmp_path, capsys):
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": "now"}  # this process: alive
    entry = dict(launch_entry(exit_code=None, ended=None), launcher={"host": holder["host"], "pid": os.getpid()})
    run_dir = make_run(tmp_path, steps=3, launches=[entry], lock=holder)
    facts = status_json(capsys, run_dir)
    assert facts["state"] == "running" and f"launcher pid {os.getpid()}" in facts["reason"]
    assert facts["step"] == 4 and facts["launcher"]["pid"] == os.getpid()  # the checkpoint is at step 4


# ---- Slurm, with scontrol and scancel faked -------------------------------------------------------------------
class FakeSlurm:
    """scontrol and scancel for one job: scancel --signal=USR1 makes its ranks checkpoint and the job complete."""

    def __init__(self, run_dir: Path, state: str = "RUNNING"):
        self.run_dir = run_dir
        self.state = state
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        out = ""
        if argv[:3] == ["scontrol", "show", "job"]:
            nodes = "(null)" if self.state == "PENDING" else "node[1-2]"
            out = (f"JobId={argv[3]} JobName=llmtrain-gpt-tiny\n   JobState={self.state} Reason=None "
                   f"Dependency=(null)\n   ExitCode=0:0\n   NodeList={nodes}\n   BatchHost=node1\n")
        elif argv[:3] == ["scontrol", "show", "hostnames"]:
            out = "node1\nnode2\n"
        elif argv[0] == "scancel" and "--signal=USR1" in argv:
            for rank in (0, 1):
                (self.run_dir / "logs" / f"rank{rank}.status").write_text(
                    json.dumps({"status": "preempted", "step": 4, "saved": True}))
            self.state = "COMPLETED"
        elif argv[0] == "scancel":
            self.state = "CANCELLED"
        return subprocess.CompletedProcess(argv, 0, out, "")


@pytest.fixture
def slurm_run(tmp_path, monkeypatch):
    lock = {"host": "login1", "pid": 1, "job": "4242", "started": "2025-01-01 10:00:00"}
    run_dir = make_run(tmp_path, "cluster=slurm", "cluster.nproc_per_node=1", "device=cpu", lock=lock,
                       launches=[launch_entry(backend="slurm", job_id="4242")])
    fake = FakeSlurm(run_dir)
    monkeypatch.setattr("llmtrain.slurm.client.subprocess.run", fake)
    return run_dir, fake


def test_status_of_a_slurm_job_asks_scontrol(slurm_run, capsys):
    run_dir, fake = slurm_run
    facts = status_json(capsys, run_dir)
    assert facts["state"] == "running" and facts["job_id"] == "4242" and facts["slurm_state"] == "RUNNING"
    assert facts["nodes"] == ["node1", "node2"] and facts["backend"] == "slurm"
    fake.state = "PENDING"
    code, out, _ = cli(capsys, "status", str(run_dir))
    assert "state       pending: Slurm job 4242 PENDING" in out and "nodes       not assigned yet" in out
    fake.state = "TIMEOUT"
    assert status_json(capsys, run_dir)["state"] == "failed"


def test_cancel_of_a_slurm_job_checkpoints_then_reports(slurm_run, capsys):
    run_dir, fake = slurm_run
    code, out, _ = cli(capsys, "cancel", str(run_dir))
    assert code == 0, out
    assert ["scancel", "--signal=USR1", "4242"] in fake.calls
    assert "asked Slurm job 4242 to checkpoint and stop" in out
    assert "the job ended: preempted" in out
    assert f"checkpoint step 4 saved in {run_dir / 'checkpoints' / 'step-0000004'}" in out
    code, out, _ = cli(capsys, "cancel", str(run_dir))
    assert code == 0 and out.startswith("llmtrain: nothing to cancel: no job runs in") and out.count("\n") == 1


@pytest.mark.parametrize("state,now", [("RUNNING", True), ("PENDING", False)])
def test_cancel_now_or_pending_scancels_the_job(slurm_run, capsys, state, now):
    run_dir, fake = slurm_run
    fake.state = state
    code, out, _ = cli(capsys, "cancel", str(run_dir), *(["--now"] if now else []))
    assert code == 0, out
    assert ["scancel", "4242"] in fake.calls and not any("--signal=USR1" in c for c in fake.calls)
    assert "cancelled Slurm job 4242" in out and "the job ended: interrupted: Slurm job 4242 was cancelled" in out


# ---- follow and cancel of a job that has ended -------------------------------------------------------------------
@pytest.mark.parametrize("status,entry,code", [
    (OK, launch_entry(), 0),
    ({"status": "error", "error": "ValueError: x"}, launch_entry(exit_code=1), 1),
    ({"status": "preempted", "step": 4, "saved": True}, launch_entry(exit_code=143), 143),
])
def test_follow_of_an_ended_job_prints_its_final_state_at_once(tmp_path, capsys, status, entry, code):
    run_dir = make_run(tmp_path, statuses={0: status}, launches=[entry])
    started = time.monotonic()
    got, out, _ = cli(capsys, "follow", str(run_dir))
    assert got == code and time.monotonic() - started < 5
    assert out.count("\n") == 1 and "step 4/4; checkpoint step 4 in" in out, out


# ---- a real local job ------------------------------------------------------------------------------------------


