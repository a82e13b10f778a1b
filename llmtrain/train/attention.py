"""train.attention: which kernel the models' scaled-dot-product attention runs (torch picks one by default).

The trainer enters the choice around each step's forward and backward (recompute runs its forward again inside
backward) and around evaluation, so every attention call of the step takes it; the models name no kernel."""

from __future__ import annotations

import contextlib

BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "math": "MATH"}


def attention_context(name: str):
    """A context that restricts attention to `name`'s kernel (auto: no restriction)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, BACKENDS[name])])
