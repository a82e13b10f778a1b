"""Faults on purpose, for tests of the paths real faults take: LLMTRAIN_INJECT_NONFINITE="STEP:RANK[,STEP:RANK]"
puts an inf into one gradient of that rank after the backward of that (1-based) step, so overflow handling can be
tested where only one rank overflows. Read once when training starts; without it the training loop has no hook."""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

NONFINITE_ENV = "LLMTRAIN_INJECT_NONFINITE"


def gradient_fault(rank: int) -> Callable[[int, list[torch.Tensor]], None] | None:
    """A hook (step, params) for this rank, or None when no fault is asked for."""
    spec = os.environ.get(NONFINITE_ENV)
    if not spec:
        return None
    steps = {int(s) for s, r in (item.split(":") for item in spec.split(",") if item) if int(r) == rank}

    def inject(step: int, params: list[torch.Tensor]) -> None:
        if step not in steps:
            return
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                if g.numel():
                    g.view(-1)[0] = float("inf")
                    return

    return inject
