"""How `llmtrain doctor` times one collective at one size, the way nccl-tests does: a warm-up, then `iters` calls
back to back, and the slowest rank's mean time per call (the group can go no faster than its slowest member)."""

from __future__ import annotations

import time
from typing import Callable

WARMUP = 2


def slowest_seconds(device, call: Callable[[], None], iters: int, group) -> float:
    """Every member of `group` calls this with its own `call` (one collective on `group`)."""
    import torch
    import torch.distributed as dist

    for _ in range(WARMUP):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def row(nbytes: int, seconds: float, busbw_factor: float) -> dict:
    """One size's figures: algbw = bytes / time; busbw = algbw x the collective's factor (nccl-tests' busbw)."""
    algbw = nbytes / seconds / 1e9
    return {"bytes": nbytes, "time_us": seconds * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * busbw_factor}
