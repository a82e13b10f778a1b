"""`llmtrain plan` of mixture-of-experts models: total and active parameters shown, FLOPs from the active ones, the
MoE whole on every tensor-parallel rank (its memory, FLOPs and traffic), and `--suggest` ranking MoE layouts."""

from __future__ import annotations

import json

import pytest
from helpers.sweep_tables import table_rows

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.parallel.layout import ParallelDims
from llmtrain.plan.estimate import build_plan, comm_bytes
from llmtrain.plan.params import active_params, moe_flops_per_token, stage_params

H100 = {"name": "h100", "peak_tflops": 989.0, "memory_gib": 80.0, "intra_node_gbs": 450.0, "inter_node_gbs": 50.0,
        "efficiency": 0.5}
SUGGEST = ["hardware=h100", "precision=bf16", "train.micro_batch_size=1", "train.global_batch_size=64"]


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))  # no calibration but the test's own


def _row(out: str, label: str) -> str | None:
    return next((row[1] for row in table_rows(out) if row[0] == label), None)


def test_plan_shows_total_and_active_parameters_of_a_moe_model_only(capsys):
    assert main(["plan", "model=qwen3-moe-30b-a3b", "hardware=h100", "precision=bf16", "cluster.nnodes=2",
                 "cluster.nproc_per_node=8", "parallel.zero=3", "train.micro_batch_size=1",
                 "train.global_batch_size=64", "recompute=full"]) == 0
    out = capsys.readouterr().out
    assert _row(out, "parameters") == "30,532,122,624 (29,909,792,768 non-embedding)"
    assert _row(out, "active parameters") == ("3,353,032,704 per token (11.0% of the total: top_k of each sparse "
                                              "layer's routed experts)")
    assert main(["plan", "model=llama3-1b", "hardware=h100", "precision=bf16", "train.micro_batch_size=1"]) == 0
    assert _row(capsys.readouterr().out, "active parameters") is None


def test_flops_per_token_follow_the_active_parameters():
    """qwen3-moe-30b-a3b at seq 4096: 6 x (active non-embedding + the head's d x V) + 6 x L x s x attention width."""
    cfg = compose_config(["model=qwen3-moe-30b-a3b"])
    plan = build_plan(cfg, 989e12, None, H100)
    m = cfg.model
    head = m.d_model * m.vocab_size
    active_non_embedding = active_params(cfg) - 2 * head  # the untied embedding and head
    assert plan.params_active == 3_353_032_704
    assert plan.flops_per_token == 6 * (active_non_embedding + head) + 6 * 48 * 4096 * 32 * 128
    # every layer sparse: router 2048 x 128, 8 experts of 3 x 2048 x 768, per layer and token
    assert moe_flops_per_token(m) == 6 * 48 * (2048 * 128 + 8 * 3 * 2048 * 768)


def test_tensor_parallel_computes_the_moe_whole_on_every_rank():
    """moe-tiny (layer 0 dense, 1-3 sparse) under tp=2: the MoE's parameters are on both ranks; the step's compute
    counts its FLOPs on both; attention's two all-reduces per sparse layer remain, the MLP's go (with sequence
    parallel: the MoE input's all-gather and its output gradient's)."""
    one = compose_config(["model=moe-tiny", "cluster.nproc_per_node=1"])
    two = compose_config(["model=moe-tiny", "cluster.nproc_per_node=2", "parallel.tp=2"])
    a, b = build_plan(one, 989e12, None, H100), build_plan(two, 989e12, None, H100)
    moe = moe_flops_per_token(one.model)
    assert b.compute_s == pytest.approx(a.compute_s * (a.flops_per_token + moe) / (2 * a.flops_per_token))
    assert any("computes the MoE blocks whole" in n for n in b.notes)
    _, total, _ = stage_params(one)
    routed = 3 * (128 * 8 + 8 * 3 * 128 * 64 + 3 * 128 * 64)  # router, experts, shared expert per sparse layer
    assert total - b.stages[0].params_per_rank < (total - routed) / 2 + 1
    act = 4 * 128 * two.train.micro_batch_size * 128  # fp32 x seq x micro-batch x d_model
    dense, sparse = 4 * 2 * act / 2, 2 * 2 * act / 2  # all-reduces of (tp - 1) / tp x 2 x act each
    assert comm_bytes(two, ParallelDims.from_config(two), b.stages[0], 1)["tp"] == dense + 3 * sparse
    sp = compose_config(["model=moe-tiny", "cluster.nproc_per_node=2", "parallel.tp=2",
                         "parallel.sequence_parallel=true"])
    assert comm_bytes(sp, ParallelDims.from_config(sp), b.stages[0], 1)["tp"] == dense + 3 * (sparse + 2 * act / 2)


def test_suggest_ranks_moe_layouts_on_two_h100_nodes(capsys):
    """qwen3-moe-30b-a3b's layouts (JSON) fit, fastest first; olmoe-1b-7b's table ends with its two counts."""
    assert main(["plan", "model=qwen3-moe-30b-a3b", *SUGGEST, "--suggest", "16", "80", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert plans and all(p["peak_bytes_per_rank"] <= 80 * 2**30 for p in plans)
    assert [p["tokens_per_s"] for p in plans] == sorted((p["tokens_per_s"] for p in plans), reverse=True)
    assert {(p["params_total"], p["params_active"]) for p in plans} == {(30_532_122_624, 3_353_032_704)}
    assert main(["plan", "model=olmoe-1b-7b", *SUGGEST, "--suggest", "16", "80"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 6,919,161,856 total, 1,282,017,280 active per token" in out.splitlines()
