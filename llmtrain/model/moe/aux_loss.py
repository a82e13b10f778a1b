"""The router's auxiliary losses, and how they reach the gradient without changing the loss function.

load_balancing_loss is transformers' load_balancing_loss_func for one layer (Switch Transformer, as Qwen3-MoE and
OLMoE train with it): E x sum_i f_i P_i, f_i the share of tokens routed to expert i (the shares sum to top_k), P_i
the mean router probability of expert i; top_k when perfectly balanced, so router_aux_loss_coef means what it
means there. z_loss is ST-MoE's mean over tokens of logsumexp(logits)^2.

AuxLossInjection returns the block's output unchanged and, in backward, gives the weighted auxiliary loss the
gradient `scale`: the factor the trainer multiplies the LM loss by before backward (1 / accumulation x the fp16
loss scale), as it was when the forward ran. So every sparse block's auxiliary loss counts once, on whichever
pipeline stage it runs.
"""

from __future__ import annotations

import torch


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, total=None) -> torch.Tensor:
    """`probs` (n, E) fp32, `experts` (n, k) the chosen experts. Differentiable through `probs` only. `total`:
    when other ranks hold the rest of these sequences' tokens, a differentiable sum over them, so that f and P are
    the whole micro-batch's (None: this rank holds every token)."""
    n, n_experts = probs.shape
    flat = experts.reshape(-1)
    counts = probs.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat, dtype=probs.dtype))
    sums = torch.cat([counts, probs.sum(dim=0), probs.new_full((1,), n)])
    if total is not None:
        sums = total(sums)
    counts, prob_sums, tokens = sums[:n_experts], sums[n_experts:-1], sums[-1]
    return n_experts * torch.sum((counts / tokens) * (prob_sums / tokens))


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """`logits` (n, E) fp32."""
    return torch.logsumexp(logits, dim=-1).square().mean()


class AuxLossInjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        # The scale as it is now, as a compiled graph would save it: the trainer sets it before the forward.
        ctx.save_for_backward(scale.detach().to(torch.float32).clone())
        ctx.aux_shape = aux.shape
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (scale,) = ctx.saved_tensors
        return grad_out, scale.expand(ctx.aux_shape).clone(), None


def inject_aux_loss(out: torch.Tensor, aux: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`out` unchanged; in backward `aux` (a scalar) gets d(loss)/d(aux) = `scale` (its value at this call)."""
    return AuxLossInjection.apply(out, aux, scale)
