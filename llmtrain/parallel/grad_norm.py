"""Global gradient-norm clipping across every parallel dimension."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_grad_norm(params: list[torch.nn.Parameter], pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Global L2 norm of the gradients of `params` (each parameter counted once across the whole job).

    DTensor grads (FSDP/TP shards) are grouped by mesh and placements so each group's norm reduces over its own
    mesh (full_tensor); pipeline stages hold disjoint parameters, so squared norms are summed over the pp group.
    """
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else "plain"
        groups[key].append(g)
    squared = torch.zeros((), dtype=torch.float32, device=_device(params))
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared = squared + norm.float() ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(squared, group=pp_group)
    return squared.sqrt()


def clip_grad_norm_(params: list[torch.nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None = None,
                    norm_params: list[torch.nn.Parameter] | None = None) -> torch.Tensor:
    """Clip all of `params` to `max_norm` (0 = only measure); the norm is over `norm_params` (default `params`),
    which leaves out duplicates such as a pipeline's copy of a tied weight."""
    norm = total_grad_norm(params if norm_params is None else norm_params, pp_group)
    if max_norm > 0:
        # Same coefficient as torch.nn.utils.clip_grads_with_norm_, applied to local shards so grads on
        # different meshes (TP, FSDP, plain) need no common kernel.
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    g.mul_(coef.to(g.device, g.dtype))
    return norm


def _device(params: list[torch.nn.Parameter]) -> torch.device:
    for p in params:
        return p.device
    return torch.device("cpu")
