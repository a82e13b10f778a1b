"""`llmtrain plan` on CUDA under bf16 autocast, against peaks recorded on a GPU (no GPU needed to run this)."""

from __future__ import annotations

import pytest
from helpers.plan_points import MODEL, planned, POINTS  # noqa: F401

from llmtrain.config import compose_config


GIB = 2**30
RECORDED = {
    "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-11-29",
    "peak": "torch.cuda.max_memory_allocated over steps 1-2",
    "activations": "the trainer's saved-activation count (one micro-batch, weights' cast copies included)",
}


@pytest.mark.parametrize("name", POINTS)
def test_cuda_peak_within_10_percent_of_recorded(name):
    overrides, peak_gib, activations = POINTS[name]
    plan = planned(MODEL + overrides)
    assert abs(plan.peak_bytes_per_rank / GIB / peak_gib - 1) <= 0.10, (name, plan.peak_bytes_per_rank / GIB, RECORDED)
    if activations is not None:
        assert abs(plan.stages[0].activation_bytes / activations - 1) <= 0.10, (name, plan.stages[0].activation_bytes)


def test_cpu_keeps_its_own_model():
    """The CUDA terms apply only on CUDA: the same config on CPU is planned without them (and smaller)."""
    overrides, _, _ = POINTS["micro 4"]
    on_cpu = [o.replace("device=cuda", "device=cpu") for o in MODEL + overrides]
    cpu, cuda = planned(on_cpu), planned(MODEL + overrides)
    assert not any("CUDA autocast" in n for n in cpu.notes)
    assert any("CUDA autocast" in n for n in cuda.notes)
    assert cpu.peak_bytes_per_rank < 0.9 * cuda.peak_bytes_per_rank


def test_compile_keeps_less_than_eager():
    base = MODEL + ["train.micro_batch_size=8", "train.global_batch_size=16"]
    assert planned(base + ["train.compile=true"]).peak_bytes_per_rank < planned(base).peak_bytes_per_rank


BLOCK_CONFIGS = {
    "gpt-tiny": (["model=gpt-tiny"], 0),
    "llama-tiny": (["model=llama-tiny"], 0),
    "qwen3 (q/k norms)": (["model=moe-tiny"], 0),  # moe-tiny's dense first layer
    "qwen3 sparse": (["model=moe-tiny"], 1),
    "qwen3 sparse, no shared expert or auxiliary loss": (
        ["model=moe-tiny", "model.moe={n_experts:4,top_k:2,n_shared_experts:0,norm_topk_prob:false,"
         "router_aux_loss_coef:0.0,router_z_loss_coef:0.0,n_dense_layers:1}"], 1),
}


@pytest.mark.parametrize("name", BLOCK_CONFIGS)
def test_block_terms_match_what_autocast_saves(name):
    """cuda_memory.layer_bytes against one block run under CPU autocast (bf16), whose casting rules are CUDA's for
    these ops: the bytes autograd saves, less the blocks' bf16 weight copies (planned separately) and, for an
    RMSNorm block, the fp32 tensors CPU's composite rms_norm keeps besides its input (the normalized tensor and
    per-row scale; CUDA's fused kernel does not), of the block's two norms and of q/k norms. A sparse block's MoE
    (moe_memory.py) runs its router's softmax and logsumexp in bf16 on CPU, fp32 on CUDA: a few bytes per token."""
    import torch

    from llmtrain.model import build_model, init_parameters
    from llmtrain.plan import cuda_memory
    from llmtrain.plan.params import block_shape
    from llmtrain.train.memory import SavedActivations

    overrides, layer = BLOCK_CONFIGS[name]
    cfg = compose_config([*overrides, "model.d_model=256", "model.seq_len=256", "precision=bf16"])
    m, b = cfg.model, 2
    model = build_model(m)
    init_parameters(model, 0, 0.02, m.n_layers)
    block = model.layers[str(layer)]
    shape = block_shape(m, layer)
    tokens = m.seq_len * b
    x = torch.randn(b, m.seq_len, m.d_model, requires_grad=True) * 1.0
    with torch.autocast("cpu", dtype=torch.bfloat16), SavedActivations([]) as saved:
        block(x)
    weight_copies = 2 * sum(p.numel() for p in block.parameters() if p.dim() >= 2)
    composite_norms = 2 * 4 * tokens * m.d_model if shape.rms_norm else 0
    if shape.qk_norm == "head":
        rows = (shape.attention + shape.kv) // (shape.attention // m.n_heads)
        composite_norms += 4 * tokens * (shape.attention + shape.kv + rows)
    measured = saved.total - weight_copies - composite_norms
    assert abs(cuda_memory.layer_bytes(cfg, b, None, layer) / measured - 1) <= 0.01, (measured / tokens, name)
