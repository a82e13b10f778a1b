"""Hardware profiles: dense peak FLOPS by dtype, memory and link bandwidths (configs/hardware/), or this CPU
measured: a peak table that is wrong by 2x gives MFU figures that are wrong by 2x, so the CPU's is measured."""

from __future__ import annotations

import functools
import time

KNOWN_GPUS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"))


@functools.lru_cache(maxsize=None)
def measured_cpu_tflops(n: int = 1024, repeats: int = 5) -> float:
    """Best-of-N fp32 matmul throughput of this CPU with the current thread count."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def detect_name() -> str:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, profile in KNOWN_GPUS:
            if key in name:
                return profile
        return "gpu"
    return "cpu"


def resolve(hw_cfg, compute_dtype: str, load_profile) -> dict:
    """{name, peak_tflops (for compute_dtype), memory_gib, intra_node_gbs, inter_node_gbs, efficiency}."""
    name = hw_cfg.name
    if name == "auto":
        name = detect_name()
        if name in ("h100", "h200", "a100", "cpu"):
            hw_cfg = load_profile(name)
    peak = dict(hw_cfg.peak_tflops).get(compute_dtype)
    memory = hw_cfg.memory_gib
    if name == "cpu" or peak is None:
        if name == "gpu":
            raise ValueError(f"unknown GPU model: give hardware.peak_tflops.{compute_dtype}=<dense TFLOPS>")
        peak = measured_cpu_tflops()
        if memory is None:
            import psutil

            memory = psutil.virtual_memory().total / 2**30
    return {"name": name, "peak_tflops": float(peak), "memory_gib": memory,
            "intra_node_gbs": float(hw_cfg.intra_node_gbs), "inter_node_gbs": float(hw_cfg.inter_node_gbs),
            "efficiency": float(getattr(hw_cfg, "efficiency", 0.5))}
