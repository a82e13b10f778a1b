"""The model families (one folder each, found by model.arch through registry.py; no parallelism code) and their
layout-independent initialization.

No torch at import: config validation and `llmtrain plan` read the families' specs (family.py) without it; the
torch modules below load on first use."""

from __future__ import annotations

import importlib

from llmtrain.model.registry import family_of

__all__ = ["GPT", "GPTArgs", "Llama", "LlamaArgs", "build_model", "init_parameters"]

# name -> module that defines it, imported on first access
_LAZY = {"GPT": "llmtrain.model.gpt2.module", "GPTArgs": "llmtrain.model.gpt2.module",
         "Llama": "llmtrain.model.llama.module", "LlamaArgs": "llmtrain.model.llama.module",
         "init_parameters": "llmtrain.model.init"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_model(model_cfg):
    """The whole model of a config's `model` section, on the current default device (meta for shapes only);
    model.arch picks the family."""
    return family_of(model_cfg).build(model_cfg)
