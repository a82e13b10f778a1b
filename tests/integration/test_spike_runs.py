"""Loss spikes through real runs (in-process, gpt-tiny, CPU, fp32): a spike injected at one global sample
(LLMTRAIN_INJECT_SPIKE) is rolled back to the checkpoint before it, its samples skipped and recorded (checkpoint,
RUN_DIR/spikes.json, metrics.jsonl, status, report), and the run goes on to max_steps exactly as a run resumed
from that checkpoint with the same skip; policy warn trains on, stop stops, and the bound on rollbacks counts the
run's earlier launches."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import SMALL
from helpers.inprocess_run import train_in_process as train

from llmtrain.checkpoint import store
from llmtrain.rundir.metrics_file import read_metrics

pytestmark = pytest.mark.slow

# 8 samples a step: step 7 takes samples 48-55, so the spike at sample 50 is step 7's. A checkpoint every 4 steps.
COMMON = SMALL + ["data=synthetic", "train.global_batch_size=8", "train.micro_batch_size=2", "checkpoint.interval=4",
                  "checkpoint.keep=5", "train.spike.sigma=4", "train.spike.window=3", "train.spike.margin_steps=2"]
BASE = [*COMMON, "cluster.nproc_per_node=1"]
SPIKE = "50:100"  # sample 50's batch: loss and gradients x100
# Back to step 4 (32 samples seen); skipped: samples 32 up to the end of step 7 (56) and 2 more steps: 32-71.
SKIP = {"step": 7, "checkpoint_step": 4, "start": 32, "end": 72}


def log_of(run: Path) -> str:
    return (run / "logs" / "rank0.log").read_text()


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(run / "metrics.jsonl")) if "loss" in r}


def failed_run(run: Path, *overrides: str) -> tuple[str, str]:
    """A run that must fail: (rank 0's recorded error, its log)."""
    with pytest.raises(AssertionError, match=r"exit codes \[1\]"):
        train(run, *overrides)
    status = json.loads((run / "logs" / "rank0.status").read_text())
    assert status["status"] == "error"
    return status["error"], log_of(run)


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("spike") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMTRAIN_INJECT_SPIKE", SPIKE)
        train(run, *BASE, "train.spike.policy=rollback", "train.spike.max_rollbacks=1", "train.max_steps=12")
    return run


def test_a_spike_is_rolled_back_and_the_run_reaches_max_steps(rolled_back):
    log = log_of(rolled_back)
    spike = [line for line in log.splitlines() if "loss spike" in line]
    assert len(spike) == 1 and spike[0].startswith("llmtrain: step 7: loss spike: loss ")
    assert spike[0].endswith("of the last 3 steps (train.spike.sigma=4); rolling back (rollback 1 of "
                             "train.spike.max_rollbacks=1)")
    ckpt4 = rolled_back / "checkpoints" / "step-0000004"
    assert f"llmtrain: rollback 1: resumed from {ckpt4} at step 4 (32 samples seen)" in log
    assert ("llmtrain: rollback 1: skipping samples 32-71 (40 samples: steps 5-7 and train.spike.margin_steps=2 "
            "more); training goes on from step 4 at sample 72") in log
    assert "llmtrain: done, 12 steps" in log
    rows = read_metrics(str(rolled_back / "metrics.jsonl"))
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 13))  # steps 5-7 of before: cut
    assert all(math.isfinite(v) and v < 20 for v in losses(rolled_back).values())  # the spike (x100) is gone
    event = [r for r in rows if r.get("event")]
    assert len(event) == 1 and {k: event[0][k] for k in SKIP} == {**SKIP, "step": 4}
    assert event[0]["event"] == "rollback" and event[0]["spike_step"] == 7 and event[0]["metric"] == "loss"
    assert event[0]["value"] > 100  # step 7's loss, x100
    assert rows.index(event[0]) == 4  # right after step 4's row


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_skip_is_recorded_in_the_run_dir_and_every_later_checkpoint(rolled_back):
    record = json.loads((rolled_back / "spikes.json").read_text())["rollbacks"]
    assert len(record) == 1 and {k: record[0][k] for k in SKIP} == SKIP
    assert record[0]["why"].startswith("loss ") and record[0]["why"].endswith("(train.spike.sigma=4)")
    metas = {info.step: info.meta for info in store.list_checkpoints(str(rolled_back))}
    assert sorted(metas) == [4, 8, 12] and "skipped" not in metas[4]
    for step in (8, 12):
        assert [{k: e[k] for k in SKIP} for e in metas[step]["skipped"]] == [SKIP]
    # The trainer state itself (DCP's extra entry), as a resume under any layout reads it.
    import torch.distributed.checkpoint as dcp

    state = {"extra": {"skipped": "", "samples_seen": 0, "step": 0}}
    dcp.load(state, checkpoint_id=str(rolled_back / "checkpoints" / "step-0000012"), no_dist=True)
    assert state["extra"]["step"] == 12 and state["extra"]["samples_seen"] == 72 + 8 * 8
    assert [{k: e[k] for k in SKIP} for e in json.loads(state["extra"]["skipped"])] == [SKIP]


def test_the_steps_after_the_rollback_equal_a_resume_with_the_same_skip(rolled_back, tmp_path):
    """No spike here: trained to the checkpoint of step 4, then (as after a crash before the next save) resumed
    with RUN_DIR/spikes.json naming the skip: the same samples, the same losses."""
    run, other = tmp_path / "run", tmp_path / "other"
    train(run, *BASE, "train.spike.policy=rollback", "train.max_steps=12", "train.stop_at_step=4")
    shutil.copy(rolled_back / "spikes.json", run / "spikes.json")
    shutil.copytree(run, other)
    (other / "config.yaml").write_text((other / "config.yaml").read_text().replace(str(run), str(other)))
    train(run, *BASE, "train.spike.policy=rollback", "train.max_steps=12")
    assert "llmtrain: skipping samples 32-71 (rolled back past a loss spike: 1 rollback(s) in " in log_of(run)
    mine, theirs = losses(rolled_back), losses(run)
    assert sorted(theirs) == list(range(1, 13))
    for step in range(1, 13):
        assert abs(mine[step] - theirs[step]) <= 1e-6, (step, mine[step], theirs[step])
    # The same skip resumed under another layout (dp=2): the same samples, the same losses within fp32's reordering.
    train(other, *COMMON, "cluster.nproc_per_node=2", "train.spike.policy=rollback", "train.max_steps=12")
    assert "resharded from layout" in log_of(other)
    theirs = losses(other)
    assert sorted(theirs) == list(range(1, 13))
    for step in range(5, 13):
        assert abs(mine[step] - theirs[step]) <= 1e-5, (step, mine[step], theirs[step])


def test_the_bound_counts_the_runs_earlier_rollbacks(rolled_back, tmp_path, monkeypatch):
    """A later launch of the same run (max_rollbacks=1, one rollback in its record): the next spike stops it. The
    window starts empty at every launch: steps 13-15 fill it."""
    run = tmp_path / "run"
    shutil.copytree(rolled_back, run)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace(str(rolled_back), str(run)))
    monkeypatch.setenv("LLMTRAIN_INJECT_SPIKE", "162:100")  # step 16: samples 160-167
    error, log = failed_run(run, *BASE, "train.spike.policy=rollback", "train.spike.max_rollbacks=1",
                            "train.max_steps=20")
    assert error.startswith("RuntimeError: step 16: loss spike: loss "), error
    assert error.endswith("; stopping at step 16 without saving (train.spike.policy=rollback; "
                          "train.spike.max_rollbacks=1 reached (1 rollback(s) in this run))"), error
    assert log.count("rolling back") == 1  # the first launch's: rank 0's log holds every launch
    assert [i.step for i in store.list_checkpoints(str(run))] == [4, 8, 12]


def test_a_non_finite_streak_rolls_back_too_and_a_step_keyed_fault_comes_again(tmp_path, monkeypatch):
    """Steps 6-7 non-finite (train.max_bad_steps=2): back to step 4, samples 32 through step 7's (48-55) and 2
    more steps skipped. The injection is keyed by step, so steps 6-7 fail again: the bound (1) stops the run."""
    run = tmp_path / "run"
    monkeypatch.setenv("LLMTRAIN_INJECT_NONFINITE", "6:0,7:0")
    error, log = failed_run(run, *BASE, "train.spike.policy=rollback", "train.spike.max_rollbacks=1",
                            "train.max_bad_steps=2", "train.max_steps=12")
    assert ("llmtrain: step 7: 2 consecutive non-finite steps (train.max_bad_steps=2); rolling back (rollback 1 of "
            "train.spike.max_rollbacks=1)") in log
    assert "llmtrain: rollback 1: skipping samples 32-71 (40 samples: steps 5-7 and train.spike.margin_steps=2" in log
    assert error == ("RuntimeError: step 7: 2 consecutive non-finite steps (train.max_bad_steps=2); stopping at step 7 "
                     "without saving (train.spike.policy=rollback; train.spike.max_rollbacks=1 reached (1 "
                     "rollback(s) in this run))"), error
    record = json.loads((run / "spikes.json").read_text())["rollbacks"]
    assert [(e["step"], e["checkpoint_step"], e["start"], e["end"], e["metric"]) for e in record] == [
        (7, 4, 32, 72, "non-finite")]


def test_policy_warn_says_one_line_and_trains_on(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("LLMTRAIN_INJECT_SPIKE", SPIKE)
    train(run, *BASE, "train.spike.policy=warn", "train.max_steps=9")
    log = log_of(run)
    lines = [line for line in log.splitlines() if "spike" in line]
    assert len(lines) == 1 and lines[0].startswith("llmtrain: step 7: loss spike: loss ")
    assert lines[0].endswith("; training on (train.spike.policy=warn)")
    assert sorted(losses(run)) == list(range(1, 10)) and losses(run)[7] > 100
    events = [r for r in read_metrics(str(run / "metrics.jsonl")) if r.get("event")]
    assert [(e["step"], e["event"]) for e in events] == [(7, "spike")]
    assert not (run / "spikes.json").exists()


def test_policy_stop_fails_naming_the_step_without_saving(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("LLMTRAIN_INJECT_SPIKE", SPIKE)
    error, log = failed_run(run, *BASE, "train.max_steps=9")  # policy stop: the default
    assert error.startswith("RuntimeError: step 7: loss spike: loss "), error
    assert error.endswith("of the last 3 steps (train.spike.sigma=4); stopping at step 7 without saving "
                          "(train.spike.policy=stop)"), error
    assert [i.step for i in store.list_checkpoints(str(run))] == [4]
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]


def test_a_rollback_without_a_checkpoint_before_the_spike_stops(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("LLMTRAIN_INJECT_SPIKE", SPIKE)
    error, log = failed_run(run, *BASE, "train.spike.policy=rollback", "checkpoint.interval=0", "train.max_steps=9")
    assert error.startswith("RuntimeError: step 7: loss spike: loss "), error
    assert error.endswith("; no checkpoint of this run before step 7 to roll back to; stopping at step 7 without "
                          "saving (train.spike.policy=rollback)"), error
    assert not (run / "checkpoints").exists() or not store.list_checkpoints(str(run))
    assert not (run / "spikes.json").exists()


def test_status_and_report_name_the_rollback(rolled_back):
    from llmtrain.jobs import named_run_dir
    from llmtrain.jobs.status import facts, lines
    from llmtrain.report.run_report import summarize
    from llmtrain.report.spike_marks import marks

    run_dir, cfg = named_run_dir.load(str(rolled_back))
    said = [line for line in lines(facts(run_dir, cfg)) if line.startswith("rollbacks")]
    assert said == ["rollbacks   1 so far: step 7 -> checkpoint step 4, samples 32-71 skipped (40)"]
    rows = read_metrics(str(rolled_back / "metrics.jsonl"))
    assert ("rollbacks", "1: step 7 -> checkpoint step 4, samples 32-71 skipped (40)") in summarize(run_dir, rows, cfg)
    assert marks(rows) == [(7, "spike at step 7: rolled back to step 4")]
