"""With no train.global_batch_size given, another layout trains the same model: tp2 + sequence parallel on 2 ranks
takes the same 16 samples per step as dp2 (2 micro-batches of 8 instead of 1 per dp rank), with the same losses;
and a resume under another layout keeps the checkpoint's global batch. In-process ranks (helpers.inprocess_run)."""

from __future__ import annotations

import pytest
from conftest import SMALL
from helpers.inprocess_run import train_in_process as train
from rich.console import Console

from llmtrain.config import load_run_config

pytestmark = pytest.mark.slow
TOL = 1e-5  # fp32, as tests/integration/test_parallel.py
STEPS = ["train.max_steps=10"]
TP_SP = ["parallel.tp=2", "parallel.sequence_parallel=true"]


def _launch_line(run_dir) -> str:
    """The trainer's first line of the newest launch (rank 0's log keeps every launch's)."""
    return [line for line in (run_dir / "logs" / "rank0.log").read_text().splitlines() if " steps of " in line][-1]


def test_tp2_sp_trains_the_dp2_model_with_the_default_global_batch(tmp_path):
    dp = train(tmp_path / "dp2", *SMALL, *STEPS)
    tp = train(tmp_path / "tp2_sp", *SMALL, *STEPS, *TP_SP)
    for name, micro_batches in (("dp2", 1), ("tp2_sp", 2)):
        assert load_run_config(tmp_path / name / "config.yaml").train.global_batch_size == 16
        assert _launch_line(tmp_path / name).endswith(
            f"10 steps of 16 x 64 tokens ({micro_batches} micro-batches of 8 per dp rank)")
    want = {r["step"]: r for r in dp if "loss" in r}
    got = {r["step"]: r for r in tp if "loss" in r}
    assert sorted(got) == sorted(want) == list(range(1, 11))
    assert [got[s]["tokens"] for s in got] == [16 * 64 * s for s in range(1, 11)]
    assert max(abs(got[s]["loss"] - want[s]["loss"]) for s in want) <= TOL
    assert max(abs(got[s]["grad_norm"] - want[s]["grad_norm"]) / want[s]["grad_norm"] for s in want) <= TOL
    assert want[10]["loss"] < want[1]["loss"] - 0.3  # the losses compared actually move


def test_a_resume_under_tp2_sp_keeps_the_checkpoints_global_batch(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, *SMALL, "train.max_steps=4", "train.global_batch_size=32", "train.stop_at_step=2")
    console = Console(record=True, width=400)
    rows = train(run_dir, *SMALL, "train.max_steps=4", *TP_SP, console=console)
    said = console.export_text()
    assert "  parallel.tp: 1 -> 2\n" in said and "global_batch_size" not in said, said
    assert load_run_config(run_dir / "config.yaml").train.global_batch_size == 32
    assert _launch_line(run_dir).endswith("4 steps of 32 x 64 tokens (4 micro-batches of 8 per dp rank)")
    assert [r["tokens"] for r in rows if "loss" in r] == [32 * 64 * s for s in range(1, 5)]
