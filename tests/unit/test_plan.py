"""`llmtrain plan`: exact parameter counts, memory within 10% of what workers measure, fit / suggest."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.head_loss import trained_loss

from llmtrain.config import compose_config
from llmtrain.model import build_model, init_parameters
from llmtrain.parallel import pipeline as pp_lib
from llmtrain.parallel.recompute import apply_recompute
from llmtrain.model.registry import family_of
from llmtrain.plan.estimate import activation_bytes_per_layer, flops_per_token, loss_bytes, stage_params
from llmtrain.plan.params import active_params, block_shapes
from llmtrain.train.memory import SavedActivations

# moe-tiny's Qwen3 block with other experts: layer 0 dense, 1 and 3 sparse (2 stays dense: sparse_every=2), 4
# experts as wide as the dense MLP, 2 per token, no shared expert, weights not renormalized, no auxiliary loss.
SPARSE_EVERY_2 = ("model.moe={n_experts:4,top_k:2,expert_ffn_dim:null,n_shared_experts:0,norm_topk_prob:false,"
                  "router_aux_loss_coef:0.0,router_z_loss_coef:0.0,n_dense_layers:1,sparse_every:2}")

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
    ["model=qwen3-0.6b"],
    ["model=moe-tiny"],
    ["model=moe-tiny", "parallel.pp=2", "parallel.pp_layers=[1,3]"],
    ["model=moe-tiny", SPARSE_EVERY_2],
    ["model=moe-tiny", SPARSE_EVERY_2, "model.tie_embeddings=false", "parallel.pp=2", "parallel.virtual_stages=2",
     "parallel.pp_schedule=interleaved_1f1b", "cluster.nproc_per_node=2"],
    ["model=qwen3-moe-30b-a3b"],
    ["model=qwen3-moe-30b-a3b", "parallel.pp=4", "cluster.nproc_per_node=4"],
    ["model=olmoe-1b-7b"],
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


def cfg_pp(overrides: list[str]) -> int:
    return 2 if "parallel.pp=2" in overrides else 1


TP_CONFIGS = [["model=gpt-tiny"], ["model=llama-tiny", "parallel.pp=2"], ["model=moe-tiny"],
              ["model=moe-tiny", SPARSE_EVERY_2, "model.tie_embeddings=false", "parallel.pp=2"]]


@pytest.mark.parametrize("overrides", TP_CONFIGS, ids=[" ".join(c) for c in TP_CONFIGS])
def test_parameters_per_rank_under_tensor_parallel_follow_the_familys_plan(overrides):
    """Per stage and tp=2 rank: column-parallel weights and biases and row-parallel weights halved, the vocabulary
    split, everything else whole on every rank: norms, row-parallel biases, positions, a sparse block's MoE."""
    cfg = compose_config(overrides + ["parallel.tp=2", f"cluster.nproc_per_node={2 * cfg_pp(overrides)}"])
    m, p = cfg.model, cfg.parallel
    spec = family_of(m)
    vocab_rows = m.d_model * (-(-m.vocab_size // m.vocab_pad_multiple) * m.vocab_pad_multiple)
    stages, _, _ = stage_params(cfg)
    with torch.device("meta"):
        model = build_model(m)
    counts = pp_lib.layers_per_stage(m.n_layers, p.pp * p.virtual_stages, p.pp_layers)
    for s in stages:
        part = model if len(stages) == 1 else pp_lib.make_stage_module(model, s.stage, counts)
        expected = 0
        for name, t in dict(part.named_parameters()).items():
            if name.startswith("layers."):
                block = part.layers[name.split(".")[1]]
                inner = name.split(".", 2)[2]
                module, _, leaf = inner.rpartition(".")
                style = spec.tensor_parallel_plan({n for n, _ in block.named_modules() if n}).get(module)
                split = style == "colwise" or (style == "rowwise" and leaf == "weight")
            else:
                split = t.numel() == vocab_rows  # the token embedding and the head: vocabulary-parallel
            expected += t.numel() // p.tp if split else t.numel()
        assert s.params_per_rank == expected, s.stage


def test_active_parameters_are_the_total_less_the_experts_a_token_skips():
    """moe-tiny: layers 1-3 sparse, 8 experts of width 64 over d_model 128, 2 per token: each sparse layer runs 2 of
    its 8 experts (3 x 128 x 64 weights each)."""
    cfg = compose_config(["model=moe-tiny"])
    _, total, _ = stage_params(cfg)
    assert [s.sparse for s in block_shapes(cfg.model)] == [False, True, True, True]
    assert active_params(cfg) == total - 3 * 6 * 3 * 128 * 64
    dense = compose_config(["model=llama-tiny"])
    assert active_params(dense) == stage_params(dense)[1]


def test_gpt3_175b_has_175b_parameters():
    _, total, _ = stage_params(compose_config(["model=gpt-175b"]))
    assert abs(total - 175e9) / 175e9 < 0.01


FLOP_CONFIGS = [["model=gpt-tiny"], ["model=llama-tiny"],
                ["model=llama-tiny", "model.tie_embeddings=false", "model.n_kv_heads=1"],
                ["model=moe-tiny"], ["model=moe-tiny", SPARSE_EVERY_2, "model.tie_embeddings=false"]]


@pytest.mark.parametrize("overrides", FLOP_CONFIGS, ids=[" ".join(c) for c in FLOP_CONFIGS])
def test_flops_per_token_counts_every_matmul_of_a_training_step(overrides):
    """Against torch's FLOP counter over one forward and backward: every matmul (q, k and v at their widths, the
    MLP's two or three matrices, the head once, tied or not; a sparse block's router, the top_k experts each token
    runs through and the shared experts) is 6 x its weights per token; the plan adds 6 x the norm and bias
    parameters and the causal attention (half of 12 x L x s x attention width)."""
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
    attention = 6 * m.n_layers * m.seq_len * m.n_heads * (m.head_dim or m.d_model // m.n_heads)
    assert flops_per_token(cfg) == matmuls + 6 * vectors + attention


def test_the_trainer_reports_mfu_with_the_plans_flops():
    from llmtrain.train.mfu import model_flops

    cfg = compose_config(["model=llama3-8b", "hardware=h100", "precision=bf16"])
    fpt, peak = model_flops(cfg, "cuda")
    assert fpt == flops_per_token(cfg) and peak == 989e12
    # 6 x (6.98 B non-embedding + 4096 x 128256 head) + 6 x 32 x 8192 x 4096 attention
    assert fpt == pytest.approx(5.1472e10, rel=1e-4)


ACTIVATION_CONFIGS = [["model=gpt-tiny"], ["model=llama-tiny"], ["model=qwen3-0.6b", "model.n_layers=2",
                      "model.n_heads=4", "model.n_kv_heads=2", "model.head_dim=64", "model.ffn_dim=512",
                      "model.vocab_size=256"],
                      ["model=moe-tiny"], ["model=moe-tiny", SPARSE_EVERY_2],
                      ["model=llama-tiny", "train.loss=full"], ["model=gpt-tiny", "model.vocab_size=8192"],
                      ["model=gpt-tiny", "model.vocab_size=8192", "train.loss=full"]]


@pytest.mark.parametrize("overrides", ACTIVATION_CONFIGS, ids=[" ".join(c) for c in ACTIVATION_CONFIGS])
def test_saved_activations_per_recompute_mode_match_the_plan(overrides):
    """The bytes autograd saves for one forward (a saved-tensor hook, parameters excluded), per recompute mode,
    against the plan's per-layer bytes summed over the layers (a MoE model's dense and sparse ones differ) + the
    loss's. Selective keeps as much as none."""
    measured = {}
    for mode in ("none", "selective", "full"):
        cfg = compose_config([*overrides, "model.d_model=256", "model.seq_len=256", f"recompute={mode}"])
        m, b = cfg.model, 2
        model = build_model(m)
        init_parameters(model, 0, 0.02, m.n_layers)
        if mode != "none":
            apply_recompute(model, mode, 1)
        x = torch.randint(0, m.vocab_size, (b, m.seq_len))
        with SavedActivations(list(model.parameters())) as saved:
            trained_loss(model, cfg, x, x)
        planned = sum(activation_bytes_per_layer(cfg, b, None, i) for i in range(m.n_layers)) + loss_bytes(cfg, b)
        assert abs(planned / saved.total - 1) <= 0.02, (mode, planned, saved.total)
        measured[mode] = saved.total - loss_bytes(cfg, b)  # the blocks' share, which recompute cuts
    assert measured["full"] < 0.15 * measured["none"]




def test_calibration_family_is_the_specs_calibration_or_its_name():
    """tune's fitted timings stay under the names it has always saved (GPT-2's "gpt"); a new family under its own."""
    from llmtrain.plan import calibration

    names = [calibration.family(compose_config([f"model={m}"]).model)
             for m in ("gpt-tiny", "llama-tiny", "moe-tiny", "olmoe-1b-7b")]
    assert names == ["gpt", "llama", "qwen3", "olmoe"]
