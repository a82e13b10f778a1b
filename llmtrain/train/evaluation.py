"""Validation: the mean loss over train.eval_steps global batches of the val split (the same samples in any
layout), and for data=mix each source's own val split, with the overall val_loss their weight-averaged loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmtrain.data.mixture import normalised


@dataclass
class EvalResult:
    val_loss: float
    source_val_loss: dict[str, float] | None = None  # data=mix only


def _batches_loss(trainer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Mean loss of one global batch's micro-batches on this rank (under pp: on the last stage, zero elsewhere)."""
    if trainer.model.pipeline is not None:
        return trainer.run_pipeline(batches, train=False)
    total = torch.zeros((), device=trainer.device)
    for x, y in batches:
        with trainer.model.loss_context():
            total += trainer.plain(trainer.model_loss(trainer.model.parts[0], x, y)).float() / trainer.accum
    return total


@torch.no_grad()
def evaluate(trainer) -> EvalResult:
    for part in trainer.model.parts:
        part.eval()
    steps = trainer.cfg.train.eval_steps
    mixture = trainer.feed.mixture
    names = mixture.names if mixture is not None else [None]
    totals = []
    for name in names:
        total = torch.zeros((), device=trainer.device)
        for i in range(steps):
            total += _batches_loss(trainer, [trainer.feed.val_batch(i, m, name) for m in range(trainer.accum)])
        totals.append(total / max(1, steps))
    # One reduction for every source's loss.
    losses = trainer.global_mean_loss(torch.stack(totals)).tolist()
    if mixture is None:
        return EvalResult(losses[0])
    per_source = dict(zip(names, losses))
    weights = normalised(mixture.weights)
    overall = sum(weights[name] * loss for name, loss in per_source.items() if weights[name] > 0)
    return EvalResult(overall, per_source)
