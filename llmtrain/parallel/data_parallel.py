"""Data parallel with FSDP2 (`fully_shard`): zero=0 replicate, 2 shard grads + optimizer state, 3 also params.

All three use FSDP2 on the 2-D (dp_replicate, dp_shard) mesh, i.e. HSDP: zero=0 is a shard group of size 1
(pure replication, gradients all-reduced), zero=2 keeps parameters gathered between forward and backward
(reshard_after_forward=False), zero=3 frees them after forward. Public APIs only, and the same path composes with
tensor parallel (the private DDP-over-submesh path does not compose with DTensor parameters).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from llmtrain.parallel.expert_parallel import expert_modules
from llmtrain.parallel.layout import ParallelDims


def apply_data_parallel(model: nn.Module, dp_mesh, dims: ParallelDims,
                        param_dtype: torch.dtype | None, reduce_dtype: torch.dtype, expert_dp_mesh=None) -> None:
    """`expert_dp_mesh`: with expert parallel, the ranks holding the same experts, which get a unit of their own
    (the experts are already DTensors over the ep mesh)."""
    if dims.dp * dims.cp == 1:
        return
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    reshard = dims.zero == 3
    # One FSDP unit per transformer block overlaps its all-gather with the previous block's compute.
    for layer in model.layers.values():
        if expert_dp_mesh is not None:
            for experts in expert_modules(layer):
                fully_shard(experts, mesh=expert_dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    # The root unit holds the embeddings, final norm and (tied) head.
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
