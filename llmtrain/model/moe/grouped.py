"""Whether a forward runs the experts as torch._grouped_mm or as a loop (model.moe.grouped_mm).

auto: the grouped kernel where it is fast and its layout needs are met: a CUDA device of compute capability >= 9.0,
bf16 (the kernel's own case; fp32 and fp16 go through a slower path there, if at all), 16-byte aligned widths and
weights. on: always, wherever torch provides it (torch 2.13 runs it on the CPU too, fp32 and bf16), so a wrong
layout fails loudly. off: the loop.
"""

from __future__ import annotations

import torch

from llmtrain.model.moe.args import GROUPED_MM_WIDTH_MULTIPLE


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the experts' matmuls run in: autocast's where it is on (the block's input is then the norm's
    fp32 output), else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def use_grouped_mm(mode: str, x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> bool:
    if mode == "off":
        return False
    if mode == "on":
        return True
    if x.device.type != "cuda" or compute_dtype(x) != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return False
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return False
    if any(w.shape[-1] % GROUPED_MM_WIDTH_MULTIPLE for w in weights):
        return False
    # A traced graph cannot read addresses (fresh allocations are aligned; only a view into a buffer may not be).
    return torch.compiler.is_compiling() or all(w.data_ptr() % 16 == 0 for w in weights)
