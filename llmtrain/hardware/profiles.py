"""Hardware profiles: dense peak FLOPS by dtype, memory, link bandwidths and compute capability
(configs/hardware/). A peak table that is wrong by 2x gives MFU figures that are wrong by 2x, so only a known peak
counts: a GPU profile's, or one the user gives (hardware.peak_tflops.<dtype>). A CPU or a GPU no profile matches
gets no peak, and no MFU, rather than a guessed one; a CPU's matmul speed measured now (which swings with the
machine's load) only stands in for the plan's step-time estimate."""

from __future__ import annotations

import functools
import time

from llmtrain.config.hardware_keys import check_dtype, parse_capability
from llmtrain.hardware.gpu_names import profile_for

UNKNOWN_GPU = "gpu"


@functools.lru_cache(maxsize=None)
def measured_cpu_tflops(n: int = 1024, repeats: int = 5) -> float:
    """Best-of-N fp32 matmul throughput of this CPU with the current thread count, now: the speed a plan on a CPU
    estimates its step time with, never a peak for MFU."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def device_name(device_type: str | None = None) -> str | None:
    """The GPU's name as torch reports it, or None when the run uses the CPU (device_type None: a GPU if any)."""
    import torch

    if device_type == "cpu" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def device_capability() -> str | None:
    """This GPU's CUDA compute capability; None on ROCm, whose torch reports a gfx version in its place."""
    import torch

    if torch.version.hip:
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def device_memory_gib() -> float:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30


def profile_compute_capability(cfg) -> tuple[int, int] | None:
    """The compute capability of the configured profile; None for AMD, CPU and hardware=auto (known at run time
    only: resolve() reports the detected one)."""
    return parse_capability(cfg.hardware.compute_capability)


def load_profile(name: str):
    """configs/hardware/NAME.yaml typed as the hardware section."""
    from omegaconf import OmegaConf

    from llmtrain.config import builtin_config_dir
    from llmtrain.config.schema import HardwareConfig

    path = builtin_config_dir() / "hardware" / f"{name}.yaml"
    return OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(path))


def missing_peak(hw: dict, compute_dtype: str) -> str:
    """Why there is no peak, and the override that gives one."""
    if hw["name"] == "cpu":
        return (f"no known peak for this CPU; give its dense peak with +hardware.peak_tflops.{compute_dtype}=<TFLOPS> "
                "to show it")
    what = f"no hardware profile matches this GPU ({hw['device']})" if hw["name"] == UNKNOWN_GPU else \
        f"hardware={hw['name']} has no {compute_dtype} peak"
    return (f"{what}: give its dense peak with +hardware.peak_tflops.{compute_dtype}=<TFLOPS> "
            "(or choose a hardware= profile)")


def resolve(hw_cfg, compute_dtype: str, load_profile, device_type: str | None = None) -> dict:
    """{name, device, peak_tflops (for compute_dtype; None when unknown: a CPU's unless given), peaks (every dtype's
    known peak), memory_gib, intra_node_gbs, inter_node_gbs, efficiency, compute_capability}. hardware=auto detects
    the GPU (or the CPU) here; a GPU without the compute dtype raises ConfigError."""
    name, device, profile = hw_cfg.name, None, hw_cfg
    if name == "auto":
        device = device_name(device_type)
        name = "cpu" if device is None else (profile_for(device) or UNKNOWN_GPU)
        if name != UNKNOWN_GPU:
            profile = load_profile(name)
    if name not in ("cpu", UNKNOWN_GPU):
        check_dtype(dict(profile.peak_tflops), name, compute_dtype, device)
    # Peaks and memory given on the command line win over the detected profile's.
    peaks = {**profile.peak_tflops, **hw_cfg.peak_tflops}
    peak = peaks.get(compute_dtype)
    memory = hw_cfg.memory_gib if hw_cfg.memory_gib is not None else profile.memory_gib
    capability = profile.compute_capability
    if name == "cpu":
        if memory is None:
            import psutil

            memory = psutil.virtual_memory().total / 2**30
    elif name == UNKNOWN_GPU:
        memory = memory if memory is not None else device_memory_gib()
        capability = device_capability()
    return {"name": name, "device": device, "peak_tflops": None if peak is None else float(peak),
            "peaks": {dtype: float(tflops) for dtype, tflops in peaks.items()},
            "memory_gib": memory, "intra_node_gbs": float(profile.intra_node_gbs),
            "inter_node_gbs": float(profile.inter_node_gbs), "efficiency": float(getattr(hw_cfg, "efficiency", 0.5)),
            "compute_capability": capability}
