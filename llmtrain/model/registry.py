"""The model families by model.arch: each is a folder here whose __init__.py holds SPEC (model/family.py).

A new family is one more folder and its name below; nothing outside llmtrain/model/ changes."""

from __future__ import annotations

import importlib

from llmtrain.model.family import FamilySpec

FAMILIES = ("gpt2", "llama", "qwen3", "olmoe")


def family(arch: str) -> FamilySpec:
    """The spec of model.arch=`arch` (validation has already refused an unknown one)."""
    if arch not in FAMILIES:
        raise KeyError(f"no model family {arch!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"llmtrain.model.{arch}").SPEC


def family_of(model_cfg) -> FamilySpec:
    return family(getattr(model_cfg, "arch", "gpt2"))


def family_for_hf_type(model_type: str) -> FamilySpec | None:
    """The family that reads a Hugging Face config.json of this model_type, or None."""
    return next((s for s in map(family, FAMILIES) if model_type in s.hf_model_types), None)
