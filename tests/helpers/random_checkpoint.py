"""A checkpoint folder of a random model, written as the trainer writes one ("model" tensors through DCP,
config.yaml, meta.json), for tests that load, export or generate from a checkpoint without training."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from llmtrain.config import to_yaml
from llmtrain.model import build_model


def save_random_checkpoint(path: Path, cfg, step: int, matrix_std: float, before_save=None):
    """Every parameter moved off its init (matrices ~ N(0, matrix_std), norm gains around 1, other vectors small),
    so a mis-mapped tensor shows; saved with the persistent buffers (a routing bias) as the trainer saves them,
    after `before_save(model)` if given. Returns the model (eval mode) and its config."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and name.endswith("weight")  # a norm's gain
            p.copy_(torch.randn_like(p) * (matrix_std if p.dim() > 1 else 0.1) + (1.0 if gain else 0.0))
    if before_save is not None:
        before_save(model)
    state = {n: p.detach() for n, p in model.named_parameters()}
    saved = model.state_dict()
    state.update((n, b) for n, b in model.named_buffers() if n in saved)
    path.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": state}, checkpoint_id=str(path), no_dist=True)
    (path / "config.yaml").write_text(to_yaml(cfg))
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return model.eval(), cfg
