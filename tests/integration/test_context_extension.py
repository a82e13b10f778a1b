"""A context-extension stage: a Llama trained at model.seq_len 64 resumes at 128 with other rotary settings (the
weights load, the sample stream goes on from its sample count in samples of 128 tokens), and a GPT-2, whose
position table cannot grow, is refused in one line naming model.seq_len. In-process ranks (helpers.inprocess_run)."""

from __future__ import annotations

import math

import pytest
from conftest import SMALL
from helpers.inprocess_run import prepare_launch
from helpers.inprocess_run import train_in_process as train
from rich.console import Console

from llmtrain.config import load_run_config
from llmtrain.console import error_line
from llmtrain.errors import CheckpointUsageError

pytestmark = pytest.mark.slow
STAGE_1 = ["model=llama-tiny", *SMALL, "train.max_steps=6", "train.stop_at_step=3"]
LONGER = ["model.seq_len=128", "model.rope_theta=40000",
          "model.rope_scaling={factor:2.0,original_max_position_embeddings:64}"]


def test_a_llama_resumes_at_twice_the_context_with_new_rotary_settings(tmp_path):
    run_dir = tmp_path / "run"
    first = train(run_dir, *STAGE_1)
    assert [r["tokens"] for r in first if "loss" in r] == [16 * 64 * s for s in (1, 2, 3)]
    console = Console(record=True, width=1000)
    rows = train(run_dir, "model=llama-tiny", *SMALL, "train.max_steps=6", *LONGER, console=console)
    said = console.export_text().splitlines()
    ckpt = run_dir / "checkpoints" / "step-0000003"
    assert said[0] == f"llmtrain: resuming from {ckpt} with these changes:"
    assert "  model.seq_len: 64 -> 128" in said and "  model.rope_theta: 10000.0 -> 40000.0" in said
    assert said[-1] == (
        "llmtrain: context extension: model.seq_len 64 -> 128, model.rope_scaling None -> {factor: 2.0, "
        "low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 64}, model.rope_theta "
        "10000.0 -> 40000.0; the weights load as saved; the data goes on from the checkpoint's sample count, in "
        "windows of 128 tokens cut anew (docs/models.md#long-context-training)")
    log = (run_dir / "logs" / "rank0.log").read_text().splitlines()
    assert f"llmtrain: resumed from {ckpt} at step 3 (48 samples seen); model.seq_len 64 -> 128: samples from 48 " \
           "on are 128 tokens" in log
    assert [line for line in log if " steps of " in line][-1].endswith(
        "6 steps of 16 x 128 tokens (1 micro-batches of 8 per dp rank)")
    resumed = [r for r in rows if "loss" in r and r["step"] > 3]
    assert [r["step"] for r in resumed] == [4, 5, 6]
    # tokens count what was read: 3 steps of 16 x 64, then 16 x 128 per step
    assert [r["tokens"] for r in resumed] == [3 * 16 * 64 + 16 * 128 * k for k in (1, 2, 3)]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in resumed)
    assert resumed[0]["loss"] < first[0]["loss"] - 0.2  # the trained weights loaded (4.99 vs 5.39 from scratch)
    saved = load_run_config(run_dir / "checkpoints" / "step-0000006" / "config.yaml")
    assert (saved.model.seq_len, saved.model.rope_theta, saved.model.rope_scaling.factor) == (128, 40000.0, 2.0)


def test_a_gpt2_position_table_cannot_grow_and_says_so_in_one_line(tmp_path):
    run_dir = tmp_path / "gpt"
    train(run_dir, *SMALL, "train.max_steps=1")
    ckpt = run_dir / "checkpoints" / "step-0000001"
    # the same run directory, and the checkpoint resumed into another one
    for where, extra in ((run_dir, []), (tmp_path / "other", [f"checkpoint.resume={ckpt}"])):
        with pytest.raises(CheckpointUsageError) as caught:
            prepare_launch(where, *SMALL, "train.max_steps=2", "model.seq_len=128", *extra)
        assert caught.value.exit_code == 2
        assert error_line(caught.value) == (
            f"llmtrain: error: model.seq_len: resuming {ckpt} with model.seq_len 64 -> 128: model.arch=gpt2 learns "
            "a position table of 64 rows, which cannot grow or shrink; keep model.seq_len=64 (a model with rotary positions, "
            "e.g. model.arch=llama, may change it)")
