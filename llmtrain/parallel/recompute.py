"""Activation recomputation, applied from outside the model.

- full: each selected transformer block keeps only its input and recomputes everything in backward
  (checkpoint_wrapper around the block);
- selective: only the attention core (softmax(QK^T)V, the part whose activations grow with seq^2) is recomputed
  (Korthikanti et al. 2022);
- every=N: only every N-th block (by global layer index) is recomputed, trading memory for speed.
Works under TP (applied after it), PP (per stage) and FSDP2 (applied before it).
"""

from __future__ import annotations

import functools

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint


def apply_recompute(model: nn.Module, mode: str, every: int) -> None:
    if mode == "none":
        return
    for key in list(model.layers.keys()):
        if int(key) % every:
            continue
        block = model.layers[key]
        if mode == "full":
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=True)
        else:
            core = block.attn.core
            block.attn.core = functools.partial(checkpoint, core, use_reentrant=False)
