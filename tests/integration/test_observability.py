"""What a run leaves for the user to look at: MFU in metrics, TensorBoard events, profiler traces, the report;
and train.compile giving the same losses. The runs train in-process: what the trainer writes is under test, not the
launcher."""

from __future__ import annotations

import json

import pytest
from conftest import SMALL, run_cli, train_losses
from helpers.inprocess_run import train_in_process
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.slow
ONE = [*SMALL, "cluster.nproc_per_node=1", "train.global_batch_size=8", "train.micro_batch_size=8",
       "checkpoint.at_end=false"]


def test_metrics_tensorboard_profile_and_report(tmp_path):
    run_dir = tmp_path / "run"
    rows = train_in_process(run_dir, *ONE, "train.max_steps=5", "logging.tensorboard=true", "profile.steps=[2,3]",
                            "hardware=cpu", "+hardware.peak_tflops.float32=100")
    train = [r for r in rows if "loss" in r]
    # MFU is achieved model FLOPs over the peak the user gave, recorded beside it.
    assert all(r["tflops"] > 0 and r["peak_tflops"] == 100.0 and r["mfu"] == pytest.approx(r["tflops"] / 100)
               for r in train)
    events = EventAccumulator(str(next((run_dir / "tensorboard").glob("events.out.tfevents.*"))))
    events.Reload()
    loss = {e.step: e.value for e in events.Scalars("train/loss")}
    assert sorted(loss) == [r["step"] for r in train]
    assert abs(loss[5] - train[-1]["loss"]) < 1e-5
    trace = json.loads((run_dir / "profile" / "rank0.trace.json").read_text())
    assert trace["traceEvents"], "empty profiler trace"
    result = run_cli(["report", str(run_dir)])
    assert result.returncode == 0, result.stderr
    assert "MFU (median)" in result.stdout and "MFU not shown" not in result.stdout
    for name in ("loss.png", "lr.png", "throughput.png"):
        assert (run_dir / "report" / name).read_bytes()[:4] == b"\x89PNG"


def test_compile_gives_the_same_losses(tmp_path):
    train_in_process(tmp_path / "eager", *ONE, "train.max_steps=4")
    train_in_process(tmp_path / "compiled", *ONE, "train.max_steps=4", "train.compile=true", timeout=900)
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert max(abs(eager[s] - compiled[s]) for s in eager) <= 1e-4
