"""Which experts each token goes to, and with what weight.

softmax (Qwen3-MoE, OLMoE): scores = softmax(logits) over all experts; the top_k scores, renormalized to sum to 1
when norm_topk_prob. sigmoid (DeepSeek-V3): scores = sigmoid(logits); the top_k chosen on scores + bias, weighted
by the unbiased scores, normalized over the chosen when norm_topk_prob. The bias (zeros unless bias balancing moves
it) enters the choice only, for either score function.

Ties go to the lower expert index, on every device: the choice is a stable descending sort of the scores, not
torch.topk (deterministic on the CPU, but which of equal scores it returns is not specified). E is small, so the
sort costs little. transformers' top-k can pick differently only between exactly equal scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Routing:
    logits: torch.Tensor  # (n, E) fp32
    probs: torch.Tensor  # (n, E) fp32: each token's scores over all experts summing to 1 (the balancing loss's P)
    experts: torch.Tensor  # (n, k) int64: chosen experts, best first
    weights: torch.Tensor  # (n, k) fp32: their routing weights


def route(logits: torch.Tensor, top_k: int, score_func: str, norm_topk_prob: bool,
          bias: torch.Tensor) -> Routing:
    """`logits` (n, E) in fp32; `bias` (E,) fp32 added to the scores for choosing only."""
    if score_func == "softmax":
        scores = torch.softmax(logits, dim=-1)
        probs = scores
    else:
        scores = torch.sigmoid(logits)
        probs = scores / scores.sum(dim=-1, keepdim=True)
    experts = torch.sort(scores.detach() + bias, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(-1, experts)
    if norm_topk_prob:
        # The floor keeps sigmoid scores that all underflowed from dividing by zero (softmax's sum is never 0).
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    return Routing(logits=logits, probs=probs, experts=experts, weights=weights)
