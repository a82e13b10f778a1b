"""Readers of run directories for the integrity tests: checkpoint names, float tensors of a state, metrics lines."""

from __future__ import annotations

from pathlib import Path

import torch


def names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def float_tensors(state, prefix=""):
    for key, value in state.items():
        if isinstance(value, dict):
            yield from float_tensors(value, f"{prefix}{key}.")
        elif torch.is_tensor(value) and value.is_floating_point():
            yield f"{prefix}{key}", value


def write_metrics(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))
