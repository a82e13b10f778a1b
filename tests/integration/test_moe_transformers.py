"""The MoE block (llmtrain/model/moe/) against transformers' Qwen3-MoE sparse block with the same weights: outputs
and gradients in fp32, and the load-balancing loss against transformers' load_balancing_loss_func. In-process."""

from __future__ import annotations

import pytest
import torch

from llmtrain.model.moe import MoE, MoEArgs
from llmtrain.model.moe.aux_loss import load_balancing_loss
from llmtrain.model.moe.router import route

qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")

D, F_WIDTH, E, K = 16, 24, 6, 2


def pair(norm_topk_prob: bool, grouped_mm: str):
    """Our block and transformers' with the same random weights (gate_up_proj = our gate and fc stacked)."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F_WIDTH, num_experts=E, num_experts_per_tok=K,
                            norm_topk_prob=norm_topk_prob, hidden_act="silu")
    theirs = qwen3_moe.Qwen3MoeSparseMoeBlock(config)
    ours = MoE(D, MoEArgs(n_experts=E, top_k=K, ffn=F_WIDTH, norm_topk_prob=norm_topk_prob,
                          router_aux_loss_coef=0.0, grouped_mm=grouped_mm), layer=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        theirs.gate.weight.copy_(ours.router.weight)
        theirs.experts.gate_up_proj.copy_(torch.cat([ours.experts.gate, ours.experts.fc], dim=1))
        theirs.experts.down_proj.copy_(ours.experts.proj)
    return ours, theirs


@pytest.mark.parametrize("norm_topk_prob,grouped_mm", [(True, "off"), (False, "off"), (True, "on")])
def test_block_matches_transformers_qwen3_moe(norm_topk_prob, grouped_mm):
    ours, theirs = pair(norm_topk_prob, grouped_mm)
    x = torch.randn(3, 11, D, generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(3, 11, D, generator=torch.Generator().manual_seed(2))
    results = []
    for block in (ours, theirs):
        xi = x.clone().requires_grad_()
        out = block(xi)
        (out * upstream).sum().backward()
        results.append((out.detach(), xi.grad))
    (out_ours, gx_ours), (out_theirs, gx_theirs) = results
    assert (out_ours - out_theirs).abs().max().item() <= 1e-5
    assert (gx_ours - gx_theirs).abs().max().item() <= 1e-5
    assert (ours.router.weight.grad - theirs.gate.weight.grad).abs().max().item() <= 1e-5
    gate_up = torch.cat([ours.experts.gate.grad, ours.experts.fc.grad], dim=1)
    assert (gate_up - theirs.experts.gate_up_proj.grad).abs().max().item() <= 1e-5
    assert (ours.experts.proj.grad - theirs.experts.down_proj.grad).abs().max().item() <= 1e-5


def test_load_balancing_loss_matches_transformers():
    logits = torch.randn(40, E, generator=torch.Generator().manual_seed(3)) * 2
    r = route(logits, K, "softmax", True, torch.zeros(E))
    ours = load_balancing_loss(r.probs, r.experts)
    theirs = qwen3_moe.load_balancing_loss_func((logits,), num_experts=E, top_k=K)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert ours.item() > K  # not the balanced value: the comparison means something
