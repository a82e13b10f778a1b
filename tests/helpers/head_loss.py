"""The loss a model computes in the trainer: its head_loss set from the config's train.loss (on CPU, one rank)."""

from __future__ import annotations

from llmtrain.loss import head_loss_for, resolve_loss


def trained_loss(model, cfg, x, y):
    """model(x, targets=y) with the head_loss the trainer would give it for `cfg`."""
    model.head_loss = head_loss_for(resolve_loss(cfg.train.loss, "cpu", 1), cfg.train.loss_chunk_tokens)
    return model(x, targets=y)
