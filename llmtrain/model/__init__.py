"""The models (GPT-2 and Llama; no parallelism code) and their layout-independent initialization."""

from __future__ import annotations

from llmtrain.model.gpt import GPT, GPTArgs
from llmtrain.model.init import init_parameters
from llmtrain.model.llama import Llama, LlamaArgs

__all__ = ["GPT", "GPTArgs", "Llama", "LlamaArgs", "build_model", "init_parameters", "model_args"]


def model_args(model_cfg) -> GPTArgs | LlamaArgs:
    """The architecture's arguments for a config's `model` section (model.arch picks the family)."""
    return LlamaArgs.from_config(model_cfg) if model_cfg.arch == "llama" else GPTArgs.from_config(model_cfg)


def build_model(model_cfg) -> GPT | Llama:
    """The whole model of a config's `model` section, on the current default device (meta for shapes only)."""
    args = model_args(model_cfg)
    return Llama(args) if isinstance(args, LlamaArgs) else GPT(args)
