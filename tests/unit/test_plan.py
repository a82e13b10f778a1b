"""`llmtrain plan`: exact parameter counts, memory within 10% of what workers measure, fit / suggest."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, run_cli

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.model import build_model, init_parameters
from llmtrain.parallel import pipeline as pp_lib
from llmtrain.parallel.recompute import apply_recompute
from llmtrain.plan.estimate import activation_bytes_per_layer, flops_per_token, loss_bytes, stage_params
from llmtrain.train.memory import SavedActivations

CONFIGS = [
    [],
    ["model=gpt-125m"],
    ["model=gpt-1.3b", "model.n_layers=4", "model.n_heads=24", "model.head_dim=128"],  # 24 x 128 over d_model 2048
    ["model.vocab_size=250", "parallel.pp=2", "parallel.pp_layers=[1,3]"],
    ["parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=interleaved_1f1b", "cluster.nproc_per_node=2"],
    ["model=llama-tiny"],
    ["model=llama-tiny", "model.tie_embeddings=false", "parallel.pp=2", "parallel.pp_layers=[3,1]"],
    ["model=llama-tiny", "parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=interleaved_1f1b",
     "cluster.nproc_per_node=2"],
    ["model=llama3-1b"],
    ["model=llama3-3b"],
    ["model=llama3-8b"],
    ["model=llama3-8b", "parallel.pp=4", "cluster.nproc_per_node=4"],
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=[" ".join(c) or "default" for c in CONFIGS])
def test_parameter_counts_are_exact(overrides):
    cfg = compose_config(overrides)
    stages, total, non_embedding = stage_params(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model)
    assert total == model.num_params()
    # non-embedding: without the token embedding, GPT-2's position table and an untied head
    embeddings = sum(p.numel() for name, p in model.named_parameters() if name.startswith(("embed.", "head.")))
    assert non_embedding == total - embeddings
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
        validate_here(cfg)


@pytest.mark.parametrize("overrides", [["model=gpt-tiny"], ["model=llama-tiny"],
                                       ["model=llama-tiny", "model.tie_embeddings=false", "model.n_kv_heads=1"]])
def test_flops_per_token_counts_every_matmul_of_a_training_step(overrides):
    """Against torch's FLOP counter over one forward and backward: every matmul (q, k and v at their widths, the
    MLP's two or three matrices, the head once, tied or not) is 6 x its weights per token; the plan adds 6 x the
    norm and bias parameters and the causal attention (half of 12 x L x s x attention width)."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = compose_config(overrides)
    m = cfg.model
    model = build_model(m)
    x = torch.randint(0, m.vocab_size, (2, m.seq_len))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(n for op, n in counts.items() if str(op) in ("aten.mm", "aten.addmm", "aten.bmm")) / x.numel()
    vectors = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    attention = 6 * m.n_layers * m.seq_len * m.n_heads * (m.d_model // m.n_heads)
    assert flops_per_token(cfg) == matmuls + 6 * vectors + attention


def test_the_trainer_reports_mfu_with_the_plans_flops():
    from llmtrain.train.mfu import model_flops

    cfg = compose_config(["model=llama3-8b", "hardware=h100", "precision=bf16"])
    fpt, peak = model_flops(cfg, "cuda")
    assert fpt == flops_per_token(cfg) and peak == 989e12
    # 6 x (6.98 B non-embedding + 4096 x 128256 head) + 6 x 32 x 8192 x 4096 attention
    assert fpt == pytest.approx(5.1472e10, rel=1e-4)


@pytest.mark.parametrize("arch", ["gpt-tiny", "llama-tiny"])
def test_saved_activations_per_recompute_mode_match_the_plan(arch):
    """The bytes autograd saves for one forward (a saved-tensor hook, parameters excluded), per recompute mode,
    against the plan's per-layer bytes x layers + the loss's. Selective keeps as much as none."""
    measured = {}
    for mode in ("none", "selective", "full"):
        cfg = compose_config([f"model={arch}", "model.d_model=256", "model.seq_len=256", f"recompute={mode}"])
        m, b = cfg.model, 2
        model = build_model(m)
        init_parameters(model, 0, 0.02, m.n_layers)
        if mode != "none":
            apply_recompute(model, mode, 1)
        x = torch.randint(0, m.vocab_size, (b, m.seq_len))
        with SavedActivations(list(model.parameters())) as saved:
            F.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        planned = activation_bytes_per_layer(cfg, b) * m.n_layers + loss_bytes(cfg, b)
        assert abs(planned / saved.total - 1) <= 0.02, (mode, planned, saved.total)
        measured[mode] = saved.total
    assert measured["full"] < 0.15 * measured["none"]


def test_readme_llama_plan_excerpt_is_what_the_command_prints():
    readme = (REPO / "docs" / "planning.md").read_text()
    command = next(ln for ln in readme.splitlines() if ln.startswith("llmtrain plan model=llama3-8b"))
    excerpt = readme.split("The last command above prints", 1)[1].split("```\n", 2)[1]
    result = run_cli(command.split()[1:])
    assert result.returncode == 0, result.stderr
    for line in excerpt.splitlines():
        assert line in result.stdout, line
    assert "│ peak memory per rank   │ 30.04 GiB" in excerpt
