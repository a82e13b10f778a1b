"""Expert parallel's token exchange: the routed pairs to the ranks of their experts and back.

A MoE block hands its experts the token-expert pairs sorted by expert with the pairs per expert (model/moe/
dispatch.py). With the E experts split over the P ranks of an ep group (rank j holds the L = E / P experts
[j L, (j+1) L)), the sorted pairs bound for each rank are contiguous: first every rank tells every other how many
pairs it sends to each of its experts (an all-to-all of E counts), then the pairs travel (an all-to-all with those
uneven sizes, gradients included). A rank receives them grouped by source rank, then expert; a stable sort by
local expert puts them in expert order, each expert's pairs by source rank then source order, the same on every
run. The way back undoes both. One host synchronization per block: the split sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# (tensor, output_split_sizes, input_split_sizes) -> the exchanged tensor; the real one is an ep group's
# differentiable all-to-all, tests pass a simulation of several ranks.
AllToAll = Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]


@dataclass
class Exchange:
    send_splits: list[int]  # pairs this rank sends to each rank of its ep group
    recv_splits: list[int]  # pairs it receives from each
    order: torch.Tensor  # received pairs (source-major) -> local expert order
    local_counts: torch.Tensor  # (L,) pairs per local expert, after the sort


def plan_exchange(counts: torch.Tensor, received_counts: torch.Tensor) -> Exchange:
    """`counts` (E,): this rank's pairs per expert; `received_counts` (P, L): row s = the pairs rank s sends to
    each of this rank's L experts."""
    ranks, local = received_counts.shape
    sizes = torch.cat([counts.view(ranks, local).sum(dim=1), received_counts.sum(dim=1)]).tolist()
    expert_of_pair = torch.arange(local, device=counts.device).repeat(ranks).repeat_interleave(
        received_counts.reshape(-1))
    order = torch.sort(expert_of_pair, stable=True).indices
    return Exchange(send_splits=sizes[:ranks], recv_splits=sizes[ranks:], order=order,
                    local_counts=received_counts.sum(dim=0))


def to_experts(x: torch.Tensor, exchange: Exchange, all_to_all: AllToAll) -> torch.Tensor:
    """This rank's sorted pairs `x` (m, d) -> the pairs for its own experts, in local expert order."""
    return all_to_all(x, exchange.recv_splits, exchange.send_splits)[exchange.order]


def from_experts(out: torch.Tensor, exchange: Exchange, all_to_all: AllToAll) -> torch.Tensor:
    """The experts' outputs for the received pairs (local expert order) -> this rank's pairs' outputs, in the
    order `x` had."""
    inverse = torch.empty_like(exchange.order)
    inverse[exchange.order] = torch.arange(exchange.order.numel(), device=inverse.device)
    return all_to_all(out[inverse], exchange.send_splits, exchange.recv_splits)


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's `counts` (E,) for this rank's experts: (P, L)."""
    ranks = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received.view(ranks, -1)


def group_all_to_all(group: dist.ProcessGroup) -> AllToAll:
    def exchange(x: torch.Tensor, output_splits: list[int], input_splits: list[int]) -> torch.Tensor:
        out = funcol.all_to_all_single_autograd(x.contiguous(), output_splits, input_splits, group)
        return funcol.wait_tensor(out)
    return exchange
