"""`llmtrain plan`: exact parameter counts, memory within 10% of what workers measure, fit / suggest."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch
from conftest import REPO, run_cli

from llmtrain.config import compose_config, validate
from llmtrain.model import GPT, GPTArgs
from llmtrain.parallel import pipeline as pp_lib
from llmtrain.plan.estimate import stage_params

CONFIGS = [
    [],
    ["model=gpt-125m"],
    ["model=gpt-1.3b", "model.n_layers=4", "model.n_heads=24", "model.head_dim=128"],  # 24 x 128 over d_model 2048
    ["model.vocab_size=250", "parallel.pp=2", "parallel.pp_layers=[1,3]"],
    ["parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=interleaved_1f1b", "cluster.nproc_per_node=2"],
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=[" ".join(c) or "default" for c in CONFIGS])
def test_parameter_counts_are_exact(overrides):
    cfg = compose_config(overrides)
    stages, total, non_embedding = stage_params(cfg)
    with torch.device("meta"):
        model = GPT(GPTArgs.from_config(cfg.model))
    assert total == sum(p.numel() for p in model.parameters())
    assert non_embedding == total - model.embed.tok.weight.numel() - model.embed.pos.weight.numel()
    p = cfg.parallel
    counts = pp_lib.layers_per_stage(cfg.model.n_layers, p.pp * p.virtual_stages, p.pp_layers)
    for s in stages:
        part = model if len(stages) == 1 else pp_lib.make_stage_module(model, s.stage, counts)
        assert s.params == sum(t.numel() for t in dict(part.named_parameters()).values()), s.stage


def test_gpt3_175b_has_175b_parameters():
    _, total, _ = stage_params(compose_config(["model=gpt-175b"]))
    assert abs(total - 175e9) / 175e9 < 0.01


def _bench():
    spec = importlib.util.spec_from_file_location("bench_plan_memory", REPO / "scripts" / "bench_plan_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_predicted_memory_within_10_percent_of_measured(tmp_path):
    """Per rank: model state, saved activations and the measured peak of live tensor bytes (profile.memory)."""
    bench = _bench()
    checked = set()
    for name, overrides in bench.LAYOUTS.items():
        for row in bench.compare(name, overrides, str(tmp_path)):
            assert abs(row["state_pred"] / row["state_meas"] - 1) <= 0.10, row
            assert abs(row["peak_pred"] / row["peak_meas"] - 1) <= 0.10, row
            if "act_pred" in row:
                assert abs(row["act_pred"] / row["act_meas"] - 1) <= 0.10, row
            checked.add(name)
    assert len(checked) >= 5  # dp, tp, pp, zero and recompute varied


def test_plan_cli_fit_json_and_speed():
    start = time.perf_counter()
    result = run_cli(["plan", "model=gpt-175b", "hardware=h100", "cluster.nproc_per_node=8"])
    assert time.perf_counter() - start < 10
    assert result.returncode == 1 and "NO" in result.stdout  # 175B on 8 x 80 GB does not fit
    result = run_cli(["plan", "model=gpt-1.3b", "hardware=h100", "precision=bf16", "--json"])
    assert result.returncode == 0
    plan = json.loads(result.stdout)
    assert plan["fits"] and plan["params_total"] == 1_315_819_520
    assert plan["dims"]["dp"] == 2 and 0 < plan["mfu"] < 1


def test_suggest_ranks_layouts_that_fit():
    result = run_cli(["plan", "model=gpt-13b", "hardware=h100", "precision=bf16", "train.micro_batch_size=1",
                      "train.global_batch_size=64", "--suggest", "16", "80", "--json"])
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)
    assert plans and all(p["peak_bytes_per_rank"] <= 80 * 2**30 for p in plans)
    assert [p["tokens_per_s"] for p in plans] == sorted((p["tokens_per_s"] for p in plans), reverse=True)
    for p in plans:  # every suggestion is a valid config
        d = p["dims"]
        cfg = compose_config(["model=gpt-13b", f"parallel.tp={d['tp']}", f"parallel.pp={d['pp']}",
                              f"parallel.zero={d['zero']}", "cluster.nproc_per_node=8", "cluster.nnodes=2",
                              "train.micro_batch_size=1", "train.global_batch_size=64"])
        validate(cfg)
