"""Rotary position embedding as transformers' Llama computes it: the same inverse frequencies (with Llama 3.1's
"llama3" scaling) and the "rotate_half" layout (dimension i of a head paired with i + head_dim / 2), so Hugging
Face q/k weights map with no permutation."""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling=None) -> torch.Tensor:
    """head_dim / 2 rotation speeds on the CPU in fp32, computed with transformers' own operations so the values
    are bit-identical. `scaling`: model.rope_scaling (factor, low/high_freq_factor,
    original_max_position_embeddings) or None."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is None:
        return inv_freq
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin(inv_freq: torch.Tensor, seq_len: int,
            positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (seq_len, head_dim) in fp32, for positions 0..seq_len-1 (or the given `positions`)."""
    if positions is None:
        positions = torch.arange(seq_len, device=inv_freq.device)
    freqs = positions.to(device=inv_freq.device, dtype=torch.float)[:, None] * inv_freq.float()
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim) by position; cos/sin are cast to x's dtype as transformers does."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
