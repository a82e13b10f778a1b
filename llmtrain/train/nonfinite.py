"""Non-finite values in a step: the fused check of a set of tensors, and the line naming the ranks that saw them."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def nonfinite_flag(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[1.0] when any element of `tensors` is inf/NaN, else [0.0], on the CPU. One fused pass (as clip_grad_norm_
    does): a tensor's max-norm (largest |x|, which cannot overflow) is finite exactly when its elements are, and
    no boolean copy of every tensor is made."""
    local = [t for t in tensors if t.numel()]
    norms = torch.stack(torch._foreach_norm(local, float("inf"))) if local else torch.zeros(1)
    return (~torch.isfinite(norms)).any().float().cpu().reshape(1)


def report_nonfinite(params: list[torch.Tensor], rank: int, step: int, overflow: bool, scaler, log) -> None:
    """Name the ranks whose own gradients are non-finite at (1-based) `step` (all ranks skip the step either
    way). One all-reduce: every rank calls it."""
    local = any(not torch.isfinite(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).all()
                for p in params if p.grad is not None)
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32)
    flags[rank] = int(local)
    dist.all_reduce(flags)
    ranks = [r for r, f in enumerate(flags.tolist()) if f]
    what = "fp16 overflow" if overflow else "non-finite loss/gradients"
    scale = f"; loss scale {scaler.scale:g} -> {scaler.scale * scaler.backoff_factor:g}" if overflow else ""
    log(f"llmtrain: step {step}: {what} on rank(s) {ranks or '?'}; update skipped on every rank{scale}", flush=True)
