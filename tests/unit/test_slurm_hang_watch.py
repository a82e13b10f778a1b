"""A Slurm job's own hang watch (slurm_hang_watch.py) with Slurm's commands faked: a rank whose heartbeat stops is
judged, the verdict goes to the job's log and job.json, the job's srun steps (not its batch step) get SIGKILL; the
job's end fails the hung start with the verdict or requeues it; a follower shows the watch's lines and no failure
report of its own; `llmtrain status` says the verdict."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.fake_slurm import FakeMonitor, fake, job, slurm_cfg  # noqa: F401  (fake: the fixture)

from llmtrain.jobs import job_state as job_state_module
from llmtrain.jobs.slurm_query import SlurmJob
from llmtrain.launch.backends import slurm
from llmtrain.launch.backends.slurm import SlurmBackend
from llmtrain.launch.launch_record import note_job
from llmtrain.launch.node import slurm_hang_watch, slurm_job_end
from llmtrain.rundir.hang_files import progress_path, write_json
from llmtrain.rundir.node_ledger import read_ledger
from llmtrain.slurm import client

VERDICT = ("llmtrain: hang: rank 1 (node 1, host node2, local rank 0) never entered all_reduce #159 on the dp "
           "group; rank 0 waits in it; rank 1 did not answer the stack request (process stopped)")


def _run_dir(tmp_path, max_starts=3):
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.yaml").write_text(f"cluster:\n  nnodes: 2\n  max_starts_without_progress: {max_starts}\n")
    (tmp_path / "job.json").write_text(json.dumps({"launches": [{"launch": 1, "backend": "slurm",
                                                                 "job_id": "12"}]}))
    return str(tmp_path)


@pytest.fixture
def squeue(monkeypatch):
    """squeue lists step 12.0 and the batch step; scancel calls are recorded."""
    cancels = []
    monkeypatch.setattr(client, "run", lambda argv, timeout: __import__("subprocess").CompletedProcess(
        argv, 0, "12.0\n12.batch\n" if argv[0] == "squeue" else "", ""))
    monkeypatch.setattr(client, "cancel", lambda *args, timeout=60: cancels.append(list(args)))
    monkeypatch.setattr(slurm_hang_watch, "CHECK_S", 0.05)
    return cancels


def test_a_stalled_rank_is_judged_recorded_and_its_steps_killed(tmp_path, squeue, capsys):
    run_dir = _run_dir(tmp_path)
    for rank in (0, 1):  # both stepped once, then nothing more
        write_json(progress_path(run_dir, rank), {"step": 4, "steps": 4, "beats": 4, "phase": None, "restart": 0,
                                                  "median_step_s": 0.01})
    code = slurm_hang_watch.watch(run_dir, "12", 2, 2, 0.3, 0.2, threading.Event())
    assert code == slurm_hang_watch.EXIT_HUNG
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("llmtrain: hang suspected: no step completed for ")
    verdict = ("llmtrain: hang: no rank waits in a collective; rank 0 did not answer the stack request; rank 1 did "
               "not answer the stack request; node(s) 0, 1 did not answer (their agent is stopped or unreachable)")
    assert out[1] == verdict and out[2].startswith(f"llmtrain: hang evidence in {run_dir}/hangs/")
    assert out[3:] == ["llmtrain: hung: stopped job 12's steps (SIGKILL to every process srun started)"]
    assert squeue == [["--signal=KILL", "12.0"]]  # the batch step runs the job's end: left alone
    assert json.loads((tmp_path / "job.json").read_text())["launches"][0]["hang"] == verdict


def test_the_watch_ends_quietly_when_srun_ends_without_a_hang(tmp_path, squeue, capsys):
    stop = threading.Event()
    stop.set()
    assert slurm_hang_watch.watch(_run_dir(tmp_path), "12", 2, 2, 0.3, 0.2, stop) == 0
    assert squeue == [] and capsys.readouterr().out == ""


def test_a_hung_start_fails_with_its_verdict_or_is_requeued_as_a_failed_start(tmp_path, monkeypatch, capsys):
    run_dir = _run_dir(tmp_path, max_starts=1)
    note_job(run_dir, "12", hang=VERDICT)
    requeued = []
    monkeypatch.setattr(client, "requeue", lambda job, timeout=60: requeued.append(job))
    monkeypatch.setattr(client, "show_job", lambda job, timeout=30: None)
    monkeypatch.setattr(slurm_job_end, "slurm_start_ended", lambda run_dir, job: None)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("LLMTRAIN_HANG_WATCH", str(slurm_hang_watch.EXIT_HUNG))
    # srun's own status (137: its tasks were killed) is not the job's: a hang is a failure, exit 1.
    assert slurm_job_end.main([run_dir, "137", "30", "0", "0"]) == 1
    assert capsys.readouterr().out == "" and requeued == []
    # With cluster.requeue: a failed start, counted by the breaker (no checkpoint saved: stopped at once here).
    assert slurm_job_end.main([run_dir, "137", "30", "1", "0"]) == 1
    reason = f"1 starts in a row saved no checkpoint (last: {VERDICT[len('llmtrain: '):]})"
    assert capsys.readouterr().out.splitlines() == [f"llmtrain: this start failed ({VERDICT[len('llmtrain: '):]})",
                                                    f"llmtrain: not requeued: {reason}"]
    assert read_ledger(run_dir)["hosts"] == {}  # the hang is recorded by the watch's verdict, not as a failure
    monkeypatch.setenv("LLMTRAIN_HANG_WATCH", "143")  # the watch was stopped: srun's status decides
    assert slurm_job_end.job_end(run_dir, 0, 30, False, "12", hung=False) == 0


def test_the_batch_script_runs_the_watch_and_hands_its_status_to_the_jobs_end(tmp_path):
    cfg = slurm_cfg("cluster.cpus_per_node=2", "launch.hang_timeout_s=7", "launch.hang_evidence_wait_s=9")
    lines = SlurmBackend(cfg, str(tmp_path / "run")).script().splitlines()
    watch = next(i for i, ln in enumerate(lines) if "-m llmtrain.launch.node.slurm_hang_watch " in ln)
    assert lines[watch].endswith(f"slurm_hang_watch {tmp_path}/run 2 1 7 9 & hangwatch=$!")
    srun = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    assert watch < srun
    assert lines[-2:] == ['kill -TERM "$hangwatch" 2>/dev/null; wait "$hangwatch"; hung=$?',
                          'LLMTRAIN_HANG_WATCH="$hung" exec ' + lines[-1].split(" exec ", 1)[1]]
    assert f"rm -f {tmp_path}/run/logs/rank*.status {tmp_path}/run/logs/rank*.progress" in lines


def test_a_follower_shows_the_jobs_verdict_and_reports_no_failure_of_its_own(tmp_path, fake, monkeypatch):
    fake(jobs=[job(state="RUNNING", nodes="node[1-2]"), job(state="RUNNING", nodes="node[1-2]"),
               job(state="FAILED", nodes="node[1-2]", exit="1:0")])
    reported = []
    monkeypatch.setattr(slurm, "report_failure", lambda *a, **k: reported.append(a))
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    watch_lines = ["llmtrain: hang suspected: no step completed for 6 s (rank 1 at step 158); the bound is 5 s",
                   VERDICT, f"llmtrain: hang evidence in {run_dir}/hangs/20261204-210000",
                   "llmtrain: hung: stopped job 123's steps (SIGKILL to every process srun started)"]
    (run_dir / "logs" / "slurm-123.out").write_text("\n".join(["llmtrain: job 123 on node[1-2], rendezvous "
                                                               "node1:20123 (restart 0)", *watch_lines]) + "\n")
    monitor = FakeMonitor()
    backend = SlurmBackend(slurm_cfg("cluster.follow=true"), str(run_dir))
    assert backend.run(monitor) == 1 and backend.finished_job and backend.hung
    assert [ln for ln in monitor.text.splitlines() if ln.startswith(("llmtrain: hang", "llmtrain: hung"))] == \
        watch_lines
    assert reported == []


def test_status_of_a_slurm_job_stopped_as_hung_says_the_verdict(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    note_job(run_dir, "12", hang=VERDICT)
    monkeypatch.setattr(job_state_module, "query", lambda job: SlurmJob("12", "FAILED", ["node1", "node2"], 1))
    state = job_state_module.job_state(run_dir)
    assert (state.state, state.reason) == ("failed", VERDICT[len("llmtrain: "):])
