"""Token-expert pairs in expert order, and back.

The (n, k) choices are flattened token-major and stably sorted by expert, so within an expert tokens keep their
order and the permutation is the same on every run. Every index used is a permutation (no index twice), so no
backward accumulates into one row from several places: each token is copied k times by expand (whose gradient is
a plain sum over k), and the combine un-permutes by indexing and sums each token's k weighted outputs in a fixed
order. No atomic adds: deterministic on every device without torch's deterministic mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Dispatch:
    order: torch.Tensor  # (n k,) int64: position in the flat token-major pairs of each sorted pair
    counts: torch.Tensor  # (E,) int64: pairs per expert (the sorted pairs' group sizes)


def sort_by_expert(experts: torch.Tensor, n_experts: int) -> Dispatch:
    """`experts` (n, k): each token's chosen experts."""
    flat = experts.reshape(-1)
    _, order = torch.sort(flat, stable=True)
    # scatter_add, not bincount: its output shape does not depend on the data, so torch.compile keeps it in graph.
    counts = flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))
    return Dispatch(order=order, counts=counts)


def sorted_tokens(x: torch.Tensor, dispatch: Dispatch, top_k: int) -> torch.Tensor:
    """`x` (n, d) as the (n k, d) sorted pairs' inputs."""
    return x.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, x.shape[-1])[dispatch.order]


def combine(sorted_out: torch.Tensor, dispatch: Dispatch, weights: torch.Tensor) -> torch.Tensor:
    """Each token's sum over its k experts of weight x output; `sorted_out` (n k, d) in sorted pair order,
    `weights` (n, k) already in the output's dtype. Returns (n, d)."""
    n, k = weights.shape
    inverse = torch.empty_like(dispatch.order)
    inverse[dispatch.order] = torch.arange(dispatch.order.numel(), device=inverse.device)
    pairs = sorted_out[inverse].view(n, k, -1)
    return (pairs * weights.unsqueeze(-1)).sum(dim=1)
