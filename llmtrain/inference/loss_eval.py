"""A checkpoint's loss on token data, per source: the run's own validation data (the windows the trainer's eval
reads, so the loss is its val_loss) or token files given on the command line (every window of each, in order).

A window is seq_len + 1 tokens (inputs [:-1], targets [1:]); the loss is the mean cross entropy over every target
token, computed as the trainer computes it (fp32, over the model's whole output, padding rows included). A
mixture's overall loss weights each source's loss by its data.sources weight, as the trainer's val_loss does;
for files it is the mean over all their tokens."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from llmtrain.data.datasets import build_dataset
from llmtrain.data.errors import DataError
from llmtrain.data.mixture import normalised
from llmtrain.data.mixture_config import source_names
from llmtrain.data.mixture_data import MixtureData, MixtureSource
from llmtrain.data.token_source import inspect_token_source
from llmtrain.inference.run_data import data_sources


@dataclass
class EvalSource:
    name: str
    sample: Callable[[int], object]  # window index -> seq_len + 1 token ids (tensor or array)
    windows: int  # the windows evaluated: 0 .. windows - 1
    weight: float | None = None  # a mixture source's share of the overall loss


@dataclass
class SourceLoss:
    name: str
    loss: float
    windows: int
    tokens: int
    weight: float | None = None

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def run_val_sources(cfg, ckpt_meta: dict, windows: int) -> list[EvalSource]:
    """The run's validation split (data=mix: each source's), its first `windows` windows as the trainer reads them
    (eval batch i, sample j -> val window i * global_batch_size + j, wrapping around the split)."""
    data = copy.deepcopy(cfg.data)
    paths = data_sources(cfg, ckpt_meta)
    if data.name == "mix":
        for entry, path in zip(data.sources, paths.values()):
            entry.path = path
        mixture = MixtureData(data, cfg.model, cfg.train.seed)
        weights = normalised(mixture.weights)
        return [EvalSource(name, source.val_sample, windows, weights[name])
                for name, source in mixture.sources.items()]
    if data.name in paths:
        data.path = paths[data.name]
    dataset = build_dataset(data, cfg.model, cfg.train.seed)
    count = dataset.num_samples("val")
    name = source_names([{"path": data.path}])[0] if data.name == "memmap" else data.name
    return [EvalSource(name, lambda i: dataset.sample("val", i % count), windows)]


def file_sources(paths: list[str], cfg, windows: int | None) -> list[EvalSource]:
    """Token files or shard folders, each one source: its windows in order from its first token, all of them or the
    first `windows`."""
    names = source_names([{"path": p} for p in paths])
    if len(set(names)) != len(names):
        names = list(paths)
    seq_len, vocab = int(cfg.model.seq_len), int(cfg.model.vocab_size)
    found = []
    for name, path in zip(names, paths):
        info = inspect_token_source(path, None, key="--data")
        if info.vocab_size is not None and info.vocab_size > vocab:
            raise DataError("--data", f"{info.path} has vocab_size {info.vocab_size:,} but the model's vocabulary is "
                                      f"{vocab:,} (model.vocab_size): it was prepared with another tokenizer")
        source = MixtureSource(name, info, seq_len, 1.0, 0, vocab)  # the "val region" is the whole file
        if not source.val_windows:
            raise DataError("--data", f"{info.path} holds {info.num_tokens:,} tokens, fewer than one window of "
                                      f"{seq_len + 1} (model.seq_len + 1)")
        count = source.val_windows if windows is None else min(windows, source.val_windows)
        found.append(EvalSource(name, source.val_sample, count))
    return found


@torch.inference_mode()
def source_loss(model: torch.nn.Module, source: EvalSource, batch_size: int, device: torch.device) -> SourceLoss:
    """Mean cross entropy over every target token of the source's windows, `batch_size` windows per forward."""
    total, tokens = 0.0, 0
    for start in range(0, source.windows, batch_size):
        rows = torch.stack([torch.as_tensor(source.sample(i)) for i in range(start, min(start + batch_size,
                                                                                        source.windows))])
        x, y = rows[:, :-1].to(device), rows[:, 1:].to(device)
        logits = model(x)
        total += float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum"))
        tokens += y.numel()
    return SourceLoss(source.name, total / tokens, source.windows, tokens, source.weight)


def overall_loss(losses: list[SourceLoss]) -> float:
    """Weighted by the mixture's weights (sources of weight 0 left out), else by tokens."""
    if all(s.weight is not None for s in losses):
        return sum(s.weight * s.loss for s in losses if s.weight > 0)
    return sum(s.loss * s.tokens for s in losses) / sum(s.tokens for s in losses)
