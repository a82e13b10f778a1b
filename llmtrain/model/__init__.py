"""The GPT model (no parallelism code) and its layout-independent initialization."""

from llmtrain.model.gpt import GPT, GPTArgs
from llmtrain.model.init import init_parameters

__all__ = ["GPT", "GPTArgs", "init_parameters"]
