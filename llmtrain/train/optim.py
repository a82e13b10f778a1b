"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(modules: list[nn.Module], train_cfg, fused: str = "none") -> torch.optim.Optimizer:
    decay, no_decay = [], []
    seen: set[int] = set()
    for module in modules:
        for param in module.parameters():
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            # Biases and LayerNorm gains (1-D) are not decayed (GPT-2/3 practice).
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if fused == "apex":
        from llmtrain.train.apex_support import fused_adam

        return fused_adam(groups, train_cfg)
    kernel = {"fused": True} if fused == "torch" else {"foreach": False}
    # foreach=False keeps DTensor parameters of different meshes (TP vs replicated) in separate kernels.
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2),
                             eps=train_cfg.eps, **kernel)


def lr_at(step: int, train_cfg) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine decay to min_lr."""
    lr, min_lr, warmup, total = train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_steps, train_cfg.max_steps
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
