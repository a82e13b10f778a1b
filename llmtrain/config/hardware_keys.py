"""The rules of the hardware keys: which dtypes a peak table may name, the form of a compute capability, and a
GPU profile that lacks the compute dtype. Pure rules on the config's values; detection lives in llmtrain.hardware."""

from __future__ import annotations

from llmtrain.config.errors import ConfigError

# Keys of hardware.peak_tflops: the precision.compute_dtype names, plus tf32 and fp8 (e4m3 and e5m2 share a peak).
PEAK_DTYPES = ("float32", "tfloat32", "bfloat16", "float16", "float8")
# Dtypes a GPU may lack; a GPU profile without a peak for one does not have it (fp32 and fp16 every GPU runs).
OPTIONAL_DTYPES = {"bfloat16": "bf16", "float8": "fp8"}

def parse_capability(text) -> tuple[int, int] | None:
    """A capability as (major, minor): "9.0" is (9, 0), None stays None; ValueError for anything else."""
    if text is None:
        return None
    major, dot, minor = str(text).partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise ValueError(f"must be 'major.minor' such as \"9.0\", or null (got {text})")
    return int(major), int(minor)


def check_dtype(peaks: dict, name: str, compute_dtype: str, device: str | None = None) -> None:
    """ConfigError (key `precision`) when a GPU profile lists peaks but none for an optional compute dtype."""
    short = OPTIONAL_DTYPES.get(compute_dtype)
    if short and peaks and compute_dtype not in peaks:
        found = f" (detected: {device})" if device else ""
        raise ConfigError("precision", f"hardware={name}{found} has no {short}; use precision=fp16")
