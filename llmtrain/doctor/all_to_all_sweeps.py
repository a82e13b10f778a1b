"""`llmtrain doctor`'s all-to-all sweep, timed the way nccl-tests' alltoall_perf does: all_to_all_single of fp32
with equal splits, `size` bytes sent by each rank (size / n to every member, itself included). It is the
collective expert parallel uses to send routed tokens to their experts' ranks and back. It runs on the same groups
as the all-reduce sweeps (all_reduce_sweeps), at fewer sizes: every other size of theirs, the largest included.
"""

from __future__ import annotations

from llmtrain.doctor.collective_timing import row, slowest_seconds


def all_to_all_sizes(sizes: list[int]) -> list[int]:
    """Every other size of the all-reduce sweep counted down from its largest (4x steps there, 16x here)."""
    return sorted(sorted(sizes, reverse=True)[::2])


def all_to_all_bus_factor(n: int) -> float:
    """nccl-tests' all-to-all bus bandwidth = algbw x (n-1)/n: the share of each rank's data that leaves it."""
    return (n - 1) / n if n > 1 else 0.0


def time_all_to_all(device, sizes: list[int], iters: int, group, n: int) -> list[dict]:
    """all_to_all_single over `group` of `n` ranks; the slowest rank's time per size."""
    import torch
    import torch.distributed as dist

    rows = []
    for size in sizes:
        numel = max(1, size // 4 // n) * n  # equal splits: a multiple of n elements
        send = torch.ones(numel, dtype=torch.float32, device=device)
        recv = torch.empty_like(send)
        seconds = slowest_seconds(device, lambda: dist.all_to_all_single(recv, send, group=group), iters, group)
        rows.append(row(numel * 4, seconds, all_to_all_bus_factor(n)))
    return rows
