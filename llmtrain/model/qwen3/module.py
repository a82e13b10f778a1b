"""Qwen3's decoder: Llama's block (model/llama/module.py) with an RMSNorm over each head of q and of k before the
rotation, an explicit head width, and on the sparse layers of a mixture-of-experts model (model.moe) the MoE block
in place of the MLP (Llama's block already builds it per layer).

The norms are `attn.q_norm` and `attn.k_norm`, each as wide as one head (transformers' Qwen3Attention): one weight
shared by every head, so tensor parallel keeps them whole and each rank normalizes its own heads.
"""

from __future__ import annotations

import torch
from torch import nn

from llmtrain.model.decoder import Decoder
from llmtrain.model.llama.module import Attention, Block, Embedding, Llama, LlamaArgs


class QKNormAttention(Attention):
    """Llama's attention with q and k normalized by RMSNorm before the rotation, per head."""

    def __init__(self, args: LlamaArgs):
        super().__init__(args)
        self.q_norm = nn.RMSNorm(self.norm_width(args.n_heads), eps=args.norm_eps)
        self.k_norm = nn.RMSNorm(self.norm_width(args.kv_heads), eps=args.norm_eps)

    def norm_width(self, heads: int) -> int:
        """The width one norm weight spans (here a head; OLMoE spans all of q's or k's heads)."""
        return self.head_dim

    def normed_heads(self, norm: nn.RMSNorm, y: torch.Tensor) -> torch.Tensor:
        """(b, t, heads x head_dim) -> normalized (b, t, heads, head_dim)."""
        return norm(y.view(*y.shape[:2], -1, self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallel each rank holds n_heads / tp query and n_kv_heads / tp key/value heads.
        q = self.normed_heads(self.q_norm, self.q(x)).transpose(1, 2)
        k = self.normed_heads(self.k_norm, self.k(x)).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k)
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Qwen3Block(Block):
    attention = QKNormAttention

    def __init__(self, args: LlamaArgs, layer: int = 0):
        super().__init__(args, layer)
        self.attn = self.attention(args)  # in Llama's place, same position among the block's modules


class Qwen3(Llama):
    block = Qwen3Block

    def __init__(self, args: LlamaArgs):
        Decoder.__init__(self, args, Embedding(args), self.block, nn.RMSNorm(args.d_model, eps=args.norm_eps))


def build(model_cfg) -> Qwen3:
    """The family's module factory (model/qwen3/__init__.py's SPEC.module)."""
    return Qwen3(LlamaArgs.from_config(model_cfg))
