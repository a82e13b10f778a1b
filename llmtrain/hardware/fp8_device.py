"""Whether this device can run precision=fp8: float8 tensor cores (compute capability 8.9 or newer).

The launcher asks before launch, from the config: device=cpu, hardware=cpu, a GPU profile below compute capability
8.9, and with hardware=auto on cluster=local this node's own device (it runs the workers). With hardware=auto on ssh
or slurm the launcher's node may have no GPU at all, so each worker asks again once its device is known
(check_fp8_node), with the same message. No torch import unless this node's device is probed."""

from __future__ import annotations

from llmtrain.config.errors import ConfigError
from llmtrain.config.hardware_keys import parse_capability
from llmtrain.launch.backends.traits import traits_of

FP8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.0)


def _refusal(where: str) -> str:
    return (f"fp8 needs float8 tensor cores (an NVIDIA GPU of compute capability 8.9 or newer: Ada, Hopper, "
            f"Blackwell; or an AMD MI300X), and {where}; use precision=bf16")


def configured_device_problem(cfg) -> str | None:
    """Why the configured device cannot run fp8, as far as the config (and, for cluster=local with
    hardware=auto, this node) tells; None when it can or only the workers can tell."""
    hw = cfg.hardware
    if cfg.device == "cpu":
        return _refusal("device=cpu trains on the CPU")
    if hw.name == "cpu":
        return _refusal("hardware=cpu is a CPU")
    if hw.name != "auto":
        try:
            capability = parse_capability(hw.compute_capability)
        except ValueError:
            return None  # the hardware rules name the malformed value
        if capability is not None and capability < FP8_MIN_CAPABILITY:
            return _refusal(f"hardware={hw.name} has compute capability {hw.compute_capability}")
        if hw.peak_tflops and "float8" not in hw.peak_tflops:  # e.g. an AMD GPU without fp8 (no capability)
            return _refusal(f"hardware={hw.name} has no float8 matmuls")
        return None
    if traits_of(cfg.cluster.name).launcher_is_the_node:  # it runs the workers: its device is theirs
        return node_device_problem(cfg.device)
    return None


def node_device_problem(device_setting: str, device_type: str | None = None) -> str | None:
    """Why this node's device cannot run fp8: `device_type` is the worker's resolved device ("cpu", "cuda"); None
    means what device=auto would find here."""
    from llmtrain.hardware.profiles import device_capability, device_name

    name = device_name(device_type)
    if name is None:
        here = "" if device_setting == "cpu" else " here (this node has no CUDA device)"
        return _refusal(f"device={device_setting} trains on the CPU{here}")
    capability = device_capability()  # None on ROCm: torchao picks its float8 variant there
    if capability is not None and parse_capability(capability) < FP8_MIN_CAPABILITY:
        return _refusal(f"the detected GPU ({name}) has compute capability {capability}")
    return None


def check_fp8_node(cfg, device_type: str) -> None:
    """The worker's check at start, once its device is known: ConfigError (key `precision`) if it cannot run fp8."""
    if cfg.precision.name != "fp8":
        return
    problem = node_device_problem(cfg.device, device_type)
    if problem:
        raise ConfigError("precision", problem)
