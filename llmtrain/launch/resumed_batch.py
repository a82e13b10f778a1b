"""A resume keeps the checkpoint's global batch: a run's samples per step are fixed when it starts, whatever layout
later launches use (fewer nodes: more micro-batches per dp rank, the same global batch). Only an explicit
train.global_batch_size (an override or a config file) changes it; the "resuming ... with these changes" list then
says so. Applied while composing, before validation, so the kept value is the one checked against the new layout."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from llmtrain.config import batch
from llmtrain.errors import LlmtrainError


def checkpoint_global_batch(cfg: DictConfig) -> int | None:
    """The global batch of the checkpoint this config resumes from; None for a fresh start, or when
    checkpoint.resume cannot be resolved (the launcher's resume check names that)."""
    from llmtrain.checkpoint.resume import resolve_resume
    from llmtrain.config import load_run_config

    try:
        path = resolve_resume(os.path.abspath(cfg.run.dir), cfg.checkpoint.resume).checkpoint
        if path is None:
            return None
        return int(load_run_config(os.path.join(path, "config.yaml")).train.global_batch_size)
    except (LlmtrainError, OSError, TypeError, ValueError):
        return None


def keep_checkpoint_batch(cfg: DictConfig, origins: dict[str, str], kept: int | None) -> None:
    """Put the checkpoint's global batch `kept` (None: a fresh start) in place of the default one, and fit a null
    micro-batch size to it; origins[GLOBAL_KEY] becomes "checkpoint". An explicit value stays."""
    if origins.get(batch.GLOBAL_KEY) not in ("default", "checkpoint"):
        return
    cfg.train.global_batch_size = kept  # None: the default, filled below
    batch.fill(cfg, fill_micro=origins.get(batch.MICRO_KEY) == "default")
    origins[batch.GLOBAL_KEY] = "default" if kept is None else "checkpoint"
