"""A checkpoint's model in one process, for inference: its consolidated weights (checkpoint.export, from any
parallel layout) in the model its config.yaml describes, in eval mode on one device, in fp32."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from llmtrain.checkpoint import store
from llmtrain.checkpoint.export import load_model_state
from llmtrain.checkpoint.storage import is_uri
from llmtrain.checkpoint.weight_map import HEAD
from llmtrain.errors import CheckpointUsageError, ConfigError
from llmtrain.model import build_model


@dataclass
class CheckpointModel:
    model: torch.nn.Module
    cfg: DictConfig  # the run config saved with the checkpoint
    path: str  # the checkpoint folder
    meta: dict  # its meta.json (step, data identity, ...); {} when unreadable
    device: torch.device

    @property
    def step(self) -> int | None:
        return self.meta.get("step")

    @property
    def vocab_size(self) -> int:
        """The real vocabulary (model.vocab_size); the embedding may have padding rows beyond it."""
        return int(self.cfg.model.vocab_size)

    @property
    def seq_len(self) -> int:
        return int(self.cfg.model.seq_len)


def resolve_checkpoint(path: str) -> tuple[str, bool]:
    """(checkpoint folder, whether `path` was a run directory: then its newest complete checkpoint). `path` may be
    an object-store URI: a checkpoint folder or a checkpoint location (s3://bucket/prefix/RUN)."""
    if not (store.exists(path) if is_uri(path) else os.path.exists(path)):
        raise CheckpointUsageError(path, "no such checkpoint folder or run directory")
    return store.checkpoint_or_newest(path)


def pick_device(name: str | None) -> torch.device:
    """`--device` (cpu, cuda, cuda:N), or CUDA when there is one, else the CPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError("--device", f"unknown device {name!r} (cpu, cuda, cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device", f"{name}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError("--device", f"{name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise ConfigError("--device", f"unsupported device {name!r} (cpu, cuda, cuda:N)")
    return device


def load_checkpoint_model(ckpt: str, device: torch.device) -> CheckpointModel:
    """The model of checkpoint folder `ckpt` with its weights, on `device`, in eval mode."""
    tensors, cfg = load_model_state(ckpt)
    with torch.device(device):
        model = build_model(cfg.model)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # A tied head is the embedding: load_model_state returns it once, as embed.tok.weight.
    missing = [name for name in missing if not (name == HEAD and model.args.tie_embeddings)]
    if missing or unexpected:
        raise CheckpointUsageError(ckpt, f"its tensors do not fit the model of its config.yaml (missing "
                                         f"{missing[:3]}, unexpected {unexpected[:3]})")
    return CheckpointModel(model.eval(), cfg, ckpt, store.read_meta(ckpt) or {}, device)
