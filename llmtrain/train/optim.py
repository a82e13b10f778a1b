"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def resolve_fused(fused: str, device_type: str) -> str:
    """The AdamW kernel optim.fused names on this device: `auto` is torch's fused kernel on CUDA and the plain
    per-parameter loop on CPU, the reference every layout's losses are compared with (fused=torch also runs
    on CPU, within 1e-6 of it)."""
    if fused != "auto":
        return fused
    return "torch" if device_type == "cuda" else "none"


def build_optimizer(modules: list[nn.Module], train_cfg, fused: str = "none") -> torch.optim.Optimizer:
    """AdamW over the parameters of `modules`; `fused` is already resolved (none, torch or apex)."""
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
    if fused == "torch":
        # One fused kernel runs per group, and it refuses plain tensors mixed with DTensors (tensor parallel keeps
        # LayerNorms plain) or DTensors of different meshes: give each layout its own group.
        groups = [g for group in groups for g in split_by_layout(group)]
        kernel = {"fused": True}
    else:
        # foreach=False keeps DTensor parameters of different meshes (TP vs replicated) in separate kernels.
        kernel = {"foreach": False}
    optimizer = torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2),
                                  eps=train_cfg.eps, **kernel)
    if fused == "torch":
        steps_follow_params(optimizer)
    return optimizer


def steps_follow_params(optimizer: torch.optim.Optimizer) -> None:
    """Before the first step, move step counters to their parameter's device: the fused kernel keeps them there,
    while a checkpoint restores them where the plain loop keeps them (the CPU), which a CUDA kernel refuses."""
    def move(opt, args, kwargs) -> None:
        for param, state in opt.state.items():
            step = state.get("step")
            if torch.is_tensor(step) and step.device != param.device:
                state["step"] = step.to(param.device)
        handle.remove()

    handle = optimizer.register_step_pre_hook(move)


def split_by_layout(group: dict) -> list[dict]:
    """`group` split into groups whose parameters share one layout: plain, or one DTensor mesh and placements."""
    by_layout: dict[object, list[torch.Tensor]] = {}
    for param in group["params"]:
        key = (param.device_mesh, param.placements) if isinstance(param, DTensor) else "plain"
        by_layout.setdefault(key, []).append(param)
    return [{**group, "params": params} for params in by_layout.values()]


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
