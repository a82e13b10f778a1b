"""OLMoE's decoder: Qwen3's (model/qwen3/module.py) with the q and k norms spanning all heads of q and of k
(transformers' OlmoeAttention normalizes the projections before splitting them into heads), and every sparse layer
the MoE block. A norm over every head needs all heads on one rank, so the spec refuses tensor parallel."""

from __future__ import annotations

import torch
from torch import nn

from llmtrain.model.llama.module import LlamaArgs
from llmtrain.model.qwen3.module import QKNormAttention, Qwen3, Qwen3Block


class WholeWidthNormAttention(QKNormAttention):
    def norm_width(self, heads: int) -> int:
        return heads * self.head_dim

    def normed_heads(self, norm: nn.RMSNorm, y: torch.Tensor) -> torch.Tensor:
        return norm(y).view(*y.shape[:2], -1, self.head_dim)


class OlmoeBlock(Qwen3Block):
    attention = WholeWidthNormAttention


class Olmoe(Qwen3):
    block = OlmoeBlock


def build(model_cfg) -> Olmoe:
    """The family's module factory (model/olmoe/__init__.py's SPEC.module)."""
    return Olmoe(LlamaArgs.from_config(model_cfg))
