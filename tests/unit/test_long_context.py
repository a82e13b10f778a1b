"""Long context: Llama 3.1's rotary scaling at 131,072 tokens, a config of that length validated and planned, and
what a resume at another context length says (or refuses, for a position table)."""

from __future__ import annotations

import pytest
import torch

from llmtrain.checkpoint.diff import check_positions, check_resumable, context_change
from llmtrain.config import compose_config
from llmtrain.console import error_line
from llmtrain.data.datasets import SyntheticDataset
from llmtrain.errors import CheckpointUsageError
from llmtrain.launch.config_probes import validate_here
from llmtrain.model.rope import inverse_frequencies

LONG = ["model=llama3-8b", "model.seq_len=131072", "parallel.cp=8", "cluster.nproc_per_node=8", "cluster.nnodes=4",
        "hardware=h200", "precision=bf16", "parallel.zero=3", "recompute.mode=full", "train.micro_batch_size=1"]


def test_llama3_8b_rotary_frequencies_are_transformers_llama3_scaling():
    """transformers 5.25.0's ROPE_INIT_FUNCTIONS["llama3"] for Llama 3.1 8B's config.json (rope_theta 500000, factor
    8, low/high frequency factors 1 and 4, 8192 original positions): wavelengths under 2048 kept (pairs 0-28),
    over 8192 slowed 8 times (35-63), the band between smoothed, its six values as transformers computes them.
    tests/integration/test_llama.py compares whole models with transformers."""
    m = compose_config(LONG).model
    ours = inverse_frequencies(128, m.rope_theta, m.rope_scaling)
    plain = inverse_frequencies(128, m.rope_theta)
    assert ours.dtype == torch.float32 and ours.shape == (64,)
    assert torch.equal(ours[:29], plain[:29]) and torch.equal(ours[35:], plain[35:] / 8)
    assert ours[29:35].tolist() == [0.0021665706299245358, 0.0013718936825171113, 0.0008567514596506953,
                                    0.0005248460220173001, 0.0003126936499029398, 0.0001785077911335975]


def test_llama3_8b_at_131072_tokens_under_cp8_validates_and_plans():
    from llmtrain.plan.cli import plan_for

    cfg = compose_config(LONG)
    validate_here(cfg)  # the rules and the probes (the stdlib corpus still has a window of 131,073 tokens)
    plan = plan_for(cfg)
    assert (plan.world_size, plan.dims["cp"], plan.dims["dp"], plan.fits) == (32, 8, 4, True)
    sample = SyntheticDataset(131072, 128256, seed=0).sample("train", 0)
    assert sample.shape == (131073,)


def test_a_resume_at_another_context_length_is_one_line():
    short = compose_config(["model=llama-tiny", "model.seq_len=64"])
    longer = compose_config(["model=llama-tiny", "model.seq_len=128", "model.rope_theta=40000",
                             "model.rope_scaling={factor:2.0,original_max_position_embeddings:64}"])
    diff = check_resumable(short, longer, "CKPT")  # allowed: rotary positions have no weights
    assert ("model.seq_len", 64, 128) in diff and ("model.rope_theta", 10000.0, 40000.0) in diff
    assert context_change(short, longer) == (
        "context extension: model.seq_len 64 -> 128, model.rope_scaling None -> {factor: 2.0, low_freq_factor: 1.0, "
        "high_freq_factor: 4.0, original_max_position_embeddings: 64}, model.rope_theta 10000.0 -> 40000.0; the "
        "weights load as saved; the data goes on from the checkpoint's sample count, in windows of 128 tokens cut "
        "anew (docs/models.md#long-context-training)")
    assert context_change(longer, short).startswith("shorter context: model.seq_len 128 -> 64, ")
    theta = compose_config(["model=llama-tiny", "model.seq_len=64", "model.rope_theta=40000"])
    assert context_change(short, theta) == (
        "rotary settings changed: model.rope_theta 10000.0 -> 40000.0; the weights load as saved; the data goes on "
        "from the checkpoint's sample count (docs/models.md#long-context-training)")
    assert context_change(short, compose_config(["model=llama-tiny", "model.seq_len=64", "train.max_steps=9"])) is None


@pytest.mark.parametrize("resume", [check_positions, check_resumable])
def test_a_position_table_refuses_another_length_naming_model_seq_len(resume):
    short = compose_config(["model.seq_len=64"])
    with pytest.raises(CheckpointUsageError) as caught:
        resume(short, compose_config(["model.seq_len=128"]), "CKPT")
    assert caught.value.exit_code == 2
    assert error_line(caught.value) == (
        "llmtrain: error: model.seq_len: resuming CKPT with model.seq_len 64 -> 128: model.arch=gpt2 learns a "
        "position table of 64 rows, which cannot grow or shrink; keep model.seq_len=64 (a model with rotary positions, e.g. "
        "model.arch=llama, may change it)")
    check_positions(short, compose_config(["model.seq_len=64", "train.max_steps=9"]), "CKPT")  # same length: fine
