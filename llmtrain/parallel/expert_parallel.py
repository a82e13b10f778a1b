"""Expert parallel: each sparse block's routed experts split over the ranks of an ep group, pairs sent to them.

The experts' stacked weights become DTensors sharded on dim 0 (the expert index) over the ep mesh, so rank j
holds experts [j L, (j+1) L) and checkpoints keep the full [E, ...] shapes (DCP reshards them to any other ep).
Hooks around the `experts` module swap its input (all pairs sorted by expert, pairs per expert) for the pairs
this rank's experts get from the whole group, and swap the output back (expert_dispatch.py): the MoE block itself
does not know. Under tensor parallel each tp rank computes the block whole and exchanges with its own ep peers.

FSDP2 then shards or replicates the experts over the ranks that hold the same ones (Meshes.expert_dp). Each of
those gets the gradient summed over its ep group's tokens, so after FSDP's mean over them the gradient is ep
times the mean over all dp ranks: scale_expert_gradients divides it back.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

from llmtrain.model.moe import moe_modules
from llmtrain.parallel.expert_dispatch import (
    exchange_counts,
    from_experts,
    group_all_to_all,
    plan_exchange,
    to_experts,
)


class _ExpertHooks:
    """The pre- and post-forward swaps of one `experts` module; the exchange between them is kept for the post."""

    def __init__(self, ep_mesh: DeviceMesh):
        self.group = ep_mesh.get_group()
        self.all_to_all = group_all_to_all(self.group)
        self.pending = []

    # Eager under compile: the split sizes are read on the host.
    @torch.compiler.disable
    def before(self, module, inputs, mesh):
        x, counts, *rest = inputs
        exchange = plan_exchange(counts, exchange_counts(counts, self.group))
        self.pending.append(exchange)
        return (to_experts(x, exchange, self.all_to_all), exchange.local_counts, *rest)

    @torch.compiler.disable
    def after(self, module, out, mesh):
        return from_experts(out, self.pending.pop(), self.all_to_all)


def _shard_experts(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    for key, param in list(module.named_parameters(recurse=False)):
        sharded = distribute_tensor(param, mesh, [Shard(0)], src_data_rank=None)
        module.register_parameter(key, nn.Parameter(sharded, requires_grad=param.requires_grad))


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    for block in moe_modules(model):
        hooks = _ExpertHooks(ep_mesh)
        distribute_module(block.experts, ep_mesh, _shard_experts, input_fn=hooks.before, output_fn=hooks.after)


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """The routed experts of every sparse block in `model`: what FSDP2 wraps on the expert_dp mesh."""
    return [block.experts for block in moe_modules(model)]


@torch.no_grad()
def scale_expert_gradients(parts: list[nn.Module], ep: int) -> None:
    if ep == 1:
        return
    for part in parts:
        for experts in expert_modules(part):
            for p in experts.parameters():
                if p.grad is not None:
                    p.grad.div_(ep)
