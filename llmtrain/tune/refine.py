"""The tune's second round: the plan has no figure for train.compile or optim.fused, so the measured-fastest layout
is measured again with each of them switched to its other value, one at a time (`<layout>+compile`,
`<layout>+fused`, ...). A switch that validate() refuses, or that torch cannot run on the trials' device, is left
out with the reason. The winner is then the measured-fastest layout, or one of its refinements when that is faster
beyond both trials' spreads (noise.py)."""

from __future__ import annotations

import shutil

from llmtrain.config import ConfigError, validate
from llmtrain.tune.candidates import Layout, Ranked

REFINE_KEYS = ("train.compile", "optim.fused")
# The name each switched value adds to the layout's name.
SUFFIXES = {("train.compile", True): "+compile", ("train.compile", False): "+eager",
            ("optim.fused", "torch"): "+fused", ("optim.fused", "none"): "+unfused"}


def device_type(profile: str) -> str:
    """The device the trials train on: the cpu profile's ranks run on the CPU, every other profile on CUDA."""
    return "cpu" if profile == "cpu" else "cuda"


def switched(cfg, key: str, device: str):
    """The other value of one of REFINE_KEYS: for optim.fused, the plain loop when the configured value runs a
    fused kernel on the device (as the trainer resolves `auto`), else torch's fused kernel."""
    if key == "train.compile":
        return not cfg.train.compile
    from llmtrain.train.optim import resolve_fused  # imports torch: only when a round runs

    return "none" if resolve_fused(cfg.optim.fused, device) != "none" else "torch"


def unavailable(key: str, value, device: str) -> str | None:
    """Why torch cannot run this value on the device (checked on this machine), or None."""
    if key == "train.compile" and value:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return "torch.compile is not supported on this Python"
        if device == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "torch.compile on the CPU needs a C++ compiler (g++, c++ or clang++), and none is on PATH"
    if key == "optim.fused" and value == "torch" and device == "cpu":
        import torch

        try:
            torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
        except (RuntimeError, ValueError) as e:
            return f"this torch has no fused AdamW for the CPU ({str(e).splitlines()[0]})"
    return None


def variants(best: Ranked, device: str) -> tuple[list[Ranked], list[str]]:
    """(the layout with each switch flipped, one at a time, as layouts to measure; a line per switch left out)."""
    out, skipped = [], []
    for key in REFINE_KEYS:
        value = switched(best.layout.cfg, key, device)
        why = unavailable(key, value, device)
        cfg = best.layout.cfg.copy()
        section, name = key.split(".")
        cfg[section][name] = value
        if why is None:
            try:
                validate(cfg)
            except ConfigError as e:
                why = f"refused: {e}"
        shown = str(value).lower() if isinstance(value, bool) else value
        if why:
            skipped.append(f"not trying {best.layout.name} with {key}={shown}: {why}")
            continue
        layout = Layout({**best.layout.values, key: value}, cfg, refines=best.layout.name,
                        suffix=SUFFIXES[(key, value)])
        out.append(Ranked(layout, best.plan))  # the estimate is the base layout's: the plan cannot tell them apart
    return out, skipped


def tuned_overrides(cfg, winner_overrides: list[str]) -> list[str]:
    """The winner's overrides with every REFINE_KEYS key set: the configured value unless a refinement won."""
    given = {o.split("=", 1)[0] for o in winner_overrides}
    configured = {"train.compile": str(cfg.train.compile).lower(), "optim.fused": cfg.optim.fused}
    return [*winner_overrides, *(f"{k}={v}" for k, v in configured.items() if k not in given)]
