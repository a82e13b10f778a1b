"""Optional NVIDIA apex: FusedAdam + FusedLayerNorm (optim.fused=apex) and amp O1/O2 (precision=apex-o1|o2).

apex is not on PyPI and is only imported here, when asked for; validation has already turned a missing apex into
a one-line error saying how to install it. apex amp predates DTensor and FSDP2, so its modes run on layouts
without sharding (dp == 1, tp == 1, pp == 1); the PyTorch-native precision=bf16|fp16 paths work everywhere and are
the recommended ones.
"""

from __future__ import annotations

import torch
from torch import nn

from llmtrain.config.errors import ConfigError


def fused_layernorm(model: nn.Module) -> None:
    """Swap every nn.LayerNorm for apex's FusedLayerNorm, keeping the parameters."""
    from apex.normalization import FusedLayerNorm

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                fused = FusedLayerNorm(child.normalized_shape, eps=child.eps,
                                       elementwise_affine=child.elementwise_affine)
                fused.weight, fused.bias = child.weight, child.bias
                setattr(parent, name, fused)


def fused_adam(groups: list[dict], train_cfg) -> torch.optim.Optimizer:
    from apex.optimizers import FusedAdam

    return FusedAdam(groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), eps=train_cfg.eps,
                     adam_w_mode=True)


def amp_initialize(model: nn.Module, optimizer: torch.optim.Optimizer, precision: str, world_size: int):
    if world_size != 1:
        raise ConfigError("precision", f"{precision}: apex amp predates DTensor/FSDP2 and runs on one process only; "
                                       "use precision=fp16 (same dynamic loss scaling, every layout)")
    from apex import amp

    return amp.initialize(model, optimizer, opt_level="O1" if precision == "apex-o1" else "O2")
